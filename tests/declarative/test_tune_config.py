"""The hyperopt section, its translation to Ray Tune, and the trial-sizing arithmetic
(no Ray cluster)."""

from __future__ import annotations

import os

import pytest

from raylight.base.exceptions import ConfigError, InsufficientResourcesError
from raylight.config.validation import validate
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.config.parameters import set_path
from raylight.tune.resources import check_bundles_fit, plan_concurrency, total, trial_bundles
from raylight.worker_group.placement import worker_bundles

BASE = {
    "input_features": [{"name": "x", "type": "number"}, {"name": "c", "type": "category"}],
    "output_features": [{"name": "y", "type": "binary"}],
    "combiner": {"fc_layers": [{"output_size": 16}]},
    "backend": {"trainer": {"num_workers": 2}},
}
LR = {"space": "loguniform", "lower": 1e-4, "upper": 1e-1}


def config(hyperopt, **over):
    return validate(ModelConfig, {**BASE, **over, "hyperopt": hyperopt})


def error(hyperopt, **over) -> str:
    with pytest.raises(ConfigError) as info:
        config(hyperopt, **over)
    return str(info.value)


def test_valid_section_and_metric_name():
    h = config({"parameters": {"trainer.learning_rate": LR}, "goal": "maximize", "metric": "accuracy"}).hyperopt
    assert h is not None and h.metric_name == "validation_accuracy"
    assert h.executor.max_concurrent_trials == "auto" and h.executor.scheduler.type == "fifo"
    assert config({"parameters": {"trainer.learning_rate": LR}, "split": "training"}).hyperopt.metric_name == "train_loss"
    # Ludwig's name of the metric
    assert config({"parameters": {"trainer.learning_rate": LR}, "metric": "accuracy_micro"}).hyperopt.metric_name == "validation_accuracy"


@pytest.mark.parametrize(
    ("hyperopt", "expected"),
    [
        ({"parameters": {"trainer.learnig_rate": LR}}, "parameters.trainer.learnig_rate: trainer.learnig_rate is not a key of the config; keys there: ['adaptive', 'batch_size'"),
        ({"parameters": {"combiner.fc_layers.3.output_size": {"space": "choice", "categories": [8]}}}, "combiner.fc_layers.3 is not an index of a list of 1"),
        ({"parameters": {"trainer.epochs": {"space": "choice", "categories": [0, 3]}}}, "the value 0 of its choice space is not valid there (trainer.epochs: Input should be greater than or equal to 1)"),
        ({"parameters": {"trainer.learning_rate": {"space": "logunif", "lower": 1, "upper": 2}}}, "hyperopt.parameters.trainer.learning_rate: Input tag 'logunif' found using 'space' does not match any of the expected tags: 'choice', 'grid', 'uniform', 'loguniform', 'randint'"),
        ({"parameters": {"trainer.learning_rate": {"space": "loguniform", "lower": 0, "upper": 2}}}, "hyperopt.parameters.trainer.learning_rate.lower: Input should be greater than 0"),
        ({"parameters": {"trainer.learning_rate": {"space": "uniform", "lower": 2, "upper": 1}}}, "needs lower < upper, got lower=2, upper=1"),
        ({"parameters": {"trainer.learning_rate": LR}, "metric": "r2"}, "metric 'r2' is not measured on the validation split of a binary output; allowed: ['loss', 'accuracy', 'roc_auc', 'precision', 'recall', 'specificity']"),
        ({"parameters": {"trainer.learning_rate": LR}, "split": "training", "metric": "accuracy"}, "allowed: ['loss']"),
        ({"parameters": {"trainer.learning_rate": LR}, "goal": "lower"}, "hyperopt.goal: Input should be 'minimize' or 'maximize'"),
        ({"parameters": {"trainer.learning_rate": LR}, "search_alg": {"type": "bayes"}}, "hyperopt.search_alg.type: Input should be 'random', 'grid' or 'optuna'"),
        ({"parameters": {"trainer.learning_rate": LR}, "search_alg": {"type": "grid"}}, "search_alg grid needs grid or choice spaces; ['trainer.learning_rate']"),
        ({"parameters": {"trainer.learning_rate": LR}, "executor": {"max_concurrent_trials": 0}}, "max_concurrent_trials must be >= 1 or 'auto', got 0"),
        ({"parameters": {"trainer.learning_rate": LR}, "executor": {"num_samples": 0}}, "hyperopt.executor.num_samples: Input should be greater than or equal to 1"),
        ({"parameters": {"trainer.learning_rate": LR}, "executor": {"scheduler": {"type": "hyperband"}}}, "hyperopt.executor.scheduler: Input tag 'hyperband' found using 'type' does not match any of the expected tags: 'fifo', 'async_hyperband', 'asha', 'median_stopping', 'pbt'"),
        ({"parameters": {"trainer.learning_rate": LR}, "executor": {"scheduler": {"type": "asha", "max_tt": 3}}}, "hyperopt.executor.scheduler.max_tt: unknown key"),
        ({"parameters": {"trainer.learning_rate": LR}, "executor": {"scheduler": {"type": "asha", "max_t": 2, "grace_period": 3}}}, "grace_period (3) must not exceed max_t (2)"),
        ({"parameters": {"trainer.learning_rate": LR}, "executor": {"gpus": 1}}, "hyperopt.executor.gpus: unknown key"),
        ({"parameters": {}}, "hyperopt.parameters: Dictionary should have at least 1 item"),
        ({"parameters": {"trainer.learning_rate_scheduler.decay": {"space": "choice", "categories": ["linear"]}}},
         "trainer.learning_rate_scheduler is not set (null): write the section into the config to search its keys (learning_rate_scheduler: {} takes its defaults)"),
        ({"parameters": {"hyperopt.goal": {"space": "choice", "categories": ["maximize"]}}}, "the hyperopt section itself cannot be searched"),
    ],
)
def test_bad_sections_name_the_key(hyperopt, expected):
    assert expected in error(hyperopt)


