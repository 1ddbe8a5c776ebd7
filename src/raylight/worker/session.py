"""The one sequence every training process runs, on Ray or not.

Choose the device, form the process group, build the strategy and the ``TrainContext``,
run the loop, close the strategy, tear the group down. Three executors call it, each in a
few lines of its own:

- the Ray actor (``worker_group/worker.py``): raylight forms the group from a TCP store
  the driver placed, and hears errors before the group is torn down (tearing down a group
  a dead peer broke may take long);
- processes an external launcher started (``torchrun``, ``horovodrun``, ``deepspeed``;
  ``driver/local.py``): the launcher's group, formed here unless the script already did;
  rank 0 records the run, and says where it resumes from once the group is formed;
- the driver's own process (``num_workers=0``): no group.

A fix to the order (a GPU index, a teardown, a backend string) goes here, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

@dataclass(frozen=True)
class RankInfo:
    """Where a training process sits in its group."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int


SOLO = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0)


def choose_device(use_gpu: bool, index: int | None = None) -> torch.device:
    """This process's device: the CPU, or CUDA device ``index`` (made current), or
    CUDA's current device when ``index`` is None."""
    import torch

    if not use_gpu:
        return torch.device("cpu")
    if index is None:
        return torch.device("cuda")
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def tear_down_group() -> None:
    """Destroy this process's group (DeepSpeed's groups too, when the loop ran DeepSpeed:
    raylight's strategy or Lightning's). A group a dead peer broke may refuse: ignored."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    from raylight.worker.process_group import destroy_process_group
    from raylight.worker.strategies.deepspeed import holds_process_groups, release_process_group

    try:
        if holds_process_groups():
            release_process_group()
        else:
            destroy_process_group()
    except Exception:
        pass


def run(
    fn: Any,
    config: dict[str, Any] | None,
    *,
    place: RankInfo,
    device: torch.device,
    sink: Any,
    strategy: Any,
    form_group: Callable[[Any], None] | None = None,
    start: Callable[[], dict[str, Any]] | None = None,
    finish: Callable[[], None] | None = None,
    on_error: Callable[[BaseException, bool], None] | None = None,
    entry: Callable[..., str] | None = None,
    **context: Any,
) -> str | None:
    """Run ``fn`` in this process: the sequence above. Returns the entry's outcome
    ("finished", or "paused" by an elastic resize).

    - ``strategy``: ``ScalingConfig.strategy`` (a name or its options), built here.
    - ``form_group(strategy)`` forms the process group; this process then owns it and tears
      it down at the end. None: no group, or one the caller formed and keeps.
    - ``start()``, once the group is formed: more ``TrainContext`` arguments (where the run
      resumes from, where shards go), e.g. heard from rank 0.
    - ``finish()``, after the loop and before the teardown (the group still works).
    - ``on_error(exc, joining)``: hears an error before the group is torn down (``joining``:
      it came while the group was forming); ``run`` then returns None. Without it, the
      error propagates after the teardown.
    - ``entry``: what builds the context and runs the loop (``context.run_worker_loop``,
      the default); ``context``: the rest of the ``TrainContext`` arguments.
    """
    from raylight.worker.context import run_worker_loop
    from raylight.worker.strategies import build_strategy

    owned = joining = False
    try:
        built = build_strategy(strategy)
        if form_group is not None:
            joining = True
            form_group(built)
            owned, joining = True, False
        if start is not None:
            context.update(start())
        ended = (entry or run_worker_loop)(
            fn,
            config,
            rank=place.rank,
            local_rank=place.local_rank,
            world_size=place.world_size,
            local_world_size=place.local_world_size,
            node_rank=place.node_rank,
            device=device,
            sink=sink,
            strategy=built,
            **context,
        )
        if finish is not None:
            finish()
        return ended
    except BaseException as exc:
        if on_error is None:
            raise
        on_error(exc, joining)
        return None
    finally:
        if owned:  # the loop's modules (DDP holds the group) went with the entry's context
            tear_down_group()
