import pytest
from pydantic import ValidationError

import raylight
from raylight.config import (
    AdaptiveConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainerConfig,
    validate,
)
from raylight.exceptions import ConfigError


def test_unknown_key_names_full_path():
    with pytest.raises(ConfigError) as err:
        validate(TrainerConfig, {"scaling": {"num_worker": 2}})
    assert "scaling.num_worker: unknown key" in str(err.value)


def test_wrong_type_and_range_name_key_and_value():
    with pytest.raises(ConfigError) as err:
        validate(TrainerConfig, {"scaling": {"num_workers": -1}, "failure": {"hang_timeout_s": "x"}})
    text = str(err.value)
    assert "scaling.num_workers: must be between 0 (0 runs in this process) and 100000, got -1\n" in text
    assert "failure.hang_timeout_s" in text and "'x'" in text


def test_placement_lists_allowed_values():
    with pytest.raises(ConfigError) as err:
        validate(ScalingConfig, {"num_workers": 2, "placement": "pack"})
    assert "placement" in str(err.value) and "'PACK'" in str(err.value) and "'pack'" in str(err.value)


def test_elastic_bounds_are_checked():
    with pytest.raises(ConfigError, match=r"  num_workers: \(min, max\) needs 1 <= min <= max <= 100000, got \(3, 2\)"):
        validate(ScalingConfig, {"num_workers": (3, 2)})
    cfg = ScalingConfig(num_workers=(1, 4))
    assert cfg.elastic and cfg.min_workers == 1 and cfg.max_workers == 4
    assert not ScalingConfig(num_workers=(2, 2)).elastic


def test_adaptive_config_errors():
    with pytest.raises(ConfigError, match=r"adaptive\.lr_rule"):
        validate(TrainerConfig, {"adaptive": {"lr_rule": "cubic"}})
    with pytest.raises(ConfigError, match=r"adaptive.local_batch_bounds: needs 1 <= min <= max"):
        validate(TrainerConfig, {"adaptive": {"local_batch_bounds": (64, 8)}})


def test_gpu_resources_need_use_gpu():
    with pytest.raises(ConfigError, match="use_gpu"):
        validate(ScalingConfig, {"num_workers": 1, "resources_per_worker": {"GPU": 1}})


def test_resume_needs_a_name():
    with pytest.raises(ConfigError, match="resume=True needs the name"):
        validate(RunConfig, {"resume": True})


def test_defaults_resolved():
    cfg = ScalingConfig(num_workers=2)
    assert cfg.worker_resources() == {"CPU": 1.0}
    assert cfg.worker_threads() == 1
    gpu = ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"CPU": 4})
    assert gpu.worker_resources() == {"CPU": 4.0, "GPU": 1.0}
    assert gpu.worker_threads() == 4
    assert FailureConfig().max_failures == 0


def test_fit_rejects_bad_arguments_before_starting_anything(tmp_path):
    with pytest.raises(ConfigError, match="num_workers"):
        raylight.fit(lambda ctx: None, num_workers=-2, storage_path=str(tmp_path))
    with pytest.raises(ConfigError, match="max_failures"):
        raylight.fit(lambda ctx: None, num_workers=0, max_failures=-5, storage_path=str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_configs_are_frozen():
    cfg = ScalingConfig(num_workers=2)
    with pytest.raises(ValidationError, match="frozen"):
        cfg.num_workers = 3  # type: ignore[misc]


def test_every_field_is_documented():
    for model in (ScalingConfig, RunConfig, FailureConfig, TrainerConfig, AdaptiveConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
