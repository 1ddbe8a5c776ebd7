"""What an input feature type provides (``FeatureType``), and what the types share: the
config fields every feature has and the settings of an embedding encoder."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.base.exceptions import ConfigError
from raylight.config.base import ConfigModel

if TYPE_CHECKING:
    from torch import nn

# Upper bounds: far beyond any real use, low enough that a typo fails here and not as an
# allocation of terabytes.
MAX_WIDTH = 65_536  # units of a layer, size of an embedding
MAX_VOCAB = 10_000_000
PAD, UNK = "<PAD>", "<UNK>"  # the first entries of vocabularies


class FeatureModel(ConfigModel):
    """The fields of every feature, input or output; a type's model narrows ``type`` to
    its name (``Literal["number"]``) and adds its own sections."""

    name: str = Field(min_length=1, description="Feature name; also the column unless `column` is set.")
    column: str | None = Field(None, min_length=1, description="Dataset column; default: the name.")
    type: str = Field(description="The feature's type.")

    @property
    def col(self) -> str:
        return self.column or self.name


# -- fill_with_mode: a column's most common value in the training split ------------------
FILL_WITH_MODE = "fill_with_mode"


def fills_with_mode(feat: Any) -> bool:
    """Whether ``feat`` fills a missing value with its mode (a number target, fitted by
    number's functions too, has no preprocessing: its rows without a value are dropped)."""
    return getattr(getattr(feat, "preprocessing", None), "missing_value_strategy", None) == FILL_WITH_MODE


def mode(counts: pd.Series, feat: Any) -> Any:
    """The most common value given ``counts`` (value -> count; a value's counts from
    several blocks are added up), the smallest of those tied, so that the pandas and Ray
    Data processors agree; a ConfigError naming the feature where there is no value."""
    totals = counts.groupby(level=0).sum()
    if totals.empty:
        raise ConfigError(
            f"{feat.name!r}: preprocessing.missing_value_strategy fill_with_mode takes the most common value of the "
            f"training split, and column {feat.col!r} has none there; use fill_with_const (fill_value) or drop_row"
        )
    return min(totals.index[totals == totals.max()])


def modes_ray(train: Any, feats: list[Any], values: Callable[[pd.Series], pd.Series]) -> dict[str, Any]:
    """The mode of each of ``feats`` that fills with its mode (feature name -> value),
    in one pass over the split: each block's counts of ``values(column)`` (missing ones
    dropped), added up here."""
    wanted = [f for f in feats if fills_with_mode(f)]
    if not wanted:
        return {}
    cols = sorted({f.col for f in wanted})

    def counts(df: pd.DataFrame) -> pd.DataFrame:
        parts = [pd.DataFrame({"col": c, "value": vc.index, "n": vc.to_numpy()}) for c in cols for vc in [values(df[c]).dropna().value_counts()]]
        return pd.concat(parts, ignore_index=True)

    table = train.map_batches(counts, batch_format="pandas", batch_size=None).to_pandas()
    return {f.name: mode(table.loc[table["col"] == f.col].set_index("value")["n"], f) for f in wanted}


# -- the cells of a column, for the types whose value is more than one scalar -------------
def present(col: pd.Series) -> np.ndarray:
    """The cells that hold a value: not null and not blank text (Ray Data reads an empty
    CSV cell as ""); a list or array is a value, even an empty one."""
    return (col.notna() & (col.astype(str).str.strip() != "")).to_numpy()


def numbers(col: pd.Series, split: Callable[[str], list[str]]) -> tuple[list[np.ndarray | None], np.ndarray]:
    """Each cell as finite floats (text cut by ``split``, or a list as it is; None where
    absent or not such numbers), and the mask of present cells that are not."""
    values: list[np.ndarray | None] = []
    bad = np.zeros(len(col), dtype=bool)
    for r, (value, here) in enumerate(zip(col.astype(object), present(col), strict=True)):
        array = None
        if here:
            try:
                array = np.asarray(split(value) if isinstance(value, str) else value, dtype=np.float64)
            except (ValueError, TypeError):
                array = None
            if array is not None and not (array.ndim == 1 and np.isfinite(array).all()):
                array = None
            bad[r] = array is None
        values.append(array)
    return values, bad


def bad_summary(col: pd.Series, bad: np.ndarray) -> dict[str, Any]:
    """A block's bad cells for ``block_summary``: how many, and the first (for ``examples``)."""
    return {"bad": int(bad.sum()), "example": str(col[bad].iloc[0]) if bad.any() else ""}


def examples(summary: pd.DataFrame) -> list[str]:
    """Up to three bad cells from the blocks' ``bad_summary``, for an error message."""
    return [e for e in summary["example"] if e][:3]


def bad_cells(col: pd.Series, bad: np.ndarray) -> tuple[list[str], str]:
    """Up to three of the bad cells, and where the first is, for an error message."""
    rows = col[bad]
    return rows.astype(str).unique()[:3].tolist(), f" (first at row {rows.index[0]})"


class EmbeddingEncoder(ConfigModel):
    embedding_size: int = Field(32, ge=1, le=MAX_WIDTH, description="Size of category and text embeddings.")


class FeatureType(Protocol):
    """One input feature type. Each module of this package is one (modules satisfy a
    Protocol); ``FEATURES`` in ``__init__.py`` lists them. ``feat`` is a feature of the
    type (its ``Input``), or an output feature declared with the type's name for the
    checks; ``kind`` is ``input_features`` or ``output_features``, for messages."""

    INFER_RANK: int  # init-config asks the types' ``infers`` in this order, lowest first

    @property
    def Input(self) -> type[FeatureModel]:
        """Its config model: a FeatureModel with ``type: Literal["<name>"]``."""
        ...

    def infers(self, values: pd.Series) -> bool:
        """Whether init-config gives a column of these (non-null) values this type."""
        ...

    def check(self, col: pd.Series, feat: Any, kind: str) -> None:
        """Raise a ConfigError naming the column if it cannot hold this type (pandas)."""
        ...

    def block_summary(self, col: pd.Series, feat: Any) -> dict[str, Any]:
        """Ray Data: what ``check_blocks`` needs, from one block of ``feat``'s column."""
        ...

    def check_blocks(self, summary: pd.DataFrame, feat: Any, kind: str) -> None:
        """Ray Data: ``check``, from the ``block_summary`` of each block (one row each)."""
        ...

    def fit(self, col: pd.Series, feat: Any) -> dict[str, Any]:
        """Statistics and vocabularies (JSON-able) from the training split's column."""
        ...

    def fit_ray(self, train: Any, feats: list[Any]) -> dict[str, dict[str, Any]]:
        """``fit`` on a Ray Data split, for all features of the type at once, by name."""
        ...

    def transform(self, col: pd.Series, feat: Any, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
        """The model's input for each row, and the mask of rows kept (None: every row)."""
        ...

    def encoder(self, feat: Any, meta: dict[str, Any]) -> tuple[nn.Module, int]:
        """The torch module encoding ``transform``'s arrays, and its output width."""
        ...
