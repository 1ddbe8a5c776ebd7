"""A Horovod elastic script for `raylight run` (tests/horovod/test_horovod_run.py): rank 1's
process dies at step 5 of the first attempt, after the commit at step 4.

    raylight run -n 2 --max-failures 1 -m raylight.horovod tests/support/horovod_run_script.py OUT
"""

import os
import sys

import horovod.torch as hvd
import torch
from torch import nn

STEPS = 10


def batch(step: int) -> torch.Tensor:
    return torch.full((8, 4), 0.1 * step)


def main(out: str) -> None:
    hvd.init()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        print(f"rank {hvd.rank()} attempt {attempt} starts at step {state.step}", flush=True)
        while state.step < STEPS:
            opt.zero_grad()
            ((model(batch(state.step)) - 1.0) ** 2).mean().backward()
            opt.step()
            state.step += 1
            if state.step % 2 == 0:
                state.commit()
            if attempt == 0 and state.step == 5 and hvd.rank() == 1:
                os._exit(3)  # a lost process: raylight restarts the group

    train(state)
    if hvd.rank() == 0:
        torch.save(model.state_dict(), out)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