def test_validation_split_needs_rows_and_trials_need_fixed_size():
    lr = {"parameters": {"trainer.learning_rate": LR}}
    assert "preprocessing.split.probabilities gives it 0" in error(lr, preprocessing={"split": {"probabilities": [0.8, 0.0, 0.2]}})
    assert "set backend.trainer.num_workers, not min_workers/max_workers" in error(lr, backend={"trainer": {"min_workers": 1, "max_workers": 2}})


def test_set_path():
    data = {"a": {"b": [{"c": 1}]}}
    assert set_path(data, "a.b.0.c", 5) == {"a": {"b": [{"c": 5}]}}
    assert data == {"a": {"b": [{"c": 1}]}}  # a copy
    with pytest.raises(KeyError, match=r"a\.x is not a key"):
        set_path(data, "a.x", 1)
    with pytest.raises(KeyError, match=r"a\.b\.c is not an index"):
        set_path(data, "a.b.c", 1)


def test_search_space_translation():
    pytest.importorskip("ray.tune")
    from ray.tune.search.sample import Categorical, Float, Integer

    from raylight.declarative import search

    h = config(
        {
            "parameters": {
                "trainer.learning_rate": LR,
                "trainer.optimizer.type": {"space": "choice", "categories": ["adam", "sgd"]},
                "combiner.dropout": {"space": "uniform", "lower": 0.0, "upper": 0.5},
                "trainer.batch_size": {"space": "randint", "lower": 16, "upper": 65},
                "combiner.fc_layers.0.output_size": {"space": "grid", "values": [8, 16, 32]},
            },
            "executor": {"num_samples": 2},
        }
    ).hyperopt
    space = search.param_space(h)
    lr = space["trainer.learning_rate"]
    assert isinstance(lr, Float) and (lr.lower, lr.upper) == (1e-4, 1e-1) and type(lr.sampler).__name__ == "_LogUniform"
    assert isinstance(space["trainer.optimizer.type"], Categorical) and space["trainer.optimizer.type"].categories == ["adam", "sgd"]
    assert isinstance(space["combiner.dropout"], Float) and type(space["combiner.dropout"].sampler).__name__ == "_Uniform"
    assert isinstance(space["trainer.batch_size"], Integer) and (space["trainer.batch_size"].lower, space["trainer.batch_size"].upper) == (16, 65)
    assert space["combiner.fc_layers.0.output_size"] == {"grid_search": [8, 16, 32]}
    assert search.num_trials(h) == 6  # 2 samples x a grid of 3
    assert search.mode(h) == "min" and type(search.search_algorithm(h)).__name__ == "BasicVariantGenerator"


def test_grid_search_alg_crosses_choices():
    pytest.importorskip("ray.tune")
    from raylight.declarative import search

    h = config(
        {
            "parameters": {
                "trainer.optimizer.type": {"space": "choice", "categories": ["adam", "sgd"]},
                "combiner.fc_layers.0.output_size": {"space": "grid", "values": [8, 16, 32]},
            },
            "search_alg": {"type": "grid"},
            "executor": {"num_samples": 1},
        }
    ).hyperopt
    assert search.search_space_for(h)["trainer.optimizer.type"] == {"grid_search": ["adam", "sgd"]}
    assert search.num_trials(h) == 6


