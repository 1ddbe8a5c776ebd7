"""hvd.elastic under `raylight run`: a rank's process dies, raylight restarts the group, the
scripts resume from the last commit (the run's checkpoint) and end with the parameters of a
run that never failed; no process outlives the run. Skips where `raylight run` is absent."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

launch_driver = pytest.importorskip("raylight.launch.driver")

from tests.conftest import REPO  # noqa: E402
from tests.helpers import assert_no_strays  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SCRIPT = os.path.join(REPO, "tests", "support", "horovod_run_script.py")


def _reference() -> dict[str, torch.Tensor]:
    """One process, the same steps: every rank's batch is the same, so the average is it."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10):
        opt.zero_grad()
        ((model(torch.full((8, 4), 0.1 * step)) - 1.0) ** 2).mean().backward()
        opt.step()
    return model.state_dict()


@pytest.mark.extended  # 2.5 min; the elastic state's commit and restore run in make test without a group restart (tests/horovod)
def test_elastic_state_survives_a_group_restart(ray_cluster, tmp_path, capsys):
    out = tmp_path / "params.pt"
    code = launch_driver.launch(
        "raylight.horovod", [SCRIPT, str(out)], module=True, num_workers=2, max_failures=1,
        storage_path=str(tmp_path / "runs"),
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "[rank 0] rank 0 attempt 0 starts at step 0" in printed
    assert "[rank 0] rank 0 attempt 1 starts at step 4" in printed  # the commit at step 4, from the run
    got = torch.load(out, weights_only=True)
    for key, value in _reference().items():
        assert torch.allclose(got[key], value, atol=1e-6), key
    assert_no_strays(str(out))
