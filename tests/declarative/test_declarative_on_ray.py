"""Declarative training on the ray backend (the session's 2-CPU local Ray)."""

import json
import os
import subprocess
import sys

import pytest

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.loading import load_config
from tests.declarative_data import CONFIG, write
from tests.helpers import own_temp_dir, torchrun_command

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

RAY_CONFIG = CONFIG.replace(
    "backend: {type: local}",
    "backend: {type: ray, processor: {type: ray_data}, trainer: {num_workers: 2, resources_per_worker: {CPU: 1}}}",
).replace("batch_size: 32", "batch_size: auto")


@pytest.mark.parametrize("processor", ["ray_data", "pandas"])
def test_two_workers_on_two_cpus_finish_adaptively(ray_cluster, tmp_path, processor):
    """Ludwig's Ray backend hangs here (workers take every CPU; Ray Data's tasks never
    run); raylight preprocesses on Ray Data before the workers claim CPUs. A linear LR
    decay keeps its clock in steps of the first batch (64: 5 steps an epoch, 30 in all)
    whatever batches the engine picks: epoch e's last step starts between steps 5e and
    5e + 4, so its rate lies between those steps' rates."""
    config = RAY_CONFIG.replace("type: ray_data", f"type: {processor}").replace(
        "early_stop: 5}", "early_stop: 5, learning_rate_scheduler: {decay: linear}}"
    )
    cfg, data = write(tmp_path, fmt="parquet", config=config)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["backend"] == "ray" and out["evaluation"]["test"]["accuracy"] > 0.6
    run = tmp_path / "run"
    assert (run / "adaptive.jsonl").exists() and (run / "model" / "weights.safetensors").exists()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        e = row["epoch"]
        assert 1e-3 * (30 - 5 * e - 4) / 30 - 1e-12 <= row["learning_rate"] <= 1e-3 * (30 - 5 * e) / 30 + 1e-12, row


