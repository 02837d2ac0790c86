"""A tiny Lightning run, as a user writes one: a LightningModule that logs its loss,
Lightning's DDP on CPU, dmlctl's logger."""

import os

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dmlctl.integrations.lightning import DmlctlLogger


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


torch.manual_seed(0)
x = torch.randn(256, 8)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
trainer = L.Trainer(
    accelerator="cpu",
    devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),  # torchrun's processes here
    strategy="ddp",
    max_epochs=2,
    log_every_n_steps=2,
    logger=DmlctlLogger(),
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Regression(), data)
