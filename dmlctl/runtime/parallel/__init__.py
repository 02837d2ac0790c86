"""Model parallelism on the ranks: the job's ``parallelism:`` block made real with
PyTorch's own APIs — a ``DeviceMesh`` (:mod:`.devmesh`), tensor parallelism with
``parallelize_module`` (:mod:`.tensor`), pipeline stages with
``torch.distributed.pipelining`` (:mod:`.pipeline`), sharded data parallelism with
FSDP2's ``fully_shard`` (:mod:`.fsdp`), all applied by :func:`.apply.parallelize`;
and AlexNet's split of grouped convolutions over the tensor-parallel ranks
(:mod:`.convs`), for a job's own ``parallelize`` function.
The layout itself is :mod:`dmlctl.mesh` (torch-free, shared with the control plane).
"""