def test_fixed_stratified_and_hash_splits_on_ray_data_give_the_pandas_splits(ray_cluster, tmp_path):
    """Ludwig's fixed split on the ray_data processor: each block's rows go where their
    column says (the same rows as the pandas processor's, in another order); a value that
    is not 0, 1 or 2 names the column. Its stratified split: each stratum's split sizes are
    the pandas processor's. Its hash and datetime splits, over two blocks: the pandas
    processor's rows.
    A sample (Ludwig's sample_size) over two blocks: the pandas sample's size and split.
    Class balancing (oversample_minority) of a fixed split's training rows over two blocks:
    the pandas processor's class sizes, each row one of the split's own."""
    import numpy as np

    from tests.declarative_data import frame

    df = frame()
    df["split"] = np.tile([0, 0, 0, 0, 0, 0, 0, 1, 2, 2], 40)
    df["user"] = np.arange(400) // 3
    df["when"] = [f"2021-{1 + d // 28:02d}-{1 + d % 28:02d}" for d in np.random.default_rng(1).integers(0, 336, 400)]  # ties too
    config = RAY_CONFIG.replace("{type: random, probabilities: [0.7, 0.1, 0.2]}", "{type: fixed}")
    cfg, data = write(tmp_path, fmt="parquet", config=config, df=df)
    sizes = {}
    for processor in ("ray_data", "pandas"):
        prepared = api.prepare(load_config(cfg), data, processor=processor, use_cache=False)
        sizes[processor] = {k: sorted(np.asarray(column(v, "age")).round(6).tolist())
                            for k, v in (("train", prepared.train), ("validation", prepared.validation), ("test", prepared.test))}
    assert [len(sizes["ray_data"][k]) for k in ("train", "validation", "test")] == [280, 40, 80]
    assert sizes["ray_data"] == sizes["pandas"]
    sizes_fixed = sizes["pandas"]
    cfg, data = write(tmp_path, fmt="parquet", config=config, df=df.assign(split=["0"] * 399 + ["train"]))
    with pytest.raises(ConfigError, match=r"preprocessing\.split\.column 'split'.*such as \['train'\]"):
        api.prepare(load_config(cfg), data, processor="ray_data", use_cache=False)
    # stratified: each split holds each workclass in the pandas split's numbers (rows drawn
    # per block on Ray Data, so other rows)
    config = RAY_CONFIG.replace("{type: random, probabilities: [0.7, 0.1, 0.2]}", "{type: stratify, column: workclass}")
    cfg, _ = write(tmp_path, fmt="parquet", config=config, df=df)
    (tmp_path / "parts").mkdir()
    for i, part in enumerate((df.iloc[:150], df.iloc[150:])):  # two files: two blocks, strata spread over both
        part.to_parquet(tmp_path / "parts" / f"{i}.parquet")
    data = str(tmp_path / "parts" / "*.parquet")
    counts = {}
    for processor in ("ray_data", "pandas"):
        prepared = api.prepare(load_config(cfg), data, processor=processor, use_cache=False)
        counts[processor] = [np.bincount(np.asarray(column(v, "workclass")), minlength=5).tolist()
                             for v in (prepared.train, prepared.validation, prepared.test)]
    assert counts["ray_data"] == counts["pandas"]
    assert sum(sum(c) for c in counts["pandas"]) == 400
    for split in ("{type: hash, column: user}", "{type: datetime, column: when}"):
        config = RAY_CONFIG.replace("{type: random, probabilities: [0.7, 0.1, 0.2]}", split)
        cfg, _ = write(tmp_path, fmt="parquet", config=config, df=df)
        for processor in ("ray_data", "pandas"):
            prepared = api.prepare(load_config(cfg), data, processor=processor, use_cache=False)
            sizes[processor] = {k: sorted(np.asarray(column(v, "age")).round(6).tolist())
                                for k, v in (("train", prepared.train), ("validation", prepared.validation), ("test", prepared.test))}
        assert sizes["ray_data"] == sizes["pandas"] and sum(len(v) for v in sizes["pandas"].values()) == 400, split
    config = RAY_CONFIG.replace("preprocessing: {split:", "preprocessing: {sample_size: 150, split:")
    cfg, _ = write(tmp_path, fmt="parquet", config=config, df=df)
    for processor in ("ray_data", "pandas"):
        prepared = api.prepare(load_config(cfg), data, processor=processor, use_cache=False)
        sizes[processor] = [len(column(v, "age")) for v in (prepared.train, prepared.validation, prepared.test)]
    assert sizes["ray_data"] == sizes["pandas"] == [105, 15, 30]
    config = RAY_CONFIG.replace("{type: random, probabilities: [0.7, 0.1, 0.2]}", "{type: fixed}").replace(
        "preprocessing: {split:", "preprocessing: {oversample_minority: 1, split:"
    )
    cfg, _ = write(tmp_path, fmt="parquet", config=config, df=df)
    balanced = {}
    for processor in ("ray_data", "pandas"):
        prepared = api.prepare(load_config(cfg), data, processor=processor, use_cache=False)
        y = np.asarray(column(prepared.train, "income"))
        balanced[processor] = [int((y == 0).sum()), int((y == 1).sum())]
        assert set(np.asarray(column(prepared.train, "age")).round(6).ravel()) <= set(np.ravel(sizes_fixed["train"]))
    assert balanced["ray_data"] == balanced["pandas"] and balanced["pandas"][0] == balanced["pandas"][1]


