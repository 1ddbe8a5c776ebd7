"""Run on a host by tests/hosts/test_cluster_over_hosts.py: 2 workers that hold still in their
first epoch (each writes ``<dir>/held-<rank>``, then waits for ``<dir>/go``) while the test lists
what every host has listening."""

import os
import sys
import time

import raylight


def held_loop(ctx, config):
    import torch

    model = ctx.prepare_model(torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in ctx.epochs(1):
        opt.zero_grad()
        model(torch.ones(4, 2)).sum().backward()
        opt.step()
        with open(os.path.join(config["dir"], f"held-{ctx.rank}"), "w") as f:
            f.write(str(os.getpid()))
        while not os.path.exists(
            os.path.join(config["dir"], "go")
        ):  # the test's signal, not a timer
            time.sleep(0.05)
    ctx.report({"world_size": ctx.world_size})


if __name__ == "__main__":
    result = raylight.fit(
        held_loop,
        config={"dir": sys.argv[1]},
        num_workers=2,
        storage_path=f"{sys.argv[1]}/runs",
        name="held",
        progress=False,
    )
    print(result.metrics)
