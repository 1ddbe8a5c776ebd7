"""Image inputs and timeseries outputs on Ray Data (the session's 2-CPU local Ray): the
paths resolved from the dataset file's directory in the blocks, the same statistics and
arrays as the pandas processor's, and a missing file named from the blocks' check."""

import numpy as np
import pytest

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.loading import load_config
from tests.declarative.image_data import write_images
from tests.declarative.test_declarative_on_ray import column

# Two Ray Data preprocessings and a failing one: 50 s on the shared 2-core machine.
pytestmark = [pytest.mark.ray, pytest.mark.beside, pytest.mark.slow, pytest.mark.timeout(240)]

CONFIG = """\
input_features:
  - {name: image, type: image, preprocessing: {num_channels: 1}}
output_features:
  - {name: future, type: timeseries}
preprocessing: {split: {type: fixed}}
backend: {type: ray, processor: {type: ray_data}, trainer: {num_workers: 1}}
"""


def test_images_and_a_timeseries_target_on_ray_data_give_the_pandas_processor_s(ray_cluster, tmp_path):
    data_dir = tmp_path / "data"
    df = write_images(str(data_dir), 60)
    rng = np.random.default_rng(0)
    df["future"] = [" ".join(f"{v:.2f}" for v in rng.normal(size=rng.integers(1, 5))) for _ in range(60)]
    df.loc[5, "future"] = None  # dropped
    df["split"] = np.tile([0, 0, 0, 0, 1, 2], 10)
    df.to_csv(data_dir / "data.csv", index=False)
    (tmp_path / "config.yaml").write_text(CONFIG)
    config, data = load_config(str(tmp_path / "config.yaml")), str(data_dir / "data.csv")
    prepared = {p: api.prepare(config, data, processor=p, use_cache=False) for p in ("ray_data", "pandas")}
    assert prepared["ray_data"].meta == prepared["pandas"].meta
    assert prepared["pandas"].meta["image"] == {"height": 16, "width": 16, "num_channels": 1, "resize": True, "convert": True}
    assert prepared["pandas"].meta["future"] == {"length": 4}
    for split in ("train", "validation", "test"):
        rows = {
            p: sorted(
                np.concatenate([column(getattr(prepared[p], split), "image").reshape(-1, 256).astype(np.float64),
                                column(getattr(prepared[p], split), "future")], axis=1).tolist()
            )
            for p in prepared
        }
        assert rows["ray_data"] == rows["pandas"] and len(rows["pandas"]) > 0, split
    (data_dir / "images" / "0007.png").unlink()
    with pytest.raises(ConfigError, match=r"column 'image' \(input_features 'image', type image\) names image files that do not exist, such as \['.*0007.png'\]") as err:
        api.prepare(config, data, processor="ray_data", use_cache=False)
    assert type(err.value) is ConfigError  # found by the blocks' check, not raised inside a Ray task
