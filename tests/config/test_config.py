import pytest
from pydantic import ValidationError

import raylight
from raylight.base.exceptions import ConfigError
from raylight.config import (
    AdaptiveConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainerConfig,
    validate,
)


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


def test_workers_of_one_run_do_not_share_a_gpu():
    with pytest.raises(ConfigError, match=r"resources_per_worker GPU: 0.5 lets workers of this run share a GPU.*Duplicate GPU detected.*GPU: 1"):
        validate(ScalingConfig, {"num_workers": 2, "use_gpu": True, "resources_per_worker": {"GPU": 0.5}})
    with pytest.raises(ConfigError, match="share a GPU"):  # an elastic run may grow to two
        validate(ScalingConfig, {"num_workers": (1, 2), "use_gpu": True, "resources_per_worker": {"GPU": 0.25}})
    # one worker (a Tune trial's run) may share its GPU with other runs; whole GPUs are whole
    assert ScalingConfig(num_workers=1, use_gpu=True, resources_per_worker={"GPU": 0.5}).worker_resources()["GPU"] == 0.5
    assert ScalingConfig(num_workers=4, use_gpu=True, resources_per_worker={"GPU": 2}).worker_resources()["GPU"] == 2


def test_each_gpu_worker_trains_on_the_first_gpu_ray_gave_it_among_its_node_s():
    from raylight.worker_group.gpus import cuda_index, node_visible_devices

    nodes = [
        {"node_id": "a", "gpu_ids": ["0", "1"]},  # two GPUs per worker
        {"node_id": "a", "gpu_ids": ["2", "3"]},
        {"node_id": "b", "gpu_ids": ["5", "4"]},
        {"node_id": "b", "gpu_ids": ["4", "7"]},  # Ray's ids are ordered per worker, not per node
    ]
    visible = node_visible_devices(nodes)
    assert visible == ["0,1,2,3", "0,1,2,3", "5,4,7", "5,4,7"]
    # local_rank would put the second worker on GPU 1, the first worker's second one
    assert [cuda_index(v, n["gpu_ids"]) for v, n in zip(visible, nodes, strict=True)] == [0, 2, 0, 1]
    # a survivor of an in-place resize keeps the list its CUDA started with
    assert cuda_index("0,1,2,3", ["2", "3"]) == 2
    assert cuda_index(None, ["3"]) == 0 and cuda_index("", ["3"]) == 0  # Ray's own setting: its GPUs alone
    with pytest.raises(RuntimeError, match=r"GPU 6 is not among the GPUs CUDA started with \(CUDA_VISIBLE_DEVICES=0,1\)"):
        cuda_index("0,1", ["6"])


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
