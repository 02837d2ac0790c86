"""A tiny Hugging Face Trainer run, as a user writes one: a GPT-2 built from a config
(no download), random tokens, dmlctl's callback beside the Trainer's own logging."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from dmlctl.integrations.transformers import DmlctlCallback

torch.manual_seed(0)
config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
model = GPT2LMHeadModel(config)
tokens = torch.randint(0, 64, (64, 16))
data = [{"input_ids": t, "labels": t} for t in tokens]
args = TrainingArguments(
    output_dir="out",
    max_steps=8,
    logging_steps=2,
    per_device_train_batch_size=4,
    learning_rate=1e-3,
    report_to=[],
    save_strategy="no",
    use_cpu=True,
    disable_tqdm=True,
)
Trainer(model=model, args=args, train_dataset=data, callbacks=[DmlctlCallback()]).train()
