"""A small mixed-type dataset for the declarative tests, generated (no download)."""

from __future__ import annotations

import numpy as np
import pandas as pd

CONFIG = """\
input_features:
  - {name: age, type: number}
  - {name: workclass, type: category}
  - {name: smoker, type: binary}
  - {name: review, type: text}
output_features:
  - {name: income, type: binary}
combiner: {type: concat, fc_layers: [{output_size: 32}], dropout: 0.1}
trainer: {epochs: 6, batch_size: 32, learning_rate: auto, optimizer: {type: adam}, early_stop: 5}
preprocessing: {split: {type: random, probabilities: [0.7, 0.1, 0.2]}}
backend: {type: local}
"""


# Reviews whose target is the order of two of their words (negations): a text encoder's
# config goes in for %s.
ORDER = """\
input_features:
  - name: review
    type: text
    preprocessing: {max_sequence_length: 8}
    encoder: %s
output_features:
  - {name: y, type: binary}
trainer: {epochs: 20, batch_size: 32, learning_rate: 0.01}
preprocessing: {split: {type: random, probabilities: [0.7, 0.1, 0.2]}}
backend: {type: local}
"""


def negations(n: int, seed: int = 0) -> pd.DataFrame:
    """Each review holds "not" and "good" once among 1 to 4 other words; the target is
    whether "not" comes first: the same tokens either way, so a bag of embeddings can do
    no better than chance, and an encoder that reads word order can."""
    rng = np.random.default_rng(seed)
    rows, y = [], []
    for _ in range(n):
        words = list(rng.choice(["the", "film", "was", "very", "plot"], int(rng.integers(1, 5))))
        negated = bool(rng.integers(2))
        at = int(rng.integers(0, len(words) + 1))
        rows.append(" ".join(words[:at] + (["not", "good"] if negated else ["good", "not"]) + words[at:]))
        y.append(negated)
    return pd.DataFrame({"review": rows, "y": y})


def frame(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.normal(40, 10, n)
    work = rng.choice(["private", "gov", "self"], n)
    smoker = rng.choice([True, False], n)
    words = np.array(["great", "bad", "ok", "excellent", "poor", "fine"])
    review = [" ".join(rng.choice(words, 5)) for _ in range(n)]
    sentiment = np.array([r.count("great") + r.count("excellent") - r.count("bad") - r.count("poor") for r in review])
    score = (age - 40) / 10 + (work == "gov") - 0.5 * smoker + 0.7 * sentiment
    df = pd.DataFrame({"age": age, "workclass": work, "smoker": smoker, "review": review, "income": score + rng.normal(0, 0.3, n) > 0})
    df.loc[::37, "age"] = np.nan
    return df


def write(tmp_path, *, fmt: str = "csv", df: pd.DataFrame | None = None, config: str = CONFIG) -> tuple[str, str]:
    df = frame() if df is None else df
    data = str(tmp_path / f"data.{fmt}")
    if fmt == "csv":
        df.to_csv(data, index=False)
    elif fmt == "parquet":
        df.to_parquet(data)
    else:
        df.to_json(data, orient="records", lines=True)
    cfg = str(tmp_path / "config.yaml")
    with open(cfg, "w") as f:
        f.write(config)
    return cfg, data


# Three targets of the same inputs (Ludwig's multi-task model): a binary, a number whose
# loss Ludwig's loss.weight halves, and a category.
MULTI = """\
input_features:
  - {name: a, type: number}
  - {name: b, type: number}
  - {name: c, type: category}
output_features:
  - {name: y, type: binary}
  - {name: z, type: number, loss: {weight: 0.5}}
  - {name: k, type: category}
combiner: {type: concat}
trainer: {epochs: 15, batch_size: 32, learning_rate: 0.01, early_stop: -1}
preprocessing: {split: {type: random, probabilities: [0.7, 0.1, 0.2]}}
backend: {type: local}
"""


def multi(n: int = 600, seed: int = 0) -> pd.DataFrame:
    """Inputs a, b (numbers) and c (p, q or r); y = a + b > 0, z = 2a - b + 3 [c = q] and
    k, where b lies (lo, mid, hi): each target learnable from the inputs."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(size=n)
    c = rng.choice(["p", "q", "r"], n)
    return pd.DataFrame({
        "a": a, "b": b, "c": c, "y": a + b > 0, "z": 2 * a - b + 3.0 * (c == "q"),
        "k": np.where(b > 0.5, "hi", np.where(b < -0.5, "lo", "mid")),
    })