def test_date_set_bag_vector_and_timeseries_features_on_ray_data_give_the_pandas_processor_s(ray_cluster, tmp_path):
    """Date, set, bag, vector and timeseries inputs over two blocks, fixed split: Ray Data's statistics
    (mean date, year moments, vocabularies, widths, vector size, series length) are the pandas
    processor's, and so are its rows' arrays; so are a set target's labels and rows; a
    value that is not a date, or a vector of another length, names the column."""
    import numpy as np

    from tests.declarative_data import frame

    df = frame()
    rng = np.random.default_rng(2)
    df["split"] = np.tile([0, 0, 0, 0, 0, 0, 0, 1, 2, 2], 40)
    seconds = rng.integers(0, 20 * 365 * 86400, 400)
    df["when"] = [str(np.datetime64("2000-01-01T00:00:00") + np.timedelta64(int(s), "s")) for s in seconds]
    df["tags"] = [" ".join(rng.choice(list("pqrstuv"), rng.integers(1, 4), replace=False)) for _ in range(400)]
    df["words"] = [" ".join(rng.choice(list("abcde"), rng.integers(1, 9))) for _ in range(400)]
    df["emb"] = [" ".join(f"{v:.3f}" for v in rng.normal(size=3)) for _ in range(400)]
    df["ts"] = [" ".join(f"{v:.2f}" for v in rng.normal(size=rng.integers(1, 6))) for _ in range(400)]
    df.loc[::50, ["when", "tags", "words", "emb", "ts"]] = None  # filled: the mean date, no tokens, zeros
    inputs = "  - {name: when, type: date}\n  - {name: tags, type: set}\n  - {name: words, type: bag}\n  - {name: emb, type: vector}\n  - {name: ts, type: timeseries}\n"
    config = RAY_CONFIG.replace("{type: random, probabilities: [0.7, 0.1, 0.2]}", "{type: fixed}").replace(
        "  - {name: review, type: text}\n", "  - {name: review, type: text}\n" + inputs
    )
    cfg, _ = write(tmp_path, fmt="parquet", config=config, df=df)
    (tmp_path / "parts").mkdir()

    def write_parts(frame_):
        for i, part in enumerate((frame_.iloc[:170], frame_.iloc[170:])):
            part.to_parquet(tmp_path / "parts" / f"{i}.parquet")

    write_parts(df)
    data = str(tmp_path / "parts" / "*.parquet")
    prepared = {p: api.prepare(load_config(cfg), data, processor=p, use_cache=False) for p in ("ray_data", "pandas")}
    meta = {p: prepared[p].meta for p in prepared}
    assert meta["ray_data"]["when"]["mean_date"] == meta["pandas"]["when"]["mean_date"]
    for key in ("year_mean", "year_std"):
        assert np.isclose(meta["ray_data"]["when"][key], meta["pandas"]["when"][key]), key
    for name in ("tags", "words", "emb", "ts"):
        assert meta["ray_data"][name] == meta["pandas"][name], name
    assert meta["pandas"]["tags"]["width"] == 3 and meta["pandas"]["emb"] == {"size": 3}
    for split in ("train", "validation", "test"):
        rows = {  # each row's four arrays side by side, in order of the rows
            p: sorted(np.concatenate([column(getattr(prepared[p], split), n).astype(np.float64) for n in ("when", "tags", "words", "emb", "ts")], axis=1).tolist())
            for p in prepared
        }
        assert rows["ray_data"] == rows["pandas"] and len(rows["pandas"]) > 0, split
    # a set target (multi-label): the same labels, and rows (those with none dropped)
    target = config.replace("  - {name: tags, type: set}\n", "").replace("{name: income, type: binary}", "{name: tags, type: set}")
    cfg_target, _ = write(tmp_path, fmt="parquet", config=target, df=df)
    on = {p: api.prepare(load_config(cfg_target), data, processor=p, use_cache=False) for p in ("ray_data", "pandas")}
    assert on["ray_data"].meta["tags"] == on["pandas"].meta["tags"] and len(on["pandas"].meta["tags"]["classes"]) == 7
    for split in ("train", "validation", "test"):
        got, want = (sorted(column(getattr(on[p], split), "tags").tolist()) for p in ("ray_data", "pandas"))
        assert got == want and len(got) > 0, split
    write_parts(df.assign(when=df["when"].where(df.index != 300, "next tuesday")))
    with pytest.raises(ConfigError, match=r"column 'when' \(input_features 'when', type date\) holds values that are not dates, such as \['next tuesday'\]"):
        api.prepare(load_config(cfg), data, processor="ray_data", use_cache=False)
    # a series checked in every split, not only the training one (row 308 is a test row)
    write_parts(df.assign(ts=df["ts"].where(df.index != 308, "1 oops 2")))
    with pytest.raises(ConfigError, match=r"column 'ts' \(input_features 'ts', type timeseries\) holds values that are not series of finite numbers, such as \['1 oops 2'\]") as err:
        api.prepare(load_config(cfg), data, processor="ray_data", use_cache=False)
    assert type(err.value) is ConfigError  # found by the blocks' check, not raised inside a Ray task
    write_parts(df.assign(emb=df["emb"].where(df.index != 300, "1 2")))
    with pytest.raises(ConfigError, match=r"column 'emb' \(input_features 'emb', type vector\) has vectors of \[2, 3\] numbers"):
        api.prepare(load_config(cfg), data, processor="ray_data", use_cache=False)


