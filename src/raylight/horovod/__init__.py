"""Horovod's PyTorch API on ``torch.distributed``, with no Horovod install:
``import raylight.horovod as hvd``.

``hvd.init()`` joins the process group raylight or a launcher made (``raylight run``,
``raylight.fit``, the Lightning strategies, torchrun, ``horovodrun``, ``mpirun``), and the
collectives, ``DistributedOptimizer`` and ``hvd.elastic`` behave as Horovod's on it. See
docs/horovod.md for each function's ``torch.distributed`` meaning and the differences
(no Adasum, ops matched by order, not name). ``install_import_hook()``
makes ``import horovod.torch`` give this module where Horovod is absent.
"""

from raylight.horovod import elastic
from raylight.worker.hvd.basics import (
    Adasum,
    Average,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
)
from raylight.worker.hvd.compat import install_import_hook, uninstall_import_hook
from raylight.worker.hvd.exchange import (
    alltoall,
    alltoall_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
)
from raylight.worker.hvd.ops import (
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    join,
    poll,
    synchronize,
)
from raylight.worker.hvd.optimizer import (
    Compression,
    DistributedOptimizer,
    broadcast_optimizer_state,
    broadcast_parameters,
)

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "HorovodInternalError", "HostsUpdatedInterrupt",
    "Max", "Min", "ProcessSet", "Product", "Sum", "add_process_set", "allgather", "allgather_async",
    "allgather_object", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall",
    "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "ccl_built", "cross_rank",
    "cross_size", "cuda_built", "ddl_built", "elastic", "global_process_set", "gloo_built", "gloo_enabled",
    "grouped_allgather", "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async",
    "init", "install_import_hook", "is_homogeneous", "is_initialized",
    "join", "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "poll",
    "rank", "reducescatter", "reducescatter_async", "remove_process_set", "rocm_built", "shutdown", "size", "synchronize",
    "uninstall_import_hook",
]
