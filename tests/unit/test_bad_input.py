"""Bad and odd inputs whose check is pure driver logic (no Ray), beside the catalogue
(tests/adversarial.py) that runs whole commands."""

from __future__ import annotations

import logging

import pytest

from raylight.declarative import api
from raylight.declarative.loading import load_config
from tests.adversarial import Workspace

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


@pytest.mark.parametrize("batch,expected", [(1000, 42), (42, 42), (16, 16)])
def test_a_batch_larger_than_the_training_split_is_clamped_and_said(tmp_path, caplog, batch, expected):
    ws = Workspace(str(tmp_path / "ws"))
    ws.edit("batch_size: 16", f"batch_size: {batch}")
    config = load_config(ws.cfg)
    prepared = api.prepare(config, ws.data, use_cache=False)
    assert len(next(iter(prepared.train.values()))) == 42  # 70% of 60 rows
    with caplog.at_level(logging.WARNING, logger="raylight"):
        loop_config, _ = api.loop_settings(config, prepared, on_ray=False)
    assert loop_config["batch_size"] == expected
    said = [r.getMessage() for r in caplog.records if "trainer.batch_size" in r.getMessage()]
    if batch > 42:
        assert said == [
            f"trainer.batch_size {batch} is larger than the 42 rows of the training split; training with "
            "batch_size 42 (the whole split each step). Set trainer.batch_size to at most 42 to choose it yourself"
        ]
    else:
        assert said == []
