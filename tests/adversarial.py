"""Bad and odd inputs, as a hostile user would give them: one catalogue for the test
suite (``tests/project/test_adversarial.py`` runs each case in-process) and for the
benchmark (``bench/adversarial.py`` runs each as a real ``raylight`` command and times it).

Every case but the ``odd`` ones is a mistake: it must exit 2 (1 for failures at run
time), print a message that names the file, key path or column and the fix, and leave
the workspace as it found it. The ``odd`` cases are unusual but valid inputs that must
work.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

BASE_CONFIG = """\
input_features:
  - {name: age, type: number}
  - {name: city, type: category}
  - {name: smoker, type: binary}
  - {name: note, type: text}
output_features:
  - {name: label, type: binary}
combiner: {type: concat, fc_layers: [{output_size: 8}]}
trainer: {epochs: 1, batch_size: 16}
preprocessing: {split: {type: random, probabilities: [0.7, 0.1, 0.2]}}
backend: {type: local}
"""

RAY_BACKEND = "backend: {type: ray, processor: {type: pandas}, trainer: {num_workers: 1}}\n"


def base_frame(n: int = 60, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.normal(40, 10, n).round(1)
    return pd.DataFrame({
        "age": age,
        "city": rng.choice(["paris", "lyon", "nice"], n),
        "smoker": rng.choice([True, False], n),
        "note": [" ".join(rng.choice(["good", "bad", "fine", "ok"], 3)) for _ in range(n)],
        "price": rng.normal(100, 20, n).round(2),
        "label": age + rng.normal(0, 5, n) > 40,
    })


class Workspace:
    """A directory holding a config, a dataset, and (for model cases) a trained model;
    cases change them before they run. Paths fill the placeholders of a case's argv."""

    def __init__(self, root: str, model_source: str | None = None) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.cfg = self.path("config.yaml")
        self.data = self.path("data.csv")
        self.out = self.path("out")
        self.model = self.path("model")
        self.write(self.cfg, BASE_CONFIG)
        base_frame().to_csv(self.data, index=False)
        if model_source is not None:
            shutil.copytree(model_source, self.model)

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def write(self, path: str, content: str | bytes) -> str:
        mode = "wb" if isinstance(content, bytes) else "w"
        with open(path, mode) as f:
            f.write(content)
        return path

    def read(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    def config(self, text: str) -> None:
        self.write(self.cfg, text)

    def edit(self, old: str, new: str) -> None:
        with open(self.cfg) as f:
            text = f.read()
        assert old in text, old
        self.config(text.replace(old, new))

    def frame(self, df: pd.DataFrame, name: str = "data.csv") -> None:
        self.data = self.path(name)
        if name.endswith(".csv"):
            df.to_csv(self.data, index=False)
        elif name.endswith(".parquet"):
            df.to_parquet(self.data)
        else:
            df.to_json(self.data, orient="records", lines=True)

    def fill(self, arg: str) -> str:
        for key, value in (("cfg", self.cfg), ("data", self.data), ("out", self.out), ("model", self.model), ("tmp", self.root)):
            arg = arg.replace("{" + key + "}", value)
        return arg

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """Every file and directory under the workspace, with size and mtime."""
        found = {}
        for base, dirs, files in os.walk(self.root):
            for name in dirs + files:
                p = os.path.join(base, name)
                st = os.lstat(p)
                found[os.path.relpath(p, self.root)] = (st.st_size if name in files else -1, st.st_mtime_ns)
        return found


@dataclass(frozen=True)
class Case:
    id: str
    group: str
    argv: list[str]  # a raylight command; placeholders {cfg} {data} {out} {model} {tmp}
    expect: list[str]  # the message must contain each
    code: int = 2
    setup: Callable[[Workspace], Any] | None = None
    needs_model: bool = False
    root_skips: bool = False  # permissions do not stop root: skipped when run as root
    writes: bool = False  # a valid input: the command writes its results
    tags: tuple[str, ...] = field(default=())


TRAIN = ["train", "--config", "{cfg}", "--dataset", "{data}", "--output-directory", "{out}", "--quiet"]
CHECK = ["check", "--config", "{cfg}", "--dataset", "{data}"]
RENDER = ["render-config", "--config", "{cfg}"]
EVAL = ["evaluate", "--model-path", "{model}", "--dataset", "{data}"]
PREDICT = ["predict", "--model-path", "{model}", "--dataset", "{data}", "--output", "{tmp}/pred.csv"]

CASES: list[Case] = []


def case(id: str, group: str, argv: list[str], expect: list[str], **kw: Any) -> None:
    CASES.append(Case(id, group, argv, expect, **kw))


def edited(old: str, new: str) -> Callable[[Workspace], None]:
    return lambda ws: ws.edit(old, new)


def config_text(text: str) -> Callable[[Workspace], None]:
    return lambda ws: ws.config(text)


def data_bytes(content: str | bytes, name: str = "data.csv") -> Callable[[Workspace], None]:
    def setup(ws: Workspace) -> None:
        ws.data = ws.write(ws.path(name), content)

    return setup


def data_frame(change: Callable[[pd.DataFrame], pd.DataFrame], name: str = "data.csv") -> Callable[[Workspace], None]:
    return lambda ws: ws.frame(change(base_frame()), name)


def both(*setups: Callable[[Workspace], Any]) -> Callable[[Workspace], None]:
    def setup(ws: Workspace) -> None:
        for s in setups:
            s(ws)

    return setup


def set_col(col: str, values: Any, rows: Any = slice(None)) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def change(df: pd.DataFrame) -> pd.DataFrame:
        df[col] = df[col].astype(object)
        df.loc[df.index[rows], col] = values
        return df

    return change


# -- the config file -----------------------------------------------------------------------
case("config-missing", "config", [*CHECK[:2], "{tmp}/nope.yaml", *CHECK[3:]], ["nope.yaml", "does not exist"])
case("config-directory", "config", [*CHECK[:2], "{tmp}", *CHECK[3:]], ["is a directory", "pass a file"])
case("config-unreadable", "config", CHECK, ["permission denied"], setup=lambda ws: os.chmod(ws.cfg, 0), root_skips=True)
case("config-latin1", "config", CHECK, ["not UTF-8", "save it as UTF-8"], setup=lambda ws: ws.write(ws.cfg, BASE_CONFIG.replace("age", "\xe2ge").encode("latin-1")))
case("config-empty", "config", CHECK, ["is empty", "input_features"], setup=config_text(""))
case("config-comments-only", "config", CHECK, ["is empty"], setup=config_text("# nothing here\n"))
case("config-list", "config", CHECK, ["must hold a mapping", "list"], setup=config_text("- a\n- b\n"))
case("config-scalar", "config", CHECK, ["must hold a mapping", "str"], setup=config_text("hello\n"))
case("config-bad-yaml", "config", CHECK, ["not valid YAML", "line"], setup=config_text("input_features: [\n  - {name: a\n"))
case("config-tab-indent", "config", CHECK, ["not valid YAML"], setup=config_text("trainer:\n\tepochs: 3\n"))
case("config-binary", "config", CHECK, ["config file"], setup=lambda ws: ws.write(ws.cfg, bytes(range(256))))
case("config-unknown-top-key", "config", CHECK, ["trainerr: unknown key"], setup=edited("trainer:", "trainerr:"))
case("config-unknown-nested-key", "config", CHECK, ["trainer.epoch: unknown key"], setup=edited("epochs: 1", "epoch: 1"))
case("config-epochs-text", "config", CHECK, ["trainer.epochs", "'ten'"], setup=edited("epochs: 1", "epochs: ten"))
case("config-epochs-zero", "config", CHECK, ["trainer.epochs", "greater than or equal to 1"], setup=edited("epochs: 1", "epochs: 0"))
case("config-epochs-huge", "config", CHECK, ["trainer.epochs", "less than or equal to 1000000"], setup=edited("epochs: 1", "epochs: 1000000000"))
case("config-hyperopt-preprocessing-continuous", "config", CHECK,
     ["parameters.city.preprocessing.most_common: changes input_features.1.preprocessing (city)", "give it a choice or grid space, not randint"],
     setup=config_text(BASE_CONFIG + "hyperopt: {parameters: {city.preprocessing.most_common: {space: randint, lower: 2, upper: 9}}}\n"))
case("config-hyperopt-feature-level-reaches-none", "config", CHECK,
     ["parameters.defaults.date.encoder.embedding_size: no input feature has type 'date'"],
     setup=config_text(BASE_CONFIG + "hyperopt: {parameters: {defaults.date.encoder.embedding_size: {space: choice, categories: [8]}}}\n"))
case("config-lr-nan", "config", CHECK, ["trainer.learning_rate", "finite"], setup=edited("batch_size: 16", "batch_size: 16, learning_rate: .nan"))
case("config-lr-inf", "config", CHECK, ["trainer.learning_rate", "finite"], setup=edited("batch_size: 16", "batch_size: 16, learning_rate: .inf"))
case("config-lr-negative", "config", CHECK, ["trainer.learning_rate", "must be > 0"], setup=edited("batch_size: 16", "batch_size: 16, learning_rate: -0.1"))
case("config-lr-huge", "config", CHECK, ["trainer.learning_rate", "at most 100"], setup=edited("batch_size: 16", "batch_size: 16, learning_rate: 1e9"))
case("config-batch-zero", "config", CHECK, ["trainer.batch_size", "between 1 and"], setup=edited("batch_size: 16", "batch_size: 0"))
case("config-batch-huge", "config", CHECK, ["trainer.batch_size", "between 1 and 16777216"], setup=edited("batch_size: 16", "batch_size: 99999999999"))
case("config-batch-text", "config", CHECK, ["trainer.batch_size", "'big'"], setup=edited("batch_size: 16", "batch_size: big"))
case("config-seed-negative", "config", CHECK, ["trainer.seed", "greater than or equal to 0"], setup=edited("batch_size: 16", "batch_size: 16, seed: -1"))
case("config-seed-huge", "config", CHECK, ["trainer.seed", "less than or equal to 4294967295"], setup=edited("batch_size: 16", "batch_size: 16, seed: 1099511627776"))
case("config-embedding-huge", "config", CHECK, ["input_features.1.encoder.embedding_size", "65536"], setup=edited("{name: city, type: category}", "{name: city, type: category, encoder: {embedding_size: 10000000}}"))
case("config-output-size-zero", "config", CHECK, ["combiner.fc_layers.0.output_size", "greater than or equal to 1"], setup=edited("output_size: 8", "output_size: 0"))
case("config-output-size-huge", "config", CHECK, ["combiner.fc_layers.0.output_size", "65536"], setup=edited("output_size: 8", "output_size: 100000000"))
case("config-too-many-layers", "config", CHECK, ["combiner.fc_layers", "at most 64"], setup=edited("fc_layers: [{output_size: 8}]", "fc_layers: [" + ", ".join(["{output_size: 2}"] * 65) + "]"))
case("config-fill-nan", "config", CHECK, ["fill_value", "finite"], setup=edited("{name: age, type: number}", "{name: age, type: number, preprocessing: {missing_value_strategy: fill_with_const, fill_value: .nan}}"))
case("config-split-nan", "config", CHECK, ["preprocessing.split.probabilities", "finite"], setup=edited("[0.7, 0.1, 0.2]", "[.nan, 0.5, 0.5]"))
case("config-split-sum", "config", CHECK, ["preprocessing.split.probabilities", "summing to 1"], setup=edited("[0.7, 0.1, 0.2]", "[0.7, 0.7, 0.2]"))
case("config-split-length", "config", CHECK, ["preprocessing.split.probabilities"], setup=edited("[0.7, 0.1, 0.2]", "[0.7, 0.3]"))
case("config-split-no-train", "config", CHECK, ["train > 0"], setup=edited("[0.7, 0.1, 0.2]", "[0.0, 0.5, 0.5]"))
case("config-resources-inf", "config", CHECK, ["backend.trainer.resources_per_worker.CPU", "finite"], setup=edited("backend: {type: local}", "backend: {type: local, trainer: {resources_per_worker: {CPU: .inf}}}"))
case("config-resources-negative", "config", CHECK, ["backend.trainer.resources_per_worker", "between 0 and"], setup=edited("backend: {type: local}", "backend: {type: local, trainer: {resources_per_worker: {CPU: -1}}}"))
case("config-resources-nan", "config", CHECK, ["backend.trainer.resources_per_worker.CPU", "finite"], setup=edited("backend: {type: local}", "backend: {type: local, trainer: {resources_per_worker: {CPU: .nan}}}"))
case("config-resources-no-cpu", "config", CHECK, ["at least some CPU or GPU"], setup=edited("backend: {type: local}", "backend: {type: local, trainer: {resources_per_worker: {CPU: 0}}}"))
case("config-workers-zero", "config", CHECK, ["backend.trainer.num_workers", "greater than or equal to 1"], setup=edited("backend: {type: local}", "backend: {type: local, trainer: {num_workers: 0}}"))
case("config-workers-huge", "config", CHECK, ["backend.trainer.num_workers", "100000"], setup=edited("backend: {type: local}", "backend: {type: local, trainer: {num_workers: 10000000}}"))
case("config-elastic-order", "config", CHECK, ["min_workers (3) must not exceed max_workers (2)"], setup=edited("backend: {type: local}", "backend: {type: local, trainer: {min_workers: 3, max_workers: 2}}"))
case("config-backend-type", "config", CHECK, ["backend.type", "'spark'"], setup=edited("backend: {type: local}", "backend: {type: spark}"))
case("config-processor-type", "config", CHECK, ["backend.processor.type", "spark", "ray_data"], setup=edited("backend: {type: local}", "backend: {type: local, processor: {type: spark}}"))
case("config-strategy", "config", CHECK, ["backend.trainer.strategy", "'horovods'"], setup=edited("backend: {type: local}", "backend: {type: local, trainer: {strategy: horovods}}"))
case("config-feature-type", "config", CHECK, ["input_features.0", "'audio'", "'number'"], setup=edited("{name: age, type: number}", "{name: age, type: audio}"))
case("config-feature-no-name", "config", CHECK, ["input_features.0.name", "Field required"], setup=edited("{name: age, type: number}", "{type: number}"))
case("config-feature-empty-name", "config", CHECK, ["input_features.0.name", "at least 1 character"], setup=edited("{name: age, type: number}", "{name: '', type: number}"))
case("config-duplicate-names", "config", CHECK, ["feature names must be unique", "'age'"], setup=edited("{name: city, type: category}", "{name: age, type: category}"))
case("config-no-inputs", "config", CHECK, ["input_features", "at least 1 item"], setup=config_text("input_features: []\noutput_features: [{name: label, type: binary}]\n"))
case("config-no-outputs", "config", CHECK, ["output_features", "Field required"], setup=config_text("input_features: [{name: age, type: number}]\n"))
case("config-two-outputs-combined-accuracy", "config", CHECK, ["trainer.validation_metric", "of the combined outputs", "allowed: ['loss']"], setup=edited("  - {name: label, type: binary}\ncombiner: {type: concat, fc_layers: [{output_size: 8}]}\ntrainer: {epochs: 1,", "  - {name: label, type: binary}\n  - {name: price, type: number}\ncombiner: {type: concat, fc_layers: [{output_size: 8}]}\ntrainer: {validation_field: combined, validation_metric: accuracy, epochs: 1,"))
case("train-two-outputs-one-lacks-its-column", "dataset", TRAIN, ["output_features: feature 'price' needs column 'price'"], setup=both(edited("  - {name: label, type: binary}", "  - {name: label, type: binary}\n  - {name: price, type: number}"), data_frame(lambda df: df.drop(columns=["price"]))))
case("config-output-text", "config", CHECK, ["output_features.0.type", "'text'"], setup=edited("{name: label, type: binary}", "{name: label, type: text}"))
case("config-dropout-one", "config", CHECK, ["combiner.dropout", "less than 1"], setup=edited("combiner: {type: concat,", "combiner: {type: concat, dropout: 1.0,"))
case("config-optimizer", "config", CHECK, ["trainer.optimizer.type", "'soap'"], setup=edited("batch_size: 16", "batch_size: 16, optimizer: {type: soap}"))
case("config-momentum", "config", CHECK, ["trainer.optimizer.momentum", "less than 1"], setup=edited("batch_size: 16", "batch_size: 16, optimizer: {type: sgd, momentum: 5}"))
case("config-loss-weight", "config", CHECK, ["output_features.0.loss_weight", "greater than 0"], setup=edited("{name: label, type: binary}", "{name: label, type: binary, loss_weight: 0}"))
case("config-vocab-zero", "config", CHECK, ["most_common", "greater than or equal to 1"], setup=edited("{name: city, type: category}", "{name: city, type: category, preprocessing: {most_common: 0}}"))
case("config-early-stop", "config", CHECK, ["trainer.early_stop", "greater than or equal to -1"], setup=edited("batch_size: 16", "batch_size: 16, early_stop: -5"))
case("config-adaptive-batch", "config", CHECK, ["trainer.adaptive.max_batch_size", "greater than or equal to 1"], setup=edited("batch_size: 16", "batch_size: 16, adaptive: {max_batch_size: 0}"))
case("config-adaptive-rule", "config", CHECK, ["trainer.adaptive.lr_rule", "'cubic'"], setup=edited("batch_size: 16", "batch_size: 16, adaptive: {lr_rule: cubic}"))
case("config-adaptive-smoothing-nan", "config", CHECK, ["trainer.adaptive.noise_smoothing", "finite"], setup=edited("batch_size: 16", "batch_size: 16, adaptive: {noise_smoothing: .nan}"))
case("config-date-fill", "config", CHECK, ["input_features.0.preprocessing.fill_value", "'someday' is not a date"], setup=edited("{name: age, type: number}", "{name: age, type: date, preprocessing: {fill_value: someday}}"))
case("config-embed-cnn-key", "config", CHECK, ["input_features.3.encoder.nm_filters", "did you mean 'num_filters'?"], setup=edited("{name: note, type: text}", "{name: note, type: text, encoder: {nm_filters: 8}}"))
case("config-transformer-heads", "config", CHECK, ["input_features.3.encoder", "hidden_size 256 is not a multiple of num_heads 6"], setup=edited("{name: note, type: text}", "{name: note, type: text, encoder: {type: transformer, num_heads: 6}}"))
case("config-rnn-activation", "config", CHECK, ["input_features.3.encoder", "activation: the rnn encoder's layers take fc_activation"], setup=edited("{name: note, type: text}", "{name: note, type: text, encoder: {type: rnn, activation: sigmoid}}"))
case("config-vector-passthrough-layers", "config", CHECK, ["input_features.0.encoder", "a passthrough encoder has no layers"], setup=edited("{name: age, type: number}", "{name: age, type: vector, encoder: {type: passthrough, fc_layers: [{output_size: 4}]}}"))
case("config-too-many-outputs", "config", CHECK, ["output_features: List should have at most 64 items", "not 300", "(got a list of 300 items)"],
     setup=edited("  - {name: label, type: binary}\n", "".join(f"  - {{name: o{i}, type: number, column: price}}\n" for i in range(300))))
case("render-unknown-key", "config", RENDER, ["combiner.layers: unknown key"], setup=edited("fc_layers:", "layers:"))

# -- --set overrides -----------------------------------------------------------------------
case("set-no-equals", "override", [*CHECK, "--set", "trainer.epochs"], ["key.path=value"])
case("set-bad-yaml", "override", [*CHECK, "--set", "trainer.epochs=[1,"], ["trainer.epochs=[1,", "not valid YAML"])
case("set-into-scalar", "override", [*CHECK, "--set", "trainer.epochs.x=1"], ["trainer.epochs is a value, not a section"])
case("set-index-range", "override", [*CHECK, "--set", "input_features.9.name=x"], ["input_features.9 is not an index", "4 items"])
case("set-index-word", "override", [*CHECK, "--set", "input_features.first.name=x"], ["input_features.first is not an index"])
case("set-empty-key", "override", [*CHECK, "--set", "=5"], ["key.path=value"])
case("set-empty-part", "override", [*CHECK, "--set", "trainer..epochs=5"], ["no empty parts"])
case("set-invalid-value", "override", [*CHECK, "--set", "trainer.epochs=-3"], ["trainer.epochs", "greater than or equal to 1"])
case("set-unknown-key", "override", [*CHECK, "--set", "trainer.foo=1"], ["trainer.foo: unknown key"])
case("set-nan", "override", [*CHECK, "--set", "trainer.learning_rate=.nan"], ["trainer.learning_rate", "finite"])

# -- the dataset -----------------------------------------------------------------------------
case("data-missing", "dataset", [*CHECK[:4], "{tmp}/none.csv"], ["none.csv", "does not exist"])
case("data-directory", "dataset", [*CHECK[:4], "{tmp}/dir.csv"], ["is a directory", "glob"], setup=lambda ws: os.makedirs(ws.path("dir.csv")))
case("data-parquet-directory-empty", "dataset", [*CHECK[:4], "{tmp}/parts.parquet"], ["is a directory"], setup=lambda ws: os.makedirs(ws.path("parts.parquet")))
case("data-unknown-format", "dataset", [*CHECK[:4], "{tmp}/data.txt"], ["unknown format", ".csv, .parquet or .jsonl"], setup=data_bytes("a,b\n1,2\n", "data.txt"))
case("data-unreadable", "dataset", CHECK, ["permission denied"], setup=lambda ws: os.chmod(ws.data, 0), root_skips=True)
case("data-empty-file", "dataset", CHECK, ["is empty", "no header"], setup=data_bytes(""))
case("data-header-only", "dataset", CHECK, ["is empty", "no rows"], setup=data_bytes("age,city,smoker,note,price,label\n"))
case("data-latin1", "dataset", CHECK, ["not UTF-8"], setup=lambda ws: ws.write(ws.data, "age,city,smoker,note,label\n1,s\xe3o paulo,true,x,true\n".encode("latin-1")))
case("data-ragged", "dataset", CHECK, ["cannot be read as csv", "Expected 6 fields", "same number of fields"], setup=lambda ws: ws.write(ws.data, ws.read(ws.data) + "1,2,3,4,5,6,7,8\n"))
case("data-binary", "dataset", CHECK, ["data.csv"], setup=data_bytes(bytes(range(256)) * 4))
case("data-corrupt-parquet", "dataset", [*CHECK[:4], "{tmp}/data.parquet"], ["cannot be read as parquet", "Parquet file"], setup=data_bytes(b"PAR1 this is not parquet at all", "data.parquet"))
case("data-truncated-parquet", "dataset", [*CHECK[:4], "{tmp}/data.parquet"], ["cannot be read as parquet"], setup=lambda ws: ws.write(ws.path("data.parquet"), _parquet_bytes()[:200]))
case("data-empty-parquet", "dataset", [*CHECK[:4], "{tmp}/data.parquet"], ["is empty", "no rows"], setup=data_frame(lambda df: df.iloc[:0], "data.parquet"))
case("data-bad-jsonl", "dataset", [*CHECK[:4], "{tmp}/data.jsonl"], ["cannot be read as json", "one JSON object per line"], setup=data_bytes('{"age": 1, "label": true}\n{"age": 2, "label"\n', "data.jsonl"))
case("data-jsonl-arrays", "dataset", [*CHECK[:4], "{tmp}/data.jsonl"], ["data.jsonl"], setup=data_bytes("[1, 2]\n[3, 4]\n", "data.jsonl"))
case("data-glob-nothing", "dataset", [*CHECK[:4], "{tmp}/parts-*.csv"], ["no file matches"])
case("data-missing-input-column", "dataset", CHECK, ["input_features: feature 'city' needs column 'city'", "columns are"], setup=data_frame(lambda df: df.drop(columns=["city"])))
case("data-missing-target-column", "dataset", CHECK, ["output_features: feature 'label' needs column 'label'"], setup=data_frame(lambda df: df.drop(columns=["label"])))
case("data-all-null-column", "dataset", CHECK, ["column 'age'", "entirely empty"], setup=data_frame(set_col("age", np.nan)))
case("data-text-in-number", "dataset", CHECK, ["column 'age'", "non-numeric", "'forty'"], setup=data_frame(set_col("age", "forty", [3])))
case("data-inf-in-number", "dataset", CHECK, ["column 'age'", "infinite values", "row 5"], setup=data_frame(set_col("age", np.inf, [5])))
case("data-neg-inf-in-number", "dataset", CHECK, ["column 'age'", "infinite values"], setup=data_frame(set_col("age", -np.inf, [0])))
case("data-overflow-in-number", "dataset", CHECK, ["column 'age'", "infinite values"], setup=lambda ws: ws.write(ws.data, ws.read(ws.data).replace("\n", "\n1e400,paris,True,ok ok,1.0,True\n", 1)))
case("data-huge-in-number", "dataset", CHECK, ["column 'age'", "values too large to train on", "standard deviation overflows", "rescale the column"], setup=data_frame(lambda df: df.assign(age=df["age"] * 1e305)))
case("data-huge-in-target", "dataset", CHECK, ["column 'price'", "values too large to train on", "mean overflows"], setup=both(edited("{name: label, type: binary}", "{name: price, type: number}"), data_frame(lambda df: df.assign(price=df["price"] * 1e306))))
case("data-huge-unscaled", "dataset", CHECK, ["column 'age'", "normalization none", "float32 holds at most 3.4e+38", "set normalization zscore or minmax"], setup=both(edited("{name: age, type: number}", "{name: age, type: number, preprocessing: {normalization: none}}"), data_frame(lambda df: df.assign(age=df["age"] * 1e40))))
case("data-inf-in-target", "dataset", CHECK, ["column 'price'", "output_features", "infinite values"], setup=both(edited("{name: label, type: binary}", "{name: price, type: number}"), data_frame(set_col("price", np.inf, [7]))))
case("data-ragged-vector-target", "dataset", CHECK, ["column 'label' (output_features 'label', type vector)", "[2, 3] numbers", "set vector_size"], setup=both(edited("{name: label, type: binary}", "{name: label, type: vector}"), data_frame(lambda df: df.assign(label=["1 2"] * (len(df) - 1) + ["1 2 3"]))))
case("data-text-in-target", "dataset", CHECK, ["column 'price'", "non-numeric", "'expensive'"], setup=both(edited("{name: label, type: binary}", "{name: price, type: number}"), data_frame(set_col("price", "expensive", [2]))))
case("data-one-class", "dataset", CHECK, ["target column 'label'", "only one class"], setup=data_frame(set_col("label", True)))
case("data-binary-three-classes", "dataset", CHECK, ["declared binary but has 3 classes"], setup=data_frame(lambda df: df.assign(label=np.resize(["a", "b", "c"], len(df)))))
_DATES = [f"2021-03-{d:02d} 10:00" for d in range(1, 31)] * 2
_VECTORS = ["0.5 1 2"] * 60
case("data-not-a-date", "dataset", CHECK, ["column 'when'", "type date", "not dates", "'soon'", "row 4", "datetime_format"], setup=both(edited("{name: age, type: number}", "{name: when, type: date}"), data_frame(lambda df: df.assign(when=[*_DATES[:4], "soon", *_DATES[5:]]))))
case("data-vector-lengths", "dataset", CHECK, ["column 'emb'", "type vector", "[2, 3] numbers", "row 9 has 2", "vector_size"], setup=both(edited("{name: age, type: number}", "{name: emb, type: vector}"), data_frame(lambda df: df.assign(emb=[*_VECTORS[:9], "1 2", *_VECTORS[10:]]))))
case("data-vector-text", "dataset", CHECK, ["column 'emb'", "not vectors of finite numbers", "'1 two 3'"], setup=both(edited("{name: age, type: number}", "{name: emb, type: vector}"), data_frame(lambda df: df.assign(emb=[*_VECTORS[:2], "1 two 3", *_VECTORS[3:]]))))
case("data-drop-row-all", "dataset", CHECK, ["split", "empty", "drop_row"], setup=both(edited("{name: age, type: number}", "{name: age, type: number, preprocessing: {missing_value_strategy: drop_row}}"), data_frame(set_col("age", np.nan, slice(0, 59)))))
case("data-drop-row-validation", "dataset", CHECK, ["validation split is empty", "preprocessing.split.probabilities"], setup=both(edited("{name: age, type: number}", "{name: age, type: number, preprocessing: {missing_value_strategy: drop_row}}"), data_frame(lambda df: set_col("age", np.nan, _split(1))(df))))
case("data-no-finite-train-values", "dataset", CHECK, ["column 'age'", "no finite values in the training split"], setup=data_frame(lambda df: set_col("age", np.nan, _split(0))(df)))
case("data-tiny", "dataset", CHECK, ["split", "empty"], setup=data_frame(lambda df: df.iloc[:2]))
case("init-config-no-target", "dataset", ["init-config", "--dataset", "{data}", "--target", "nope"], ["--target 'nope' is not a column"])
case("init-config-empty", "dataset", ["init-config", "--dataset", "{data}", "--target", "label"], ["is empty"], setup=data_bytes(""))
case("evaluate-no-target", "dataset", EVAL, ["feature 'label' needs column 'label'"], needs_model=True, setup=data_frame(lambda df: df.drop(columns=["label"])))
case("predict-missing-input", "dataset", PREDICT, ["feature 'age' needs column 'age'"], needs_model=True, setup=data_frame(lambda df: df.drop(columns=["age"])))
case("evaluate-all-target-missing", "dataset", EVAL, ["column 'label'", "data.csv", "entirely empty"], needs_model=True, setup=data_frame(set_col("label", np.nan)))

# -- output paths -------------------------------------------------------------------------------
case("out-is-file", "output", [*TRAIN[:6], "{tmp}/afile", "--quiet"], ["is a file", "choose a directory"], setup=lambda ws: ws.write(ws.path("afile"), "x"))
case("out-parent-is-file", "output", [*TRAIN[:6], "{tmp}/afile/run", "--quiet"], ["is a file, not a directory"], setup=lambda ws: ws.write(ws.path("afile"), "x"))
case("out-not-empty", "output", TRAIN, ["already exists and is not empty"], setup=lambda ws: (os.makedirs(ws.out), ws.write(os.path.join(ws.out, "keep.txt"), "mine")))
case("out-finished-run", "output", TRAIN, ["already exists and is not empty"], setup=lambda ws: (os.makedirs(ws.out), ws.write(os.path.join(ws.out, "status.json"), json.dumps({"state": "finished"})), ws.write(os.path.join(ws.out, "config.json"), "{}")))
case("out-unwritable", "output", [*TRAIN[:6], "{tmp}/locked/run", "--quiet"], ["not writable"], setup=lambda ws: (os.makedirs(ws.path("locked")), os.chmod(ws.path("locked"), 0o500)), root_skips=True)
case("predict-out-parent-missing", "output", [*PREDICT[:5], "--output", "{tmp}/no/such/dir/p.csv"], ["does not exist", "create it"], needs_model=True)
case("predict-out-is-directory", "output", [*PREDICT[:5], "--output", "{tmp}/pdir.csv"], ["is a directory"], needs_model=True, setup=lambda ws: os.makedirs(ws.path("pdir.csv")))
case("predict-out-format", "output", [*PREDICT[:5], "--output", "{tmp}/p.xlsx"], ["use a file ending in .csv, .parquet or .jsonl"], needs_model=True)
case("init-config-out-parent-missing", "output", ["init-config", "--dataset", "{data}", "--target", "label", "--output", "{tmp}/no/cfg.yaml"], ["does not exist"])

# -- model directories -------------------------------------------------------------------------
case("model-missing", "model", [*EVAL[:2], "{tmp}/nomodel", *EVAL[3:]], ["does not exist", "<output-directory>/model"])
case("model-is-file", "model", EVAL, ["is a file", "model directory"], setup=lambda ws: ws.write(ws.model, "x"))
case("model-no-json", "model", EVAL, ["no model.json"], needs_model=True, setup=lambda ws: os.remove(os.path.join(ws.model, "model.json")))
case("model-json-garbage", "model", EVAL, ["not valid JSON", "damaged"], needs_model=True, setup=lambda ws: ws.write(os.path.join(ws.model, "model.json"), "{nope"))
case("model-json-truncated", "model", EVAL, ["not valid JSON"], needs_model=True, setup=lambda ws: _truncate(os.path.join(ws.model, "model.json")))
case("model-json-list", "model", EVAL, ["lacks its config", "damaged"], needs_model=True, setup=lambda ws: ws.write(os.path.join(ws.model, "model.json"), "[1, 2]"))
case("model-json-binary", "model", EVAL, ["not UTF-8"], needs_model=True, setup=lambda ws: ws.write(os.path.join(ws.model, "model.json"), b"\xff\xfe\x00garbage"))
case("model-json-bad-config", "model", EVAL, ["model.json config", "trainer.epochs"], needs_model=True, setup=lambda ws: _edit_model_json(ws, lambda m: m["config"]["trainer"].update(epochs=-1)))
case("model-json-bad-meta", "model", EVAL, ["preprocessing metadata does not fit", "damaged"], needs_model=True, setup=lambda ws: _edit_model_json(ws, lambda m: m["meta"].pop("city")))
case("model-json-future-format", "model", EVAL, ["format 99", "newer raylight"], needs_model=True, setup=lambda ws: _edit_model_json(ws, lambda m: m.update(format=99)))
case("model-weights-missing", "model", EVAL, ["weights file", "is missing"], needs_model=True, setup=lambda ws: os.remove(os.path.join(ws.model, "weights.safetensors")))
case("model-weights-truncated", "model", EVAL, ["weights file", "cannot be read"], needs_model=True, setup=lambda ws: _truncate(os.path.join(ws.model, "weights.safetensors")))
case("model-weights-garbage", "model", EVAL, ["weights file", "cannot be read"], needs_model=True, setup=lambda ws: ws.write(os.path.join(ws.model, "weights.safetensors"), os.urandom(300)))
case("model-weights-wrong-shape", "model", EVAL, ["do not fit the model", "size mismatch"], needs_model=True, setup=lambda ws: _edit_model_json(ws, lambda m: m["config"]["combiner"]["fc_layers"][0].update(output_size=9)))
case("predict-model-truncated-dir", "model", PREDICT, ["no model.json"], needs_model=True, setup=lambda ws: [os.remove(os.path.join(ws.model, n)) for n in os.listdir(ws.model)])

# -- resources, checked before the embedded Ray starts -----------------------------------------
case("resources-too-many-workers", "resources", TRAIN, ["backend.trainer asks for 4096 workers x CPU", "lower backend.trainer.num_workers"], setup=edited("backend: {type: local}", RAY_BACKEND.replace("num_workers: 1", "num_workers: 4096").rstrip()))
case("resources-gpu", "resources", TRAIN, ["x GPU", "use_gpu: false"], setup=edited("backend: {type: local}", "backend: {type: ray, trainer: {num_workers: 1, use_gpu: true}}"), tags=("no-gpu",))
case("resources-elastic-min", "resources", TRAIN, ["asks for 5000 workers", "min_workers"], setup=edited("backend: {type: local}", "backend: {type: ray, trainer: {min_workers: 5000, max_workers: 6000}}"))
case("resources-custom", "resources", TRAIN, ["'TPU'", "remove 'TPU'"], setup=edited("backend: {type: local}", "backend: {type: ray, trainer: {num_workers: 1, resources_per_worker: {CPU: 1, TPU: 1}}}"))
case("resources-cpus-per-worker", "resources", TRAIN, ["CPU: 512"], setup=edited("backend: {type: local}", "backend: {type: ray, trainer: {num_workers: 1, resources_per_worker: {CPU: 512}}}"))

# -- command-line usage ----------------------------------------------------------------------------
case("usage-unknown-option", "usage", [*CHECK, "--epochs", "3"], ["No such option", "--epochs"])
case("usage-missing-option", "usage", ["train", "--config", "{cfg}"], ["Missing option", "--dataset"])
case("usage-unknown-command", "usage", ["fit", "--config", "{cfg}"], ["No such command", "fit"])
case("usage-backend", "usage", [*TRAIN, "--backend", "spark"], ["backend must be local, ray or launcher", "'spark'"])
case("usage-init-config-no-target", "usage", ["init-config", "--dataset", "{data}"], ["Missing option", "--target"])

# -- odd but valid: these must work ---------------------------------------------------------------
case("odd-dotted-feature-names", "odd", TRAIN, ["model:"], code=0, writes=True, setup=both(
    config_text(BASE_CONFIG.replace("{name: age, type: number}", "{name: a.g.e, type: number}").replace("{name: city, type: category}", "{name: c.ity, type: category}")),
    data_frame(lambda df: df.rename(columns={"age": "a.g.e", "city": "c.ity"}))))
case("odd-reserved-feature-names", "odd", TRAIN, ["model:"], code=0, writes=True, setup=both(
    config_text(BASE_CONFIG.replace("{name: city, type: category}", "{name: items, type: category}").replace("{name: note, type: text}", "{name: ~note%2E, type: text}")),
    data_frame(lambda df: df.rename(columns={"city": "items", "note": "~note%2E"}))))
case("odd-unicode-names", "odd", TRAIN, ["model:"], code=0, writes=True, setup=both(
    config_text(BASE_CONFIG.replace("{name: city, type: category}", "{name: 'ville é', type: category}")),
    data_frame(lambda df: df.rename(columns={"city": "ville é"}))))
case("odd-null-sections", "odd", CHECK, ["ok:"], code=0, setup=both(
    edited("{name: age, type: number}", "{name: age, type: number, preprocessing: null}"),
    edited("{name: note, type: text}", "{name: note, type: text, encoder: null}"),
    edited("batch_size: 16", "batch_size: 16, optimizer: null, learning_rate_scheduler: null"),
    edited("{split: {type: random, probabilities: [0.7, 0.1, 0.2]}}", "{split: null}"),
    edited("backend: {type: local}", "backend: {type: local, trainer: null}")))
case("odd-parquet-directory", "odd", [*CHECK[:4], "{tmp}/parts.parquet"], ["ok:"], code=0, setup=lambda ws: _parquet_dir(ws))
case("odd-missing-values-everywhere", "odd", CHECK, ["ok:"], code=0, setup=data_frame(lambda df: df.mask(np.random.default_rng(1).random(df.shape) < 0.2).assign(label=base_frame()["label"])))
case("odd-diverging-lr", "odd", TRAIN, ["training diverged", "trainer.learning_rate"], code=1, writes=True, setup=both(
    edited("batch_size: 16", "batch_size: 16, learning_rate: 100, optimizer: {type: sgd, momentum: 0}"),
    edited("{name: age, type: number}", "{name: age, type: number, preprocessing: {normalization: none}}"),
    edited("{name: label, type: binary}", "{name: price, type: number}"),
    data_frame(lambda df: df.assign(age=df["age"] * 1e30))))


def _split(which: int) -> list[int]:
    """Row positions of the base frame's train (0), validation (1) or test (2) split."""
    from raylight.declarative.preprocess import split_rows

    return sorted(split_rows(len(base_frame()), (0.7, 0.1, 0.2), 42)[which].tolist())


def _parquet_bytes() -> bytes:
    import io

    buf = io.BytesIO()
    base_frame().to_parquet(buf)
    return buf.getvalue()


def _parquet_dir(ws: Workspace) -> None:
    os.makedirs(ws.path("parts.parquet"))
    df = base_frame()
    df.iloc[:30].to_parquet(ws.path("parts.parquet/part-0.parquet"))
    df.iloc[30:].to_parquet(ws.path("parts.parquet/part-1.parquet"))


def _truncate(path: str) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


def _edit_model_json(ws: Workspace, change: Callable[[dict[str, Any]], Any]) -> None:
    path = os.path.join(ws.model, "model.json")
    with open(path) as f:
        saved = json.load(f)
    change(saved)
    with open(path, "w") as f:
        json.dump(saved, f)


def train_reference_model(root: str) -> str:
    """A model trained on the base workspace (local backend), for the model cases."""
    from raylight.declarative import api
    from raylight.declarative.loading import load_config

    ws = Workspace(root)
    out = api.train(load_config(ws.cfg), ws.data, output_directory=ws.out, progress=False)
    return str(out["model_path"])


# -- the Python API ------------------------------------------------------------------------
@dataclass(frozen=True)
class ApiCase:
    id: str
    code: str  # run after API_PRELUDE; placeholders as for Case.argv
    error: str  # the exception's class name
    expect: list[str]
    fresh: bool = False  # run in a new interpreter: a process with no Ray of its own yet


API_PRELUDE = "import raylight\n\ndef loop(ctx):\n    pass\n\n"
FIT = "raylight.fit(loop, storage_path='{tmp}/runs', progress=False, "

API_CASES = [
    ApiCase("api-negative-workers", FIT + "num_workers=-1)", "ConfigError", ["num_workers: must be between 0", "got -1"]),
    ApiCase("api-huge-workers", FIT + "num_workers=10**9)", "ConfigError", ["num_workers: must be between 0", "100000"]),
    ApiCase("api-elastic-order", FIT + "num_workers=(3, 1))", "ConfigError", ["num_workers", "1 <= min <= max"]),
    ApiCase("api-resources-nan", FIT + "num_workers=1, resources_per_worker={'CPU': float('nan')})", "ConfigError", ["resources_per_worker.CPU", "finite"]),
    ApiCase("api-resources-negative", FIT + "num_workers=1, resources_per_worker={'CPU': -2})", "ConfigError", ["resources_per_worker", "between 0 and"]),
    ApiCase("api-placement", FIT + "num_workers=1, placement='RANDOM')", "ConfigError", ["placement: Input should be 'PACK'", "'RANDOM'"]),
    ApiCase("api-name-slash", FIT + "num_workers=0, name='a/b')", "ConfigError", ["name: must be a plain directory name", "'a/b'"]),
    ApiCase("api-name-control", FIT + "num_workers=0, name='a\\nb')", "ConfigError", ["name: must be a plain directory name", "control characters"]),
    ApiCase("api-name-dotdot", FIT + "num_workers=0, name='..')", "ConfigError", ["name: must be a plain directory name", "'..'"]),
    ApiCase("api-resume-no-name", FIT + "num_workers=0, resume=True)", "ConfigError", ["resume=True needs the name"]),
    ApiCase("api-max-failures", FIT + "num_workers=0, max_failures=-2)", "ConfigError", ["max_failures: Input should be greater than or equal to -1"]),
    ApiCase("api-too-many-workers", FIT + "num_workers=4096)", "InsufficientResourcesError", ["4096 workers x {CPU: 1}", "lower num_workers"]),
    ApiCase("api-custom-resource", FIT + "num_workers=1, resources_per_worker={'CPU': 1, 'TPU': 1})", "InsufficientResourcesError", ["TPU", "address="]),
    ApiCase("api-strict-spread", FIT + "num_workers=2, placement='STRICT_SPREAD')", "InsufficientResourcesError", ["STRICT_SPREAD needs 2 nodes"]),
    ApiCase("api-storage-is-file", "open('{tmp}/afile', 'w').close()\nraylight.fit(loop, storage_path='{tmp}/afile', num_workers=0, progress=False)", "ConfigError", ["afile", "is a file, not a directory", "storage_path"]),
    ApiCase("api-storage-kernel-refuses", "raylight.fit(loop, storage_path='/proc/raylight-none/runs', num_workers=0, progress=False)", "ConfigError",
            ["/proc/raylight-none/runs", "'/proc' does not take new directories", "storage_path"]),
    ApiCase("api-config-not-dict", FIT + "num_workers=0, config=[1, 2])", "TypeError", ["must be a dict", "list"]),
    ApiCase("api-loop-not-callable", "raylight.fit(5, num_workers=0, storage_path='{tmp}/runs')", "TypeError", ["train_loop must be callable"]),
    ApiCase("api-hang-timeout-inf", "raylight.FailureConfig(hang_timeout_s=float('inf'))", "ValidationError", ["hang_timeout_s", "finite"]),
    ApiCase("api-batch-bounds", "raylight.AdaptiveConfig(local_batch_bounds=(0, 4))", "ValidationError", ["local_batch_bounds", "needs 1 <= min <= max"]),
    ApiCase("api-strategy-unknown", FIT + "num_workers=1, strategy='zero3')", "ConfigError", ["strategy: must be one of ['ddp', 'fsdp', 'deepspeed', 'horovod']", "'zero3'"]),
    ApiCase("api-strategy-option", FIT + "num_workers=1, strategy=dict(name='fsdp', mixed_precision='fp8'))", "ConfigError", ["strategy.fsdp.mixed_precision", "'fp8'"]),
    ApiCase("api-fsdp-memory-storage", "raylight.fit(loop, storage_path='memory://runs', progress=False, num_workers=2, strategy='fsdp')", "ConfigError", ["memory://runs", "checkpoint shards", "checkpoint='full'"]),
    ApiCase("api-deepspeed-zero-typo", FIT + "num_workers=1, address='127.0.0.1:1', strategy=raylight.DeepSpeed(config={'zero_optimization': {'stage': 2, 'offload_optimiser': {'device': 'cpu'}}}))", "ConfigError",
            ["config zero_optimization.offload_optimiser: unknown DeepSpeed key", "did you mean 'offload_optimizer'?"]),
    ApiCase("api-deepspeed-nested-typo", FIT + "num_workers=1, address='127.0.0.1:1', strategy=raylight.DeepSpeed(config={'zero_optimization': {'offload_optimizer': {'device': 'cpu', 'nonsense': 1}}}))", "ConfigError",
            ["config zero_optimization.offload_optimizer.nonsense: unknown DeepSpeed key", "valid keys here:", "'pin_memory'"]),
    ApiCase("api-deepspeed-top-level-typo", FIT + "num_workers=1, address='127.0.0.1:1', strategy=raylight.DeepSpeed(config={'bogus_top': 1}))", "ConfigError",
            ["config bogus_top: unknown DeepSpeed key", "remove the key"]),
    ApiCase("api-deepspeed-batch-typo", FIT + "num_workers=1, address='127.0.0.1:1', strategy=raylight.DeepSpeed(config={'train_micro_batch_size': 4}))", "ConfigError",
            ["config train_micro_batch_size: unknown DeepSpeed key", "did you mean 'train_micro_batch_size_per_gpu'?"]),
    ApiCase("api-logger-dir-under-a-file", "open('{tmp}/afile', 'w').close()\n" + FIT + "num_workers=0, loggers=[{'type': 'tensorboard', 'log_dir': '{tmp}/afile/tb'}])", "ConfigError",
            ["the tensorboard logger's log_dir", "afile/tb", "is a file, not a directory"]),
    ApiCase("api-threads-zero", "raylight.ScalingConfig(threads_per_worker=0)", "ValidationError", ["threads_per_worker"]),
    ApiCase("api-load-model-missing", "raylight.load_model('{tmp}/nomodel')", "ConfigError", ["nomodel", "does not exist"]),
    ApiCase("api-unreachable-address", FIT + "num_workers=1, address='127.0.0.1:1')", "ClusterConnectionError", ["127.0.0.1:1", "connect_timeout_s"], fresh=True),
]


def run_api_case(case: ApiCase, ws: Workspace) -> tuple[str | None, str]:
    """Run ``case`` in this process (or a fresh one, ``case.fresh``): the class name and text
    of what it raised."""
    if case.fresh:
        import json
        import subprocess
        import sys

        wrapped = (
            "import json, sys\ntry:\n    exec(sys.argv[1], {'__name__': 'adversarial'})\n"
            "except Exception as exc:\n    print(json.dumps([type(exc).__name__, str(exc)]))\n"
            "else:\n    print(json.dumps([None, '']))\n"
        )
        out = subprocess.run([sys.executable, "-c", wrapped, API_PRELUDE + ws.fill(case.code)],
                             capture_output=True, text=True, timeout=120)
        name, message = json.loads(out.stdout.strip().splitlines()[-1])
        return name, message
    try:
        exec(API_PRELUDE + ws.fill(case.code), {"__name__": "adversarial"})
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None, ""