@pytest.mark.parametrize(
    ("scheduler", "cls"),
    [
        ({"type": "fifo"}, "FIFOScheduler"),
        ({"type": "asha", "max_t": 4}, "AsyncHyperBandScheduler"),
        ({"type": "async_hyperband"}, "AsyncHyperBandScheduler"),
        ({"type": "median_stopping", "grace_period": 2}, "MedianStoppingRule"),
        ({"type": "pbt", "perturbation_interval": 3}, "PopulationBasedTraining"),
    ],
)
def test_schedulers(scheduler, cls):
    pytest.importorskip("ray.tune")
    from raylight.declarative import search

    h = config({"parameters": {"trainer.learning_rate": LR}, "executor": {"scheduler": scheduler}}).hyperopt
    assert type(search.scheduler(h)).__name__ == cls


def test_optuna_searcher_or_a_clear_error():
    pytest.importorskip("ray.tune")
    from raylight.declarative import search

    h = config({"parameters": {"trainer.learning_rate": LR}, "search_alg": {"type": "optuna", "seed": 1}}).hyperopt
    try:
        import optuna  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="optuna needs the optuna package"):
            search.search_algorithm(h)
    else:
        assert type(search.search_algorithm(h)).__name__ == "OptunaSearch"


# -- sizing ----------------------------------------------------------------------------
TWO_CPUS = {"CPU": 2.0, "memory": 1e9}


