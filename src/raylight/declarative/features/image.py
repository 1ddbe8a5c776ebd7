"""Image features, as Ludwig's: each row the path of an image file (PNG, JPEG, anything
Pillow reads), relative to the dataset file's directory or absolute (an fsspec URI too).
The training split's first images fix the size and the channels (``height``, ``width``,
``num_channels`` or their inference, Ludwig's rules); every image is decoded once, at
preprocessing, converted to those channels, resized (``resize_method``) and kept as bytes
(rows x channels x height x width); the encoder scales them to [0, 1] (and, with
``standardize_image: imagenet1k``, by ImageNet's channel means and deviations).

Encoders that need no downloaded weights: ``stacked_cnn`` (Ludwig's default, Stacked2DCNN),
``mlp_mixer``, and ``resnet`` and ``vit`` built from scratch; their settings are in ``image_encoders.py``, their modules in
``models/image_encoders.py``. A file that is missing or cannot be read
is a ConfigError naming the column, the row and the file."""

from __future__ import annotations

import os
import posixpath
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator, model_validator

from raylight.base.exceptions import ConfigError
from raylight.config.base import ConfigModel
from raylight.declarative.features.base import FeatureModel, present
from raylight.declarative.features.image_encoders import ImageEncoder, encoder_with_type
from raylight.declarative.features.image_encoders import (
    retyped_encoder as retyped_encoder,  # a search over encoder types
)

if TYPE_CHECKING:
    from PIL import Image
    from torch import nn

MAX_SIDE = 4096  # pixels: far beyond what a model here trains on, low enough that a typo fails
# Pillow's modes by channels, and the channels of a file's own mode (Ludwig reads files
# with their channels; a palette image as RGB, or RGBA with transparency).
MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}
_BANDS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "F": 1, "LA": 2, "La": 2, "PA": 4, "RGBA": 4, "RGBa": 4}
SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


class ImagePreprocessing(ConfigModel):
    height: int | None = Field(None, ge=1, le=MAX_SIDE, description="Every image resized to this height; null: inferred (or the first image's).")
    width: int | None = Field(None, ge=1, le=MAX_SIDE, description="Every image resized to this width; null: inferred (or the first image's).")
    num_channels: Literal[1, 2, 3, 4] | None = Field(
        None, description="Every image converted to this many channels (1 grey, 2 grey and alpha, 3 RGB, 4 RGBA); null: inferred."
    )
    resize_method: Literal["interpolate", "crop_or_pad"] = Field(
        "interpolate", description="interpolate (bilinear, antialiased) or crop_or_pad (centred; padding is black)."
    )
    infer_image_dimensions: bool = Field(
        True,
        description="Without height and width: the mean size of the first infer_image_sample_size training images "
        "(at most the infer_image_max_*) and every image resized to it; false: the first image's, and every image must have it.",
    )
    infer_image_num_channels: bool = Field(
        True,
        description="Without num_channels: the channels most of the sampled images have (1, 2 or 4 where most do, else 3) and "
        "every image converted to them; false: the first image's, and every image must have them.",
    )
    infer_image_max_height: int = Field(256, ge=1, le=MAX_SIDE, description="The most an inferred height may be.")
    infer_image_max_width: int = Field(256, ge=1, le=MAX_SIDE, description="The most an inferred width may be.")
    infer_image_sample_size: int = Field(100, ge=1, le=100_000, description="The training images the inference reads.")
    requires_equal_dimensions: bool = Field(False, description="An inferred size is made square (the smaller side).")
    standardize_image: Literal["imagenet1k"] | None = Field(
        None, description="imagenet1k: each channel standardised by ImageNet's mean and deviation (3 channels); null: [0, 1]."
    )
    missing_value_strategy: Literal["fill_with_const", "drop_row"] = Field(
        "fill_with_const", description="A row without an image: a grey image of fill_value, or the row dropped."
    )
    fill_value: float | None = Field(None, ge=0, le=255, description="fill_with_const's pixel value, 0 to 255; null: 128 (Ludwig's grey).")

    @field_validator("missing_value_strategy", mode="before")
    @classmethod
    def _no_neighbours(cls, value: Any) -> Any:
        if value in ("bfill", "ffill"):
            raise ValueError(
                f"{value} (Ludwig's default for images) fills a missing image from a neighbouring row, which raylight does "
                "not do: use fill_with_const (a grey image of fill_value) or drop_row"
            )
        return value

    @model_validator(mode="after")
    def _size_together(self) -> ImagePreprocessing:
        if (self.height is None) != (self.width is None):
            given = "height" if self.width is None else "width"
            raise ValueError(f"{given} is set without {'width' if given == 'height' else 'height'}: give both, or neither to infer them")
        return self


