"""The dataset-level ``preprocessing:`` section of the declarative config: the split,
sampling and class balancing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from raylight.config.base import ConfigModel

DEFAULT_SPLIT, DEFAULT_SPLIT_COLUMN = (0.7, 0.1, 0.2), "split"


class SplitConfig(ConfigModel):
    type: Literal["random", "fixed", "stratify", "hash", "datetime"] = Field(
        "random",
        description="How rows are split into train/validation/test: random (probabilities); fixed "
        "(Ludwig's: column says, 0 train, 1 validation, 2 test); stratify (Ludwig's: probabilities "
        "within each value of column, so every split keeps its proportions); hash (Ludwig's: a "
        "hash of column's value picks the split with probabilities, so rows of one value, e.g. "
        "one user's, stay together, in every run and as the dataset grows); datetime (Ludwig's: "
        "the rows in order of column's dates, the earliest train, then validation, then test, by "
        "probabilities).",
    )
    probabilities: tuple[float, float, float] = Field(
        DEFAULT_SPLIT, description="random, stratify, hash, datetime: fractions for train, validation and test; they sum to 1."
    )
    column: str | None = Field(
        None,
        min_length=1,
        description="fixed: the column of each row's split (null: split); stratify: the column to "
        "stratify on; hash: the column whose values are hashed; datetime: the column of dates.",
    )

    @field_validator("probabilities")
    @classmethod
    def _check_sum(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(p < 0 for p in value) or abs(sum(value) - 1.0) > 1e-6 or value[0] == 0:
            raise ValueError(f"need three non-negative fractions summing to 1 with train > 0, got {list(value)}")
        return value

    @model_validator(mode="after")
    def _settings_of_its_type(self) -> SplitConfig:
        # by value, not by what was written: a rendered config (every default) loads again
        if self.type == "fixed" and self.probabilities != DEFAULT_SPLIT:
            raise ValueError("probabilities is a setting of types random, stratify, hash and datetime; a fixed split takes column")
        if self.type == "random" and self.column is not None:
            raise ValueError("column is a setting of types fixed, stratify, hash and datetime; a random split takes probabilities")
        if self.type == "stratify" and self.column is None:
            raise ValueError("stratify needs column: the column whose values every split keeps in proportion")
        if self.type == "hash" and self.column is None:
            raise ValueError("hash needs column: the column whose values decide each row's split (an id)")
        if self.type == "datetime" and self.column is None:
            raise ValueError("datetime needs column: the column of dates the rows are split in order of")
        return self

    @property
    def fixed_column(self) -> str | None:
        """The column a fixed split reads (None for the other types)."""
        return (self.column or DEFAULT_SPLIT_COLUMN) if self.type == "fixed" else None

    @property
    def row_column(self) -> str | None:
        """The column each row's split is a function of, by itself: a fixed or a hash split's
        (None for the random and stratified splits, which draw)."""
        return self.fixed_column if self.type == "fixed" else self.column if self.type == "hash" else None

    @property
    def coded_column(self) -> str | None:
        """The column that decides every row's split: a fixed or hash split's (row by row) or
        a datetime split's (by the order of all its dates); None for the splits that draw."""
        return self.column if self.type == "datetime" else self.row_column


class PreprocessingSection(ConfigModel):
    split: SplitConfig = Field(default_factory=lambda: SplitConfig(), description="Dataset split.")
    sample_ratio: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Train on this fraction of the dataset's rows, drawn at random (seeded by "
        "trainer.seed) before the split (Ludwig's key).",
    )
    sample_size: int | None = Field(
        None,
        ge=1,
        description="Train on at most this many of the dataset's rows, drawn at random before the "
        "split; not with sample_ratio < 1 (Ludwig's key).",
    )

    oversample_minority: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="Binary output: draw the training split's minority class (with replacement) "
        "to this ratio of the majority's rows (Ludwig's key; 1: as many).",
    )
    undersample_majority: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="Binary output: keep the training split's majority class down to the minority's "
        "rows / this ratio (Ludwig's key; 1: as many; never more than it has).",
    )

    @model_validator(mode="after")
    def _one_sample(self) -> PreprocessingSection:
        if self.sample_size is not None and self.sample_ratio < 1:
            raise ValueError("sample_size cannot be used with sample_ratio < 1; set one of them")
        if self.oversample_minority is not None and self.undersample_majority is not None:
            raise ValueError("oversample_minority and undersample_majority cannot both be set; set one of them")
        return self

    @property
    def balancing(self) -> bool:
        return self.oversample_minority is not None or self.undersample_majority is not None

    @property
    def sampling(self) -> bool:
        return self.sample_ratio < 1 or self.sample_size is not None

    def sampled(self, rows: int) -> int:
        """How many of a dataset's ``rows`` are trained on (split into train, validation and
        test): all of them unless sample_ratio or sample_size says fewer."""
        if self.sample_size is not None:
            return min(rows, self.sample_size)
        return rows if self.sample_ratio == 1 else round(rows * self.sample_ratio)
