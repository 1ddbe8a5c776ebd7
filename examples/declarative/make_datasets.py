"""Write the example datasets from data that ships with scikit-learn (no download).

Run:  python examples/declarative/make_datasets.py [OUTPUT_DIR]   (default: examples/declarative/data)
Needs: pip install 'raylight[declarative,examples]'

- breast_cancer.parquet: 569 tumours, 30 numeric measurements, binary `diagnosis`
- wine.csv: 178 wines, 13 numeric measurements, 3-class `cultivar`
- reviews.jsonl: generated reviews with number, category, binary and text columns
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pandas as pd
from sklearn.datasets import load_breast_cancer, load_wine


def write_all(out: str) -> dict[str, str]:
    os.makedirs(out, exist_ok=True)
    cancer = load_breast_cancer(as_frame=True)
    bc = cancer.frame.rename(columns=lambda c: c.replace(" ", "_"))
    bc["diagnosis"] = np.where(cancer.target == 1, "benign", "malignant")
    bc = bc.drop(columns=["target"])
    wine = load_wine(as_frame=True)
    wn = wine.frame.rename(columns={"target": "cultivar", "od280/od315_of_diluted_wines": "od280_od315"})
    wn["cultivar"] = wn["cultivar"].map({0: "barolo", 1: "grignolino", 2: "barbera"})
    rng = np.random.default_rng(7)
    n = 1200
    words = np.array(["great", "bad", "ok", "excellent", "poor", "fine", "slow", "fast"])
    review = [" ".join(rng.choice(words, 6)) for _ in range(n)]
    price = rng.gamma(2.0, 20.0, n)
    store = rng.choice(["north", "south", "east", "west"], n)
    member = rng.choice([True, False], n)
    sentiment = np.array([sum(r.count(w) for w in ("great", "excellent", "fast")) - sum(r.count(w) for w in ("bad", "poor", "slow")) for r in review])
    score = 0.8 * sentiment - 0.02 * (price - 40) + 0.7 * member + (store == "north") + rng.normal(0, 0.5, n)
    rv = pd.DataFrame({"price": price, "store": store, "member": member, "review": review, "recommend": score > 0})
    paths = {
        "breast_cancer": os.path.join(out, "breast_cancer.parquet"),
        "wine": os.path.join(out, "wine.csv"),
        "reviews": os.path.join(out, "reviews.jsonl"),
    }
    bc.to_parquet(paths["breast_cancer"], index=False)
    wn.to_csv(paths["wine"], index=False)
    rv.to_json(paths["reviews"], orient="records", lines=True)
    return paths


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    for name, path in write_all(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "data")).items():
        print(f"{name}: {path}")