class ImageInput(FeatureModel):
    type: Literal["image"]
    preprocessing: ImagePreprocessing = Field(default_factory=lambda: ImagePreprocessing(), description="Image preprocessing.")
    encoder: Annotated[ImageEncoder, Field(discriminator="type")] = Field(
        default_factory=lambda: encoder_with_type({}), description="Image encoder: stacked_cnn (default), mlp_mixer, resnet, vit."
    )

    @model_validator(mode="before")
    @classmethod
    def _stacked_cnn_by_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("encoder"), dict):
            return {**data, "encoder": encoder_with_type(data["encoder"])}
        return data


Input = ImageInput
INFER_RANK = 2  # before text and category: file names (as date's: no image file name reads as a date)


def infers(values: pd.Series) -> bool:
    """Strings that all end in an image file's suffix."""
    text = values.astype(str).str.strip().str.lower()
    return bool(values.map(lambda v: isinstance(v, str)).all()) and bool(text.str.endswith(SUFFIXES).all())


# -- where the files are -------------------------------------------------------------------
def _remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def resolve(col: pd.Series, base: str) -> pd.Series:
    """The column's relative paths joined to ``base`` (absolute paths and URIs kept)."""

    def joined(value: Any) -> Any:
        if not isinstance(value, str) or not value.strip():
            return value
        path = value.strip()
        if _remote(path) or os.path.isabs(path):
            return path
        return posixpath.join(base, path) if _remote(base) else os.path.join(base, path)

    return pd.Series([joined(v) for v in col.astype(object)], index=col.index, dtype=object)


def _exists(path: str) -> bool:
    if not _remote(path):
        return os.path.isfile(path.removeprefix("file://"))
    import fsspec

    fs, inner = fsspec.core.url_to_fs(path)
    return bool(fs.isfile(inner))


