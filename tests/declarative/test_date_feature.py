"""Date input features (Ludwig's type): the nine numbers a date becomes, checked against
Ludwig's definition written with the standard library; the formats read, missing values,
errors; the embed and wave encoders; a model that needs the weekday learns it."""

from __future__ import annotations

import json
from datetime import date, datetime

import numpy as np
import pandas as pd
import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.features import date as date_feature
from raylight.declarative.features import infer_type
from raylight.declarative.loading import load_config
from tests.declarative_data import write

CONFIG = """\
input_features:
  - {name: when, type: date}
output_features:
  - {name: weekend, type: binary}
trainer: {epochs: 25, batch_size: 32, learning_rate: 0.01}
preprocessing: {split: {type: random, probabilities: [0.7, 0.1, 0.2]}}
backend: {type: local}
"""


def ludwig_vector(d: datetime) -> list[int]:
    """Ludwig's create_vector_from_datetime_obj, from its definition."""
    yearday = d.toordinal() - date(d.year, 1, 1).toordinal() + 1
    second_of_day = d.hour * 3600 + d.minute * 60 + d.second
    return [d.year, d.month, d.day, d.weekday(), yearday, d.hour, d.minute, d.second, second_of_day]


def feature(**preprocessing):
    return date_feature.DateInput(name="when", type="date", preprocessing=preprocessing)


def test_a_date_becomes_ludwig_s_nine_numbers():
    rng = np.random.default_rng(0)
    stamps = [datetime(1990, 1, 1) + pd.Timedelta(seconds=int(s)) for s in rng.integers(0, 40 * 365 * 86400, 200)]
    stamps += [datetime(2020, 2, 29, 23, 59, 59), datetime(2021, 12, 31), datetime(2013, 2, 26, 1, 57)]
    col = pd.Series([s.strftime("%Y-%m-%d %H:%M:%S") for s in stamps])
    feat = feature()
    array, keep = date_feature.transform(col, feat, date_feature.fit(col, feat))
    assert keep is None and array.dtype == np.int64
    assert array.tolist() == [ludwig_vector(s) for s in stamps]


def test_formats_zones_and_timestamps_are_read_as_written():
    # A zone keeps the wall-clock time (Ludwig's parser), also where the zones differ.
    zoned = pd.Series(["2020-03-01T10:00:00+02:00", "2020-03-01T10:30:00-05:00", "2020-03-01 10:15"])
    stamps, bad = date_feature.parse(zoned, None)
    assert not bad.any() and stamps.dt.hour.tolist() == [10, 10, 10] and stamps.dt.minute.tolist() == [0, 30, 15]
    # Numbers are POSIX timestamps in seconds, or in ms/us/ns by their digits (Ludwig's).
    t = 1_600_000_000
    for col in (pd.Series([t, t * 1000]), pd.Series([str(t), str(t * 1_000_000)])):
        stamps, bad = date_feature.parse(col, None)
        assert not bad.any() and stamps.tolist() == [pd.Timestamp(t, unit="s")] * 2
    # A datetime column as it is; a datetime_format decides day and month.
    stamps, _ = date_feature.parse(pd.Series(pd.to_datetime(["2021-06-01 08:00"])).dt.tz_localize("Asia/Tokyo"), None)
    assert stamps.tolist() == [pd.Timestamp("2021-06-01 08:00")]
    stamps, _ = date_feature.parse(pd.Series(["05/01/2020"]), "%d/%m/%Y")
    assert stamps.tolist() == [pd.Timestamp("2020-01-05")]


def test_missing_dates_are_filled_or_their_rows_dropped():
    col = pd.Series(["2020-01-01", None, "2020-01-03", ""])
    feat = feature()
    meta = date_feature.fit(col, feat)
    assert meta["mean_date"] == "2020-01-02T00:00:00" and meta["year_mean"] == 2020 and meta["year_std"] == 1.0
    array, keep = date_feature.transform(col, feat, meta)
    assert keep is None and array[1].tolist() == array[3].tolist() == ludwig_vector(datetime(2020, 1, 2))
    array, _ = date_feature.transform(col, feature(fill_value="1999-12-31 12:00"), meta)
    assert array[1].tolist() == ludwig_vector(datetime(1999, 12, 31, 12))
    array, keep = date_feature.transform(col, feature(missing_value_strategy="drop_row"), meta)
    assert keep.tolist() == [True, False, True, False]