def test_fill_with_mode_on_ray_data_is_the_whole_training_split_s_mode(ray_cluster, tmp_path):
    """fill_with_mode over two blocks whose own most common values differ from the
    training split's (the first block alone says red, 1.0 and true; the two together
    blue, 2.0 and false): Ray Data adds the blocks' counts up, and the missing values of
    the validation and test rows get what the pandas processor gives them."""
    import numpy as np
    import pandas as pd

    train = pd.DataFrame({
        "c": ["red"] * 30 + ["blue"] * 40, "x": [1.0] * 30 + [2.0] * 40, "b": ["yes"] * 30 + ["no"] * 40,
    })
    missing = pd.DataFrame({"c": [None, None], "x": [None, None], "b": [None, None]})
    df = pd.concat([train, missing], ignore_index=True).assign(y=[True, False] * 36, split=[0] * 70 + [1, 2])
    (tmp_path / "parts").mkdir()
    df.iloc[:50].to_parquet(tmp_path / "parts" / "0.parquet")  # red, 1.0 and yes 30 times, the others 20
    df.iloc[50:].to_parquet(tmp_path / "parts" / "1.parquet")  # blue, 2.0 and no 20 times more
    mode = "{missing_value_strategy: fill_with_mode}"
    config = f"""\
input_features:
  - {{name: c, type: category, preprocessing: {mode}}}
  - {{name: x, type: number, preprocessing: {{missing_value_strategy: fill_with_mode, normalization: null}}}}
  - {{name: b, type: binary, preprocessing: {mode}}}
output_features:
  - {{name: y, type: binary}}
preprocessing: {{split: {{type: fixed}}}}
backend: {{type: ray, processor: {{type: ray_data}}}}
"""
    cfg, _ = write(tmp_path, fmt="parquet", config=config, df=df)
    data = str(tmp_path / "parts" / "*.parquet")
    prepared = {p: api.prepare(load_config(cfg), data, processor=p, use_cache=False) for p in ("ray_data", "pandas")}
    for p, ready in prepared.items():
        meta = ready.meta
        assert (meta["c"]["mode"], meta["x"]["mode"], meta["b"]["mode"]) == ("blue", 2.0, 0.0), p
        for split in ("validation", "test"):
            filled = [np.asarray(column(getattr(ready, split), n), dtype=np.float64).ravel().tolist() for n in ("c", "x", "b")]
            assert filled == [[meta["c"]["vocab"].index("blue")], [2.0], [0.0]], (p, split)
    for name in ("c", "x", "b"):
        got, want = (sorted(np.asarray(column(prepared[p].train, name), dtype=np.float64).ravel().tolist()) for p in ("ray_data", "pandas"))
        assert got == want and len(got) == 70, name


def column(split, name):
    """A split's preprocessed column (arrays, or blocks left in the object store)."""
    import numpy as np
    import ray

    if isinstance(split, dict):
        return split[name]
    return np.concatenate([ray.get(b)[name] for b in split.blocks])


def test_several_outputs_train_on_two_ray_workers_from_ray_data(ray_cluster, tmp_path):
    """Four outputs on the ray backend: Ray Data fits each target's metadata as the
    pandas processor does (a number target's moments, a category's classes, a vector's
    length), drops the rows lacking any target, and two DDP workers train every output,
    measuring each output on the training split's blocks too (evaluate_training_set)."""
    import numpy as np

    from tests.declarative_data import MULTI, multi

    df = multi(600).assign(split=[0] * 420 + [1] * 60 + [2] * 120)  # the same rows in each split for both
    df["w"] = [f"{a:.4f} {a - b:.4f}" for a, b in zip(df["a"], df["b"], strict=True)]
    df.loc[[5, 300], "z"] = None
    df.loc[[9], "k"] = None
    config = MULTI.replace("{type: random, probabilities: [0.7, 0.1, 0.2]}", "{type: fixed}").replace(
        "  - {name: k, type: category}\n", "  - {name: k, type: category}\n  - {name: w, type: vector}\n"
    ).replace(
        "backend: {type: local}",
        "backend: {type: ray, processor: {type: ray_data}, trainer: {num_workers: 2, resources_per_worker: {CPU: 1}}}",
    ).replace("early_stop: -1}", "early_stop: -1, evaluate_training_set: true}")
    assert "evaluate_training_set" in config
    cfg, data = write(tmp_path, fmt="parquet", config=config, df=df)
    prepared = {p: api.prepare(load_config(cfg), data, processor=p, use_cache=False) for p in ("ray_data", "pandas")}
    ray_meta, pandas_meta = prepared["ray_data"].meta, prepared["pandas"].meta
    assert ray_meta["k"] == pandas_meta["k"] and ray_meta["y"] == pandas_meta["y"] == {}
    assert ray_meta["z"] == pytest.approx(pandas_meta["z"], rel=1e-9) and ray_meta["w"] == pandas_meta["w"] == {"size": 2}
    rows = {p: sum(len(column(s, "z")) for s in (r.train, r.validation, r.test) if s is not None) for p, r in prepared.items()}
    assert rows == {"ray_data": 597, "pandas": 597}
    assert not np.isnan(np.concatenate([column(s, "z") for s in (prepared["ray_data"].train, prepared["ray_data"].test)])).any()
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    test = out["evaluation"]["test"]
    assert out["backend"] == "ray" and test["y/accuracy"] > 0.85 and test["z/r2"] > 0.85 and test["k/accuracy"] > 0.8, test
    assert test["w/r2"] > 0.85, test
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["train_y/accuracy"] > 0.85 and last["train_z/r2"] > 0.85 and last["train_k/accuracy"] > 0.8, last


