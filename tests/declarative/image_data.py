"""Small generated images for the image feature's tests: coloured shapes on noise, written
as PNG files beside a dataset (no downloads)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
from PIL import Image

SHAPES = ("square", "hbar", "vbar")


def shape_image(shape: str, rng: np.random.Generator, size: int = 16) -> np.ndarray:
    """(size, size, 3) bytes: ``shape`` in a random colour at a random place, on noise."""
    image = rng.integers(0, 60, (size, size, 3)).astype(np.uint8)
    colour = rng.integers(120, 256, 3).astype(np.uint8)
    y, x = rng.integers(1, size - 7, 2)
    if shape == "square":
        image[y : y + 6, x : x + 6] = colour
    elif shape == "hbar":
        image[y + 2 : y + 4, 1 : size - 1] = colour
    else:
        image[1 : size - 1, x + 2 : x + 4] = colour
    return image


def write_images(directory: str, n: int, *, seed: int = 0, size: int = 16, sub: str = "images") -> pd.DataFrame:
    """``n`` PNG files under ``directory/sub``, and their rows: ``image`` (the path relative
    to ``directory``) and ``shape`` (the class)."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(directory, sub), exist_ok=True)
    rows = []
    for i in range(n):
        shape = SHAPES[i % len(SHAPES)]
        path = f"{sub}/{i:04d}.png"
        Image.fromarray(shape_image(shape, rng, size)).save(os.path.join(directory, path))
        rows.append({"image": path, "shape": shape})
    return pd.DataFrame(rows)