def test_trial_bundles_head_needs_no_cpu():
    assert trial_bundles(num_workers=2) == [{}, {"CPU": 1.0}, {"CPU": 1.0}]
    assert trial_bundles(num_workers=1, use_gpu=True, cpus_per_worker=2, head_cpus=1) == [{"CPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}]
    assert total(trial_bundles(num_workers=3)) == {"CPU": 3.0}


@pytest.mark.parametrize(
    ("per_trial", "cluster", "trials", "requested", "reserve", "expected"),
    [
        ({"CPU": 2}, TWO_CPUS, 4, "auto", None, 1),  # 2-worker trials on 2 CPUs: one at a time
        ({"CPU": 1}, TWO_CPUS, 4, "auto", None, 2),
        ({"CPU": 1}, TWO_CPUS, 4, "auto", {"CPU": 1}, 1),  # one CPU kept free for Ray Data
        ({"CPU": 2}, {"CPU": 16}, 3, "auto", None, 3),  # never more than there are trials
        ({"CPU": 2, "GPU": 1}, {"CPU": 16, "GPU": 2}, 8, "auto", None, 2),  # GPUs bind
        ({"CPU": 1}, {"CPU": 16}, 8, 3, None, 3),
        ({"CPU": 1}, {"CPU": 16}, 2, 5, None, 2),
        ({"CPU": 3}, {"CPU": 4}, 4, "auto", {"CPU": 2}, 1),  # at least one
    ],
)
def test_plan_concurrency(per_trial, cluster, trials, requested, reserve, expected):
    plan = plan_concurrency(per_trial=per_trial, cluster=cluster, nodes=[cluster], num_trials=trials, requested=requested, reserve=reserve)
    assert plan.max_concurrent == expected, plan.reason


def test_a_trial_larger_than_the_cluster_fails_with_the_numbers():
    with pytest.raises(InsufficientResourcesError, match=r"one trial needs \{CPU: 3\} but the cluster has \{CPU: 2\} in all.*lower backend.trainer.num_workers"):
        plan_concurrency(per_trial={"CPU": 3}, cluster=TWO_CPUS, nodes=[TWO_CPUS], num_trials=1, requested="auto", setting="backend.trainer.num_workers")
    with pytest.raises(InsufficientResourcesError, match=r"GPU: 1.*GPU: 0"):
        plan_concurrency(per_trial={"CPU": 1, "GPU": 1}, cluster=TWO_CPUS, nodes=[TWO_CPUS], num_trials=1, requested=2)
    with pytest.raises(InsufficientResourcesError, match=r"no node of the cluster can hold one bundle \{CPU: 3\}"):
        check_bundles_fit([{}, {"CPU": 3}], [{"CPU": 2}, {"CPU": 2}], "resources_per_worker")


def test_trial_shape():
    from raylight.declarative.hyperopt import plan, trial_shape

    lr = {"parameters": {"trainer.learning_rate": LR}}
    assert trial_shape(config(lr)).bundles == [{}, {"CPU": 1.0}, {"CPU": 1.0}]
    four = config({**lr, "executor": {"cpu_resources_per_trial": 4}}, backend={"trainer": {}})
    assert trial_shape(four).num_workers == 4
    assert trial_shape(config(lr, backend={"trainer": {}})).num_workers == 1
    with pytest.raises(ConfigError, match=r"cpu_resources_per_trial=3 disagrees with backend\.trainer\.num_workers=2"):
        trial_shape(config({**lr, "executor": {"cpu_resources_per_trial": 3}}))
    shape, concurrency = plan(config(lr), TWO_CPUS, [TWO_CPUS])
    assert shape.num_workers == 2 and concurrency.max_concurrent == 1
    with pytest.raises(InsufficientResourcesError, match=r"\{CPU: 3\}.*\{CPU: 2\}.*backend.trainer.num_workers"):
        plan(config(lr, backend={"trainer": {"num_workers": 3}}), TWO_CPUS, [TWO_CPUS])


def test_trial_config_sets_sampled_values():
    from raylight.declarative.hyperopt import trial_config

    cfg = config({"parameters": {"trainer.learning_rate": LR, "combiner.fc_layers.0.output_size": {"space": "choice", "categories": [8]}}})
    trial = trial_config(cfg.model_dump(mode="json"), {"trainer.learning_rate": 0.01, "combiner.fc_layers.0.output_size": 8})
    assert trial.trainer.learning_rate == 0.01 and trial.combiner.fc_layers[0].output_size == 8 and trial.hyperopt is None


def test_worker_bundles_in_a_trials_placement_group():
    one = {"CPU": 1.0}
    assert worker_bundles([one, one], one, 2) == [0, 1]  # Tune drops an empty head bundle
    assert worker_bundles([one, one, one], one, 2) == [1, 2]  # head bundle first
    assert worker_bundles([{"CPU": 0.5}, one, one], one, 2) == [1, 2]
    assert worker_bundles([one], one, 2) == [0]  # too few: the group says so when it starts


def test_tune_public_surface_snapshot():
    pytest.importorskip("ray.tune")
    import inspect

    import raylight.tune as rt
    from raylight.cli.main import hyperopt

    assert sorted(rt.__all__) == sorted([
        "ConcurrencyPlan", "TuneReportCallback", "TuneReportCheckpointCallback", "check_resources", "connect",
        "from_tune_checkpoint", "get_tune_resources", "plan_concurrency", "to_tune_checkpoint", "trainable",
    ])
    assert list(inspect.signature(rt.trainable).parameters) == [
        "train_loop", "num_workers", "use_gpu", "resources_per_worker", "strategy", "config", "base_config",
    ]
    assert list(inspect.signature(hyperopt).parameters) == ["config", "dataset", "output_directory", "set_", "quiet", "verbose", "resume"]


def _counting_loop(ctx, config):
    start = 0
    if (ckpt := ctx.get_checkpoint()) is not None:
        start = ckpt.load()["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        ctx.report({"epoch": epoch, "start": start}, checkpoint={"epoch": epoch})


def test_trainer_on_report_and_resume_from(tmp_path):
    """The two Trainer hooks the Tune trial uses, in process (no Ray)."""
    import raylight
    from raylight.config import RunConfig, ScalingConfig, TrainerConfig

    def config(name):
        return TrainerConfig(scaling=ScalingConfig(num_workers=0), run=RunConfig(storage_path=str(tmp_path), name=name, progress=False))

    seen = []
    first = raylight.Trainer(
        _counting_loop, train_loop_config={"epochs": 2}, config=config("a"),
        on_report=lambda metrics, ckpt: seen.append((metrics["epoch"], ckpt.load()["epoch"] if ckpt else None)),
    ).fit()
    assert seen == [(0, 0), (1, 1)]
    second = raylight.Trainer(
        _counting_loop, train_loop_config={"epochs": 4}, config=config("b"), resume_from=first.checkpoint,
    ).fit()
    assert [m["epoch"] for m in second.metrics_history] == [2, 3] and second.metrics["start"] == 2


def test_tune_checkpoint_round_trip(tmp_path):
    pytest.importorskip("ray.tune")
    import torch

    from raylight.storage.checkpoint import Checkpoint, serialize_state
    from raylight.tune import from_tune_checkpoint, to_tune_checkpoint

    original = Checkpoint(None, metadata={"index": 3}, data=serialize_state({"w": torch.arange(3.0)}))
    back = from_tune_checkpoint(to_tune_checkpoint(original, str(tmp_path / "ckpt")))
    assert torch.equal(back.load()["w"], torch.arange(3.0)) and back.metadata == {"index": 3}
    (tmp_path / "empty").mkdir()
    from ray.tune import Checkpoint as TuneCheckpoint

    with pytest.raises(ValueError, match="holds no raylight state"):
        from_tune_checkpoint(TuneCheckpoint.from_directory(str(tmp_path / "empty")))


def test_a_sharded_tune_checkpoint_on_remote_storage_is_read_where_tune_keeps_it(tmp_path):
    """PBT's exploit or a resumed trial, with Tune's storage remote: every worker of the
    restored run reads its shards from that storage (a download would be on one node
    only). Tune's storage here: an fsspec filesystem through pyarrow, as RunConfig's
    storage_filesystem takes one."""
    pytest.importorskip("ray.tune")
    import fsspec
    import torch
    import torch.distributed as dist
    from pyarrow.fs import FSSpecHandler, PyFileSystem
    from ray.tune import Checkpoint as TuneCheckpoint

    from raylight.storage import sharded
    from raylight.storage.checkpoint import RAYLIGHT_KEY, SHARDED, serialize_state
    from raylight.storage.run_dir import STATE_FILE
    from raylight.tune import from_tune_checkpoint

    state, tensors = sharded.split({"w": torch.arange(4.0), "epoch": 2})
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sharded.save(tensors, str(tmp_path / "shards"))
    finally:
        dist.destroy_process_group()
    remote = fsspec.filesystem("memory")
    remote.put(str(tmp_path / "shards"), "/bucket/trial/checkpoint_000002", recursive=True)
    remote.pipe(f"/bucket/trial/checkpoint_000002/{STATE_FILE}", serialize_state({**state, RAYLIGHT_KEY: {"format": SHARDED}}))
    restored = from_tune_checkpoint(TuneCheckpoint("/bucket/trial/checkpoint_000002", filesystem=PyFileSystem(FSSpecHandler(remote))))
    try:
        assert restored.path == "memory:///bucket/trial/checkpoint_000002" and restored.sharded
        loaded = restored.load()
        assert torch.equal(loaded["w"], torch.arange(4.0)) and loaded["epoch"] == 2
    finally:
        remote.rm("/bucket", recursive=True)


def test_a_forwarded_checkpoint_is_staged_in_a_directory_removed_once_tune_has_it(monkeypatch, tmp_path):
    """TuneForwarder writes each checkpoint to a temporary directory of its own, hands it to
    ``tune.report``, and removes it after: nothing is left in the temp dir between reports,
    so a trial that Tune kills (PBT, a time budget) leaves nothing behind either. Tune's
    ``report`` needs a live trial; here it is replaced by one that reads what it is given."""
    import tempfile

    from ray import tune

    from raylight.storage.checkpoint import Checkpoint, serialize_state
    from raylight.tune.trial import TuneForwarder, from_tune_checkpoint

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen = []

    def report(metrics, checkpoint=None):
        seen.append((metrics, checkpoint and from_tune_checkpoint(checkpoint).load()["epoch"], checkpoint and checkpoint.path))

    monkeypatch.setattr(tune, "report", report)
    forward = TuneForwarder()
    forward({"loss": 1.0}, None)
    forward({"loss": 0.5, "raylight/workers": 2}, Checkpoint(None, data=serialize_state({"epoch": 3}), metadata={"index": 0}))
    assert [(m, epoch) for m, epoch, _ in seen] == [({"loss": 1.0}, None), ({"loss": 0.5}, 3)]
    assert seen[1][2].startswith(str(tmp_path)), seen
    assert os.listdir(tmp_path) == [], "the staging directory is removed once Tune has copied the checkpoint"


def test_ludwig_s_combiner_layer_keys_are_searchable():
    """Ludwig's hyperopt examples search ``combiner.num_fc_layers`` and
    ``combiner.output_size``: they set how many ``fc_layers`` (copies of the first) and
    every layer's size; a count that is not a whole number from 0 names the key."""
    from raylight.declarative.hyperopt import trial_config

    h = config({"parameters": {
        "combiner.num_fc_layers": {"space": "randint", "lower": 1, "upper": 4},
        "combiner.output_size": {"space": "choice", "categories": [16, 64]},
    }})
    base = h.model_dump(mode="json")
    base["combiner"]["fc_layers"] = [{"output_size": 32, "activation": "tanh"}]
    for sampled in ({"combiner.num_fc_layers": 3, "combiner.output_size": 16}, {"combiner.output_size": 16, "combiner.num_fc_layers": 3}):
        trial = trial_config(base, sampled)
        assert [(fc.output_size, fc.activation) for fc in trial.combiner.fc_layers] == [(16, "tanh")] * 3
    assert trial_config(base, {"combiner.num_fc_layers": 0}).combiner.fc_layers == []
    with pytest.raises(ConfigError, match=r"parameters\.combiner\.num_fc_layers: combiner\.num_fc_layers takes a whole number of layers from 0, got -1"):
        config({"parameters": {"combiner.num_fc_layers": {"space": "choice", "categories": [-1, 2]}}})


def test_ludwig_s_hyperopt_spellings_load():
    """Ludwig's output_feature (combined or the output's name), eval_split (the split),
    search_alg variant_generator (Tune's random/grid generator) with random_state."""
    h = config({"parameters": {"trainer.learning_rate": LR}, "output_feature": "y", "eval_split": "validation",
                "search_alg": {"type": "variant_generator", "random_state": 7}}).hyperopt
    assert h is not None and (h.search_alg.type, h.search_alg.seed) == ("random", 7)
    assert "output_feature 'z' is not an output feature; use 'y' or combined" in error({"parameters": {"trainer.learning_rate": LR}, "output_feature": "z"})
    assert "eval_split (training) differs from split (validation)" in error({"parameters": {"trainer.learning_rate": LR}, "eval_split": "training"})


def test_ludwig_s_feature_named_parameter_keys_set_that_feature():
    """Ludwig's hyperopt names a feature's keys by the feature: ``c.encoder.embedding_size``
    is input_features.1.encoder.embedding_size (an output's name too); a name that is
    neither a section nor a feature lists both."""
    from raylight.declarative.hyperopt import trial_config

    h = config({"parameters": {"c.encoder.embedding_size": {"space": "choice", "categories": [4, 8]},
                               "y.loss_weight": {"space": "choice", "categories": [1.0, 2.0]}}})
    trial = trial_config(h.model_dump(mode="json"), {"c.encoder.embedding_size": 8, "y.loss_weight": 2.0})
    assert trial.input_features[1].encoder.embedding_size == 8 and trial.output_features[0].loss_weight == 2.0
    message = error({"parameters": {"cc.encoder.embedding_size": {"space": "choice", "categories": [4]}}})
    assert "cc is not a key of the config" in message and "or a feature's name (Ludwig's <feature>.<key>): ['c', 'x', 'y']" in message


def test_a_search_over_text_encoder_types_starts_each_from_its_defaults():
    """Searching ``review.encoder.type`` from a configured parallel_cnn: each type is built
    as Ludwig configures it (an rnn reduces by the last token, a stacked_cnn has its own six
    layers), keeping the settings the config changed that the type has (embedding_size for
    all, num_filters for the CNNs). Each parameter is checked against the config as
    written, so one type's own setting is searched where the config's encoder has that type."""
    from raylight.declarative.hyperopt import trial_config

    text_base = {**BASE, "input_features": [{"name": "review", "type": "text", "encoder": {"type": "parallel_cnn", "embedding_size": 16, "num_filters": 8}}]}
    types = ["embed", "parallel_cnn", "stacked_cnn", "stacked_parallel_cnn", "rnn", "cnnrnn", "transformer"]
    h = validate(ModelConfig, {**text_base, "hyperopt": {"parameters": {"review.encoder.type": {"space": "choice", "categories": types}}}})
    base = h.model_dump(mode="json")
    encoders = {kind: trial_config(base, {"review.encoder.type": kind}).input_features[0].encoder for kind in types}
    assert {kind: e.embedding_size for kind, e in encoders.items()} == dict.fromkeys(types, 16)
    rnn, stacked, transformer, cnn = encoders["rnn"], encoders["stacked_cnn"], encoders["transformer"], encoders["parallel_cnn"]
    assert (rnn.reduce_output, rnn.conv_layers, rnn.fc_layers, rnn.num_filters) == ("last", [], [], 256)
    assert (stacked.num_filters, [c.filter_size for c in stacked.conv_layers], stacked.reduce_output) == (8, [7, 7, 3, 3, 3, 3], "sum")
    assert (cnn.num_filters, [c.filter_size for c in cnn.conv_layers]) == (8, [2, 3, 4, 5])  # its own type: as configured
    assert (transformer.hidden_size, transformer.dropout, encoders["embed"].reduce_output) == (256, 0.1, "sum")
    # another type's setting in a trial (num_heads on rnn) is dropped with a note, as Ludwig drops
    # it (issue 56; it was refused before): the search loads
    validate(ModelConfig, {**text_base, "hyperopt": {"parameters": {
        "review.encoder.type": {"space": "choice", "categories": ["rnn", "transformer"]},
        "review.encoder.num_heads": {"space": "choice", "categories": [4]},
    }}})


def test_ludwig_s_feature_level_parameters_set_each_feature_that_leaves_the_key_to_its_defaults():
    """``defaults.<type>.<section>.<key>`` (Ludwig's hyperopt docs, "Default Feature-Level
    Parameters"): the key on every feature of that type (inputs: preprocessing, encoder;
    outputs: decoder, loss) but one that sets it itself, in the config or by its own
    parameter (which wins whatever the order), or that names another encoder type than the
    defaults'."""
    from raylight.declarative.hyperopt import trial_config

    features = {
        "input_features": [
            {"name": "a", "type": "category"},  # takes the defaults section's 4, then the searched value
            {"name": "b", "type": "category", "encoder": {"embedding_size": 3}},  # its own setting
            {"name": "c", "type": "category"},  # its own parameter, listed after the feature-level one
            {"name": "t", "type": "text", "encoder": {"type": "rnn"}},  # another encoder than the defaults' parallel_cnn
            {"name": "u", "type": "text"},
        ],
        "output_features": [{"name": "y", "type": "binary"}, {"name": "z", "type": "binary", "loss": {"weight": 3.0}}],
        "defaults": {"category": {"encoder": {"embedding_size": 4}}, "text": {"encoder": {"type": "parallel_cnn"}}},
    }
    parameters = {
        "defaults.category.encoder.embedding_size": {"space": "choice", "categories": [8, 16]},
        "c.encoder.embedding_size": {"space": "choice", "categories": [5]},
        "defaults.text.encoder.num_filters": {"space": "choice", "categories": [32]},
        "defaults.binary.loss.weight": {"space": "choice", "categories": [2.0]},
    }
    h = config({"parameters": parameters}, **features)
    assert [f.encoder.embedding_size for f in h.input_features[:3]] == [4, 3, 4]
    sampled = {"defaults.category.encoder.embedding_size": 16, "c.encoder.embedding_size": 5,
               "defaults.text.encoder.num_filters": 32, "defaults.binary.loss.weight": 2.0}
    trial = trial_config(h.model_dump(mode="json"), dict(reversed(sampled.items())), h._own)
    assert [f.encoder.embedding_size for f in trial.input_features[:3]] == [16, 3, 5]
    rnn, cnn = (f.encoder for f in trial.input_features[3:])
    assert (rnn.type, rnn.num_filters, cnn.type, cnn.num_filters) == ("rnn", 256, "parallel_cnn", 32)
    assert [f.loss_weight for f in trial.output_features] == [2.0, 3.0]


def test_a_feature_level_parameter_that_reaches_no_feature_is_an_error_that_says_why():
    def message(key: str, **over) -> str:
        return error({"parameters": {key: {"space": "choice", "categories": [8]}}}, **over)

    assert "no input feature has type 'text' (their types: ['category', 'number'])" in message("defaults.text.encoder.embedding_size")
    assert "the section one of preprocessing, encoder, decoder, loss" in message("defaults.category.embedding_size")
    own = {"input_features": [{"name": "c", "type": "category", "encoder": {"embedding_size": 3}}]}
    said = message("defaults.category.encoder.embedding_size", **own)
    assert "every category input feature sets encoder.embedding_size itself" in said and "search <feature name>.encoder.embedding_size" in said
    assert "parameters.defaults.category.encoder.vocab_size" in message("defaults.category.encoder.vocab_size")  # not an encoder setting


def test_preprocessing_parameters_take_finite_spaces_and_each_preprocessing_is_made_once(tmp_path):
    """A parameter that changes preprocessing (a feature's section, a feature type's, the
    dataset's) is searched over a choice or grid: the dataset is preprocessed once for each
    combination of their values before the trials, and a trial
    takes the one its config gives. Continuous spaces, PBT's mutations and more than
    MAX_PREPROCESSINGS ways are errors that say so."""
    from raylight.declarative import api
    from raylight.declarative.hyperopt import (
        preprocessing_key,
        preprocessing_variants,
        trial_config,
    )
    from tests.declarative_data import frame, write

    parameters = {
        "x.preprocessing.normalization": {"space": "choice", "categories": ["zscore", "minmax"]},
        "defaults.category.preprocessing.most_common": {"space": "grid", "values": [2, 3]},
        "trainer.learning_rate": LR,
    }
    h = config({"parameters": parameters}, trainer={"epochs": 1})
    variants = preprocessing_variants(h)
    assert len(variants) == 4  # 2 x 2 (the config's own, most_common 10000, no trial has)
    assert preprocessing_variants(config({"parameters": {"trainer.learning_rate": LR}})) == [config({"parameters": {"trainer.learning_rate": LR}})]
    assert {(v.input_features[0].preprocessing.normalization, v.input_features[1].preprocessing.most_common) for v in variants} == {
        ("zscore", 2), ("zscore", 3), ("minmax", 2), ("minmax", 3),
    }
    trial = trial_config(h.model_dump(mode="json"), {"trainer.learning_rate": 0.01, "x.preprocessing.normalization": "minmax",
                                                      "defaults.category.preprocessing.most_common": 3}, h._own)
    assert preprocessing_key(trial) in {preprocessing_key(v) for v in variants} and trial.trainer.learning_rate == 0.01
    df = frame().rename(columns={"age": "x", "workclass": "c", "income": "y"})[["x", "c", "y"]]
    _, data = write(tmp_path, df=df)
    made = [api.prepare(v, data, use_cache=False) for v in variants]
    assert len({p.train["x"].tobytes() for p in made}) == 2  # zscore's and minmax's values
    assert sorted(len(p.meta["c"]["vocab"]) for p in made) == [3, 3, 4, 4]  # <UNK> and the 2 or 3 most common

    def said(space) -> str:
        return error({"parameters": {"x.preprocessing.normalization": {"space": "choice", "categories": ["zscore", "minmax"]}, **space}})

    assert "give it a choice or grid space, not randint" in error(
        {"parameters": {"defaults.category.preprocessing.most_common": {"space": "randint", "lower": 2, "upper": 9}}})
    pbt = error({
        "parameters": {"x.preprocessing.normalization": {"space": "choice", "categories": ["minmax"]}},
        "executor": {"scheduler": {"type": "pbt"}},
    })
    assert "scheduler pbt cannot mutate" in pbt
    many = said({"defaults.category.preprocessing.most_common": {"space": "grid", "values": list(range(2, 7))}})
    assert "change preprocessing in 10 ways" in many and "search at most 8" in many


def test_a_search_follows_a_training_split_metric_when_the_training_split_is_evaluated():
    """split: training has only the running loss, unless trainer.evaluate_training_set
    measures the training split as the validation split is (its train_<metric>)."""
    search = {"parameters": {"trainer.learning_rate": LR}, "split": "training", "metric": "accuracy", "goal": "maximize"}
    said = error(search)
    assert "metric 'accuracy' is not measured on the training split" in said and "trainer.evaluate_training_set: true" in said
    h = config(search, trainer={"evaluate_training_set": True}).hyperopt
    assert h is not None and h.metric_name == "train_accuracy"


def test_trials_that_ended_in_an_error_are_counted_and_the_first_error_shown():
    """On a cluster of several machines whose output directory is not shared, Ray fails the
    trials placed on the other nodes; the search still ends with a best among the rest."""
    from raylight.declarative.hyperopt import errored_trials

    rows = [
        {"trial": "a", "status": "COMPLETED", "error": None},
        {"trial": "b", "status": "ERROR", "error": "RuntimeError: Unable to set up cluster storage"},
        {"trial": "c", "status": "ERROR", "error": "ValueError: x"},
        {"trial": "d", "status": "STOPPED", "error": None},
    ]
    said = errored_trials(rows)
    assert said is not None and said.startswith("hyperopt: 2 of 4 trials ended in an error")
    assert "(trial b): RuntimeError: Unable to set up cluster storage" in said
    assert errored_trials([r for r in rows if r["status"] != "ERROR"]) is None


@pytest.mark.parametrize(
    "search_alg", [{"type": "random", "seed": 7}, {"type": "random"}, {"type": "grid"}, {"type": "optuna", "seed": 1}]
)
def test_the_search_algorithm_holds_the_planned_trials_at_once(search_alg, tmp_path):
    """The plan's trials-at-once is held by the search algorithm, and the TuneConfig's
    max_concurrent_trials stays unset: given a seeded generator, Tune ignored that one
    (with a warning) and ran as many trials as the cluster could place."""
    pytest.importorskip("ray.tune")
    if search_alg["type"] == "optuna":
        pytest.importorskip("optuna")
    from ray.tune.search import ConcurrencyLimiter

    from raylight.declarative import hyperopt, search
    from raylight.tune.resources import ConcurrencyPlan

    space = {"space": "grid", "values": [0.1, 0.01, 0.001]} if search_alg["type"] == "grid" else LR
    h = config({"parameters": {"trainer.learning_rate": space}, "search_alg": search_alg, "executor": {"num_samples": 4}}).hyperopt
    alg = search.search_algorithm(h, 2)
    assert alg.max_concurrent == 2
    if search_alg["type"] == "optuna":
        assert isinstance(alg, ConcurrencyLimiter)
    tuner = hyperopt._new_tuner(lambda c: None, h, str(tmp_path), ConcurrencyPlan(2, "test"), progress=True)
    tune_config = tuner._local_tuner._tune_config
    assert tune_config.max_concurrent_trials is None and tune_config.search_alg.max_concurrent == 2


def test_trial_lines_say_each_trial_event_in_one_line():
    pytest.importorskip("ray.tune")
    from types import SimpleNamespace

    from raylight.tune.progress import TrialLines

    said: list[str] = []
    lines = TrialLines("validation_loss", num_trials=2, write=said.append)
    a = SimpleNamespace(trial_id="ab_00000", status="RUNNING", config={"trainer.learning_rate": 0.012345})
    b = SimpleNamespace(trial_id="ab_00001", status="PENDING", config={"trainer.learning_rate": 0.1})
    lines.on_trial_start(0, [a, b], a)
    lines.on_trial_result(1, [a, b], a, {"validation_loss": 0.5, "training_iteration": 1})
    lines.on_trial_result(1, [a, b], a, {"training_iteration": 1})  # the driver's own results: no metric
    a.status = "TERMINATED"
    lines.on_trial_complete(2, [a, b], a)
    b.status = "ERROR"
    lines.on_trial_error(3, [a, b], b)
    assert said == [
        "hyperopt: trial ab_00000 started: trainer.learning_rate=0.01235 (1 running, 0/2 done)",
        "hyperopt: trial ab_00000 iteration 1: validation_loss=0.5 (1 running, 0/2 done)",
        "hyperopt: trial ab_00000 finished (0 running, 1/2 done)",
        "hyperopt: trial ab_00001 failed (0 running, 2/2 done)",
    ]