def test_more_gpus_than_exist_is_a_config_error(ray_cluster, tmp_path):
    cfg, data = write(tmp_path, config=RAY_CONFIG.replace("num_workers: 2,", "num_workers: 2, use_gpu: true,"))
    with pytest.raises(ConfigError) as err:
        api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert "GPU" in str(err.value) and "backend.trainer" in str(err.value)
    assert not (tmp_path / "run").exists()


def test_unreachable_ray_address_exits_2(tmp_path):
    cfg, data = write(tmp_path, config=RAY_CONFIG)
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}
    res = subprocess.run(
        [sys.executable, "-m", "raylight.cli", "train", "--config", cfg, "--dataset", data, "--output-directory", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert res.returncode == 2 and "could not reach the Ray cluster at '127.0.0.1:1'" in res.stderr
    assert not (tmp_path / "run").exists()


def test_ray_data_preprocessing_cancels_no_ray_task(ray_cluster, tmp_path, monkeypatch):
    """In Ray 2.60 a task cancelled as it completes can abort the driver (task_manager.cc:
    "Tried to complete task that was not pending": it stopped the suite once). A lazy
    read's schema() cancels the read tasks still running; preprocessing asks nothing of
    a dataset it has not read in full, so it cancels nothing."""
    import ray

    from raylight.declarative.ray_data import prepare_ray_data
    from tests.declarative_data import frame

    cancelled: list = []
    cancel = ray.cancel
    monkeypatch.setattr(ray, "cancel", lambda *args, **kwargs: (cancelled.append(args), cancel(*args, **kwargs))[1])
    df = frame(20_000).drop(columns="smoker")  # the check of the columns ends it: no need to train
    for i in range(4):  # several files, large enough that their read tasks run side by side
        (tmp_path / f"part{i}").mkdir()
        cfg, _ = write(tmp_path / f"part{i}", df=df, config=RAY_CONFIG)
    with pytest.raises(ConfigError, match="smoker"):
        prepare_ray_data(load_config(cfg), str(tmp_path / "part*" / "data.csv"), progress=False)
    assert cancelled == []


def test_ray_data_reads_parquet_without_an_actor_pool(ray_cluster, tmp_path):
    """Ray 2.60's default Parquet reader starts 32 FooterReader actors for every read and
    kills them when the listing ends (seconds of process starts on a small machine, and a
    GCS error line on the driver when one is killed while it starts). raylight reads
    Parquet with Ray Data's first reader, which starts no actor; the file is read all the
    same."""
    import ray

    from raylight.declarative.ray_data import prepare_ray_data
    from tests.declarative_data import frame

    def classes() -> set[str]:
        return {a.get("ActorClassName", "") for a in ray._private.state.actors().values()}

    before = classes()
    cfg, data = write(tmp_path, fmt="parquet", df=frame(300), config=RAY_CONFIG)
    prepared = prepare_ray_data(load_config(cfg), data, progress=False)
    assert sum(len(prepared[k]) for k in ("train", "validation", "test")) == 300
    started = {name for name in classes() - before if "FooterReader" in name}
    assert not started, started
    assert ray.data.DataContext.get_current().use_datasource_v2  # the user's reads keep Ray's default


def test_ray_data_finds_non_numeric_strings_in_a_number_column(ray_cluster, tmp_path):
    from raylight.declarative.ray_data import prepare_ray_data
    from tests.declarative_data import frame

    df = frame()
    df["age"] = df["age"].astype(object).where(df.index != 5, "forty")
    cfg, data = write(tmp_path, df=df, config=RAY_CONFIG)
    with pytest.raises(ConfigError) as err:
        prepare_ray_data(load_config(cfg), data, progress=False)
    assert "column 'age' (input_features 'age', type number) holds non-numeric values such as ['forty']" in str(err.value)


def test_ray_data_splits_stay_in_blocks_and_the_cache_reads_them_back(ray_cluster, tmp_path):
    """Ray Data's splits are left in the object store (BlockRefs, several blocks from
    several files), the workers read them a block at a time, and a cache_dir entry is
    written and read back a block at a time with the same rows."""
    import numpy as np
    import pandas as pd
    import ray
    import ray.data

    from raylight.declarative.ray_data import BlockRefs
    from tests.declarative_data import frame

    df = frame()
    cfg, _ = write(tmp_path, fmt="parquet", config=RAY_CONFIG.replace("processor: {type: ray_data}", f"processor: {{type: ray_data}}, cache_dir: '{tmp_path / 'cache'}'"))
    files = tmp_path / "parts"
    files.mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(df)), 4)):
        df.iloc[part].to_parquet(files / f"part-{i}.parquet")
    config = load_config(cfg)
    ctx = ray.data.DataContext.get_current()
    saved = ctx.target_max_block_size
    ctx.target_max_block_size = 4096  # small blocks, as a large dataset would have
    try:
        first = api.prepare(config, str(files / "*.parquet"), processor="ray_data", progress=False)
    finally:
        ctx.target_max_block_size = saved
    assert isinstance(first.train, BlockRefs) and len(first.train.blocks) > 1
    assert len(first.train) + len(first.validation) + len(first.test) == len(df)
    assert (tmp_path / "cache").exists() and len(list((tmp_path / "cache").iterdir())) == 1
    again = api.prepare(config, str(files / "*.parquet"), processor="ray_data", progress=False)
    assert isinstance(again.train, BlockRefs) and again.train.lengths == first.train.lengths

    def rows(refs):
        return pd.concat([pd.DataFrame({k: list(v) for k, v in ray.get(b).items()}) for b in refs.blocks], ignore_index=True)

    pd.testing.assert_frame_equal(rows(first.train), rows(again.train))
    out = api.train(config, str(files / "*.parquet"), output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["accuracy"] > 0.6


def test_ray_data_counts_empty_csv_strings_as_missing(ray_cluster, tmp_path):
    """Ray Data reads a CSV text column with "" for missing values: a column of only
    those is all-null, as with pandas."""
    from raylight.declarative.ray_data import prepare_ray_data
    from tests.declarative_data import frame

    df = frame()
    df["workclass"] = None
    cfg, data = write(tmp_path, df=df, fmt="csv", config=RAY_CONFIG)
    with pytest.raises(ConfigError) as err:
        prepare_ray_data(load_config(cfg), data, progress=False)
    assert "column 'workclass' of dataset" in str(err.value) and "null" in str(err.value)


def _ray_data_error(tmp_path, df, config=RAY_CONFIG) -> str:
    from raylight.declarative.ray_data import prepare_ray_data

    cfg, data = write(tmp_path, df=df, config=config)
    with pytest.raises(ConfigError) as err:
        prepare_ray_data(load_config(cfg), data, progress=False)
    return str(err.value)


def test_ray_data_rejects_text_in_a_number_target(ray_cluster, tmp_path):
    from tests.declarative_data import frame

    df = frame().assign(price=lambda d: d["age"].fillna(0) * 2)
    df["price"] = df["price"].astype(object).where(df.index != 9, "expensive")
    text = _ray_data_error(tmp_path, df, RAY_CONFIG.replace("{name: income, type: binary}", "{name: price, type: number}"))
    assert "column 'price' (output_features 'price', type number) holds non-numeric values such as ['expensive']" in text


def test_ray_data_rejects_infinite_numbers(ray_cluster, tmp_path):
    import numpy as np

    from tests.declarative_data import frame

    df = frame()
    df.loc[11, "age"] = np.inf
    text = _ray_data_error(tmp_path, df)
    assert "column 'age' (input_features 'age', type number) holds infinite values" in text


def test_ray_data_rejects_a_split_that_drop_row_empties(ray_cluster, tmp_path):
    from tests.declarative_data import frame

    df = frame(n=12)[["age", "income"]]
    df.loc[1:, "age"] = None
    df.loc[0, "age"] = 30.0  # one row keeps its age
    config = (  # one input and no vocabularies: the fewest Ray Data stages
        "input_features: [{name: age, type: number, preprocessing: {missing_value_strategy: drop_row}}]\n"
        "output_features: [{name: income, type: binary}]\n"
        "backend: {type: ray, processor: {type: ray_data}, trainer: {num_workers: 1}}\n"
    )
    text = _ray_data_error(tmp_path, df, config)
    assert "split" in text and "empty" in text and "drop_row" in text


def test_training_arrays_go_to_the_object_store_once(ray_cluster, tmp_path):
    """The loop config carries references, not arrays, to every worker start and resize."""
    import numpy as np
    import ray

    from raylight.declarative.train import from_store

    cfg, data = write(tmp_path, config=RAY_CONFIG.replace("type: ray_data", "type: pandas"))
    config = load_config(cfg)
    prepared = api.prepare(config, data)
    stored = api.in_store(prepared)
    loop_config, _ = api.loop_settings(config, stored, on_ray=True)
    assert isinstance(loop_config["train"], ray.ObjectRef) and isinstance(loop_config["validation"], ray.ObjectRef)
    back = from_store(loop_config["train"])
    assert back.keys() == prepared.train.keys()
    assert all(np.array_equal(back[k], prepared.train[k]) for k in back)
    assert from_store(prepared.train) is prepared.train  # arrays in memory pass through


@pytest.mark.parametrize("processor", ["ray_data", "pandas"])
def test_a_batch_larger_than_the_training_split_is_clamped_and_said_on_the_ray_backend(ray_cluster, tmp_path, caplog, processor):
    """The local backend's clamp, the same message: on Ray the split is Ray Data's blocks or
    arrays in the object store (a reference, which has no length), counted before."""
    import logging

    cfg, data = write(tmp_path, config=RAY_CONFIG.replace("batch_size: auto", "batch_size: 100000"))
    config = load_config(cfg)
    prepared = api.prepare(config, data, use_cache=False, processor=processor)
    train = prepared.train  # BlockRefs (their lengths), or a dict of arrays
    rows = len(train) if processor == "ray_data" else len(next(iter(train.values())))
    stored = api.in_store(prepared)
    assert 0 < rows < 100_000
    with caplog.at_level(logging.WARNING, logger="raylight"):
        loop_config, _ = api.loop_settings(config, stored, on_ray=True)
    assert loop_config["batch_size"] == rows
    said = [r.getMessage() for r in caplog.records if "trainer.batch_size" in r.getMessage()]
    assert said == [
        f"trainer.batch_size 100000 is larger than the {rows} rows of the training split; training with "
        f"batch_size {rows} (the whole split each step). Set trainer.batch_size to at most {rows} to choose it yourself"
    ]


def test_small_data_on_the_ray_backend_preprocesses_in_the_driver_as_the_local_backend(ray_cluster, tmp_path):
    """processor auto: data this small is preprocessed with pandas in the driver (the local
    backend's code path), and one Ray worker trains to the local backend's metrics."""
    cfg, data = write(tmp_path, config=CONFIG.replace("epochs: 6", "epochs: 2"))
    config = load_config(cfg)
    local = api.train(config, data, output_directory=str(tmp_path / "local"), backend="local", progress=False)
    ray_config = load_config(cfg, ["backend.type=ray", "backend.trainer.num_workers=1"])
    assert ray_config.backend.processor.type == "auto"
    on_ray = api.train(ray_config, data, output_directory=str(tmp_path / "ray"), progress=False)
    assert on_ray["backend"] == "ray" and on_ray["evaluation"]["processor"] == "pandas" == local["evaluation"]["processor"]
    for key, value in local["evaluation"]["test"].items():
        assert on_ray["evaluation"]["test"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_forced_ray_data_fits_what_pandas_fits_with_the_same_split_sizes(ray_cluster, tmp_path):
    """processor ray_data: statistics and vocabularies of its (other) random training
    split agree with pandas', the three splits have pandas' sizes, and no row is lost."""
    import numpy as np

    from raylight.declarative.ray_data import BlockRefs

    cfg, data = write(tmp_path, fmt="csv", config=RAY_CONFIG)
    config = load_config(cfg)
    on_ray = api.prepare(config, data, processor="ray_data", progress=False)
    local = api.prepare(config, data)
    assert isinstance(on_ray.train, BlockRefs)
    for split in ("train", "validation", "test"):
        assert len(getattr(on_ray, split)) == len(next(iter(getattr(local, split).values())))
    assert on_ray.meta["workclass"]["vocab"][0] == "<UNK>"
    assert set(on_ray.meta["workclass"]["vocab"]) == set(local.meta["workclass"]["vocab"])
    assert np.isclose(on_ray.meta["age"]["mean"], local.meta["age"]["mean"], rtol=0.05)
    assert np.isclose(on_ray.meta["age"]["std"], local.meta["age"]["std"], rtol=0.1)
    assert on_ray.meta["income"] == local.meta["income"]


LAUNCHED_CONFIG = CONFIG.replace(
    "backend: {type: local}", "backend: {type: ray, processor: {type: pandas}, trainer: {num_workers: 2}}"
)


def _under_torchrun(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    cmd = [*torchrun_command(), "-m", "raylight.cli", *args]
    with own_temp_dir({**env, "RAYLIGHT_RENDEZVOUS_TIMEOUT_S": "60"}) as env:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_raylight_train_under_torchrun_gives_the_model_two_ray_workers_give(ray_cluster, tmp_path):
    """Ludwig's `horovodrun ... ludwig train`, the torchrun way: both processes join
    torchrun's group, rank 0 writes the model directory; evaluate and predict share rows."""
    import json

    import pandas as pd
    from safetensors.torch import load_file

    cfg, data = write(tmp_path, config=LAUNCHED_CONFIG)
    on_ray = api.train(load_config(cfg), data, output_directory=str(tmp_path / "ray"), progress=False)
    assert on_ray["backend"] == "ray"
    trained = _under_torchrun("train", "--config", cfg, "--dataset", data, "--output-directory", str(tmp_path / "tr"), "--quiet")
    assert (trained.stdout + trained.stderr).count("\"best_epoch\"") == 1, "rank 0 alone prints the evaluation"
    ray_w = load_file(str(tmp_path / "ray" / "model" / "weights.safetensors"))
    tr_w = load_file(str(tmp_path / "tr" / "model" / "weights.safetensors"))
    assert ray_w.keys() == tr_w.keys()
    for key in ray_w:
        assert torch_allclose(ray_w[key], tr_w[key]), key
    run = json.loads((tmp_path / "tr" / "evaluation.json").read_text())
    assert run["test"]["accuracy"] == pytest.approx(on_ray["evaluation"]["test"]["accuracy"], abs=1e-6)
    rows = [json.loads(line) for line in (tmp_path / "tr" / "metrics.jsonl").read_text().splitlines()]
    assert {r["_workers"] for r in rows} == {2}

    model = str(tmp_path / "tr" / "model")
    evaluated = _under_torchrun("evaluate", "--model-path", model, "--dataset", data)
    assert json.loads(evaluated.stdout) == pytest.approx(api.evaluate(model, data), rel=1e-6)  # float32 sums, other order
    _under_torchrun("predict", "--model-path", model, "--dataset", data, "--output", str(tmp_path / "p.csv"))
    api.predict(model, data, str(tmp_path / "one.csv"))
    # The same rows in the same order; probabilities to float32's precision, as for
    # evaluate (each rank predicts its shard in batches of another size: other sums' order).
    launched, alone = pd.read_csv(tmp_path / "p.csv"), pd.read_csv(tmp_path / "one.csv")
    assert list(launched.columns) == list(alone.columns) and len(launched) == len(pd.read_csv(data))
    for column in launched.columns:
        if pd.api.types.is_float_dtype(alone[column]):
            assert launched[column].to_numpy() == pytest.approx(alone[column].to_numpy(), rel=1e-6), column
        else:
            assert launched[column].equals(alone[column]), column


def torch_allclose(a, b) -> bool:
    import torch

    return bool(torch.allclose(a, b, atol=1e-6, rtol=1e-5))


def test_a_launcher_backend_without_a_launcher_says_how_to_launch(tmp_path):
    cfg, data = write(tmp_path, config=CONFIG.replace("backend: {type: local}", "backend: {type: horovod}"))
    with pytest.raises(ConfigError) as err:
        api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert "backend.type horovod" in str(err.value) and "horovodrun -np N raylight train" in str(err.value)
    assert not (tmp_path / "run").exists()