def _paths(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """The mask of present cells, and of present cells that name no file."""
    here = present(col)
    missing = np.zeros(len(col), dtype=bool)
    for r, (value, is_here) in enumerate(zip(col.astype(object), here, strict=True)):
        missing[r] = is_here and not (isinstance(value, str) and _exists(value.strip()))
    return here, missing


def _no_files(kind: str, feat: Any, examples: list[str], where: str = "") -> ConfigError:
    return ConfigError(
        f"column {feat.col!r} ({kind} {feat.name!r}, type image) names image files that do not exist, such as "
        f"{examples}{where}; a relative path starts at the dataset file's directory: fix the paths or add the files"
    )


def check(col: pd.Series, feat: Any, kind: str) -> None:
    _, missing = _paths(col)
    if missing.any():
        rows = col[missing]
        raise _no_files(kind, feat, rows.astype(str).unique()[:3].tolist(), f" (first at row {rows.index[0]})")


def block_summary(col: pd.Series, feat: Any) -> dict[str, Any]:
    _, missing = _paths(col)
    return {"bad": int(missing.sum()), "example": str(col[missing].iloc[0]) if missing.any() else ""}


def check_blocks(summary: pd.DataFrame, feat: Any, kind: str) -> None:
    if int(summary["bad"].sum()):
        raise _no_files(kind, feat, [e for e in summary["example"] if e][:3])


# -- reading one image -------------------------------------------------------------------
def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:  # Pillow comes with matplotlib, a dependency: only a broken install lacks it
        raise ImportError("image features decode files with Pillow: pip install 'raylight[declarative]' (or pillow)") from None
    return Image


def read_image(path: str, feat: Any, row: Any) -> Image.Image:
    """The decoded image at ``path``, in the mode of its channels; a ConfigError naming the
    column, the row and the file where it cannot be read."""
    import fsspec

    image_module = _pillow()
    try:
        with fsspec.open(path, "rb") as f:
            image = image_module.open(f)
            image.load()
    except (OSError, ValueError, image_module.DecompressionBombError) as exc:
        problem = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ConfigError(
            f"column {feat.col!r} (input_features {feat.name!r}, type image), row {row}: file {path!r} cannot be read as "
            f"an image ({problem}); replace it with a PNG or JPEG file, or leave the cell empty to treat it as missing"
        ) from None
    channels = channels_of(image)
    return image if image.mode == MODES[channels] else image.convert(MODES[channels])


def channels_of(image: Image.Image) -> int:
    """The channels of an image as Ludwig reads it: a palette as RGB (RGBA with transparency)."""
    if image.mode == "P":
        return 4 if "transparency" in image.info else 3
    return _BANDS.get(image.mode, 3)


def to_array(image: Image.Image, meta: dict[str, Any], feat: Any, path: str, row: Any) -> np.ndarray:
    """(channels, height, width) bytes: converted to the feature's channels and size."""
    channels, height, width = meta["num_channels"], meta["height"], meta["width"]
    if channels_of(image) != channels:
        if not meta["convert"]:
            raise _unlike_first(feat, path, row, f"{channels_of(image)} channels", f"{channels}", "num_channels")
        image = image.convert(MODES[channels])
    if image.size != (width, height):
        if not meta["resize"]:
            raise _unlike_first(feat, path, row, f"size {image.size[1]}x{image.size[0]}", f"{height}x{width}", "height and width")
        if feat.preprocessing.resize_method == "interpolate":
            image = image.resize((width, height), _pillow().Resampling.BILINEAR)
        else:
            return _crop_or_pad(_channels_first(image), height, width)
    return _channels_first(image)


def _channels_first(image: Image.Image) -> np.ndarray:
    array = np.asarray(image, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _crop_or_pad(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre ``height`` x ``width`` of ``array``, padded with zeros where it is smaller."""
    out = np.zeros((array.shape[0], height, width), dtype=np.uint8)
    sy, sx = max(0, (array.shape[1] - height) // 2), max(0, (array.shape[2] - width) // 2)
    dy, dx = max(0, (height - array.shape[1]) // 2), max(0, (width - array.shape[2]) // 2)
    h, w = min(height, array.shape[1]), min(width, array.shape[2])
    out[:, dy : dy + h, dx : dx + w] = array[:, sy : sy + h, sx : sx + w]
    return out


def _unlike_first(feat: Any, path: str, row: Any, found: str, expected: str, keys: str) -> ConfigError:
    return ConfigError(
        f"column {feat.col!r} (input_features {feat.name!r}, type image), row {row}: file {path!r} has {found}, unlike the "
        f"first training image ({expected}), and the inference is off; set preprocessing.{keys} to convert every image, or "
        "turn preprocessing.infer_image_dimensions / infer_image_num_channels on"
    )


# -- statistics: the size and the channels -------------------------------------------------
def _sample_size(p: ImagePreprocessing) -> int:
    explicit = p.height is not None and p.num_channels is not None
    return p.infer_image_sample_size if not explicit and (p.infer_image_dimensions or p.infer_image_num_channels) else 1


def fit(col: pd.Series, feat: ImageInput) -> dict[str, Any]:
    """Ludwig's rules, from the first images of the training split."""
    p = feat.preprocessing
    cells = col[present(col)].head(_sample_size(p))
    if cells.empty:
        raise ConfigError(f"column {feat.col!r} (input_features {feat.name!r}, type image) has no image in the training split")
    sample = [read_image(str(path).strip(), feat, row) for row, path in cells.items()]
    if p.height is not None and p.width is not None:
        height, width, resize = p.height, p.width, True
    elif p.infer_image_dimensions:
        height = min(round(float(np.mean([im.size[1] for im in sample]))), p.infer_image_max_height)
        width = min(round(float(np.mean([im.size[0] for im in sample]))), p.infer_image_max_width)
        if p.requires_equal_dimensions:
            height = width = min(height, width)
        resize = True
    else:
        width, height = sample[0].size
        resize = False
    channels: int
    if p.num_channels is not None:
        channels, convert = p.num_channels, True
    elif p.infer_image_num_channels:
        counts = pd.Series([channels_of(im) for im in sample]).value_counts()
        channels = next((c for c in (1, 2, 4) if counts.get(c, 0) > len(sample) / 2), 3)
        convert = True
    else:
        channels, convert = channels_of(sample[0]), False
    if p.standardize_image == "imagenet1k" and channels != 3:
        raise ConfigError(
            f"input_features {feat.name!r}: preprocessing.standardize_image imagenet1k standardises 3 channels (RGB), and the "
            f"images have {channels}; set num_channels: 3, or standardize_image: null"
        )
    return {"height": int(height), "width": int(width), "num_channels": int(channels), "resize": resize, "convert": convert}


def fit_ray(train: Any, feats: list[ImageInput]) -> dict[str, dict[str, Any]]:
    """``fit`` on the split's first rows (as many as the sample reads: the images are read here)."""
    out = {}
    for feat in feats:
        rows = train.select_columns([feat.col]).limit(_sample_size(feat.preprocessing) * 4).to_pandas()
        out[feat.name] = fit(rows[feat.col], feat)
    return out


def transform(col: pd.Series, feat: ImageInput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    """Each row's image as bytes (rows x channels x height x width)."""
    p = feat.preprocessing
    here = present(col)
    array = np.full((len(col), meta["num_channels"], meta["height"], meta["width"]), round(128 if p.fill_value is None else p.fill_value), dtype=np.uint8)
    for r, (row, value) in enumerate(col.items()):
        if here[r]:
            path = str(value).strip()
            array[r] = to_array(read_image(path, feat, row), meta, feat, path, row)
    return array, here if p.missing_value_strategy == "drop_row" else None


def encoder(feat: ImageInput, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    from raylight.declarative.models.image_encoders import image_encoder

    module = image_encoder(feat, meta)
    return module, module.width