def test_bad_dates_and_settings_name_the_column_or_key(tmp_path):
    with pytest.raises(ConfigError, match=r"column 'when' \(input_features 'when', type date\) holds values that are not dates, "
                       r"such as \['soon'\] \(first at row 2\); give the column's format as preprocessing.datetime_format"):
        date_feature.check(pd.Series(["2020-01-01", None, "soon"]), feature(), "input_features")
    with pytest.raises(ConfigError, match="such as \\['2020-01-05'\\]"):  # not in the format given
        date_feature.check(pd.Series(["05/01/2020", "2020-01-05"]), feature(datetime_format="%d/%m/%Y"), "input_features")
    with pytest.raises(ConfigError, match="has no dates in the training split"):
        date_feature.fit(pd.Series([None, None], dtype=object), feature())
    cfg, _ = write(tmp_path, df=pd.DataFrame({"when": ["2020-01-01"], "weekend": [True]}), config=CONFIG)
    with pytest.raises(ConfigError, match=r"input_features\.0\.preprocessing\.fill_value: .*'tomorrow' is not a date"):
        load_config(cfg, ["input_features.0.preprocessing.fill_value=tomorrow"])
    with pytest.raises(ConfigError, match=r"input_features\.0\.encoder\.type: Input should be 'embed' or 'wave'"):
        load_config(cfg, ["input_features.0.encoder.type=dense"])


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (pd.Series(["2020-01-05", "2021-11-30", "1999-02-01"]), "date"),  # two values would be binary
        (pd.Series(["Jan 5, 2020 10:00 am", "Feb 7, 2021 9:30 pm", "Mar 1, 2022 1:00 am"]), "date"),  # not text
        (pd.Series(pd.to_datetime(["2020-01-05", "2020-01-06", "2021-01-01"])), "date"),
        (pd.Series(["3-4", "5-6", "7-8"]), "category"),  # no year
        (pd.Series(["May", "June", "July"]), "category"),
        (pd.Series(["2020-01-05", "later", "2021-01-01"]), "category"),
    ],
)
def test_init_config_gives_date_columns_the_date_type(values, expected):
    assert infer_type(values) == expected


@pytest.mark.parametrize(
    ("encoder", "width"),
    [({}, 1 + 7 * 10 + 1), ({"embedding_size": 4}, 1 + 7 * 4 + 1), ({"type": "wave"}, 9),
     ({"type": "wave", "num_fc_layers": 2, "output_size": 16}, 16), ({"fc_layers": [{"output_size": 5}]}, 5)],
)
def test_embed_and_wave_encoders_are_ludwig_s_widths(encoder, width):
    feat = date_feature.DateInput(name="when", type="date", encoder=encoder)
    module, size = date_feature.encoder(feat, {"year_mean": 2020.0, "year_std": 2.0})
    x = torch.tensor([ludwig_vector(datetime(2020, 12, 31, 23, 59, 59)), ludwig_vector(datetime(2019, 1, 1))])
    out = module(x)
    assert size == width and out.shape == (2, width) and torch.isfinite(out).all()
    names = {n.split(".")[1] for n, _ in module.named_parameters() if n.startswith("embed.")}
    assert names == (set() if feat.encoder.type == "wave" else {"month", "day", "weekday", "yearday", "hour", "minute", "second"})


def test_a_model_learns_the_weekend_from_the_date_and_predicts_it(tmp_path):
    """The target is whether the date is a Saturday or Sunday (29% of the rows): only the
    weekday's embedding tells them apart, and the trained model does."""
    days = pd.date_range("2018-01-01", periods=700, freq="31h")
    df = pd.DataFrame({"when": days.strftime("%Y-%m-%d %H:%M"), "weekend": days.day_of_week >= 5})
    cfg, data = write(tmp_path, df=df, config=CONFIG)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["accuracy"] >= 0.95, out["evaluation"]
    saved = json.loads((tmp_path / "run" / "model" / "model.json").read_text())
    assert saved["meta"]["when"]["year_mean"] > 2018
    from raylight.declarative.train import load_model

    model = load_model(out["model_path"])
    new = pd.DataFrame({"when": ["2024-06-01 12:00", "2024-06-03 12:00", None]})  # Saturday, Monday, missing
    assert model.predict(new)["weekend_predictions"].tolist()[:2] == [True, False]


def test_ludwig_s_rendered_date_config_trains_as_written(tmp_path):
    """tests/data/ludwig/date_wave.yaml, as Ludwig 0.17.10 wrote it: the wave encoder and
    its layer, the format, drop_row (the row with no date is not trained on)."""
    from pathlib import Path

    rendered = Path(__file__).parent.parent / "data" / "ludwig" / "date_wave.yaml"
    config = load_config(str(rendered), ["trainer.epochs=2"])
    enc = config.input_features[0].encoder
    assert (enc.type, [fc.output_size for fc in enc.fc_layers], enc.dropout) == ("wave", [16], 0.1)
    days = pd.date_range("2018-01-01", periods=200, freq="31h")
    df = pd.DataFrame({"when": days.strftime("%Y-%m-%d %H:%M"), "x": np.arange(200) % 7, "y": days.day_of_week >= 5})
    df.loc[5, "when"] = None
    _, data = write(tmp_path, df=df)
    prepared = api.prepare(config, data)
    assert sum(len(s["y"]) for s in (prepared.train, prepared.validation, prepared.test)) == 199
    out = api.train(config, data, output_directory=str(tmp_path / "run"), progress=False)
    from raylight.declarative.train import load_model

    assert load_model(out["model_path"]).model.embeddings["when"].width == 16
