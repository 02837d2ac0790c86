"""The smallest useful distributed job: join, one all_reduce, leave.

The launch benchmark runs this same file under bare torchrun and under
``dmlctl launch``, so the difference in wall time is the launcher's cost.
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
assert int(value.item()) == dist.get_world_size()
dist.destroy_process_group()
