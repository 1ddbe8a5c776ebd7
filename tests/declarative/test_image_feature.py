"""Image input features (Ludwig's image type): the size and channels Ludwig's rules give,
the arrays, paths relative to the dataset file, the errors for missing and unreadable
files, the encoders' shapes, and a stacked_cnn that learns shapes from generated PNGs
(trained, then predicting from a dataset in another directory)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.features import image, infer_type
from raylight.declarative.loading import load_config
from raylight.declarative.preprocess import resolve_files
from tests.declarative.image_data import write_images


def feat(encoder=None, **preprocessing):
    return image.ImageInput(name="img", type="image", preprocessing=preprocessing, **({"encoder": encoder} if encoder else {}))


def save(path, array) -> str:
    Image.fromarray(np.asarray(array, dtype=np.uint8)).save(path)
    return str(path)


def test_the_size_is_the_sample_s_mean_capped_and_the_channels_most_images_have(tmp_path):
    paths = [
        save(tmp_path / "a.png", np.zeros((10, 20, 3))),
        save(tmp_path / "b.png", np.zeros((20, 40, 3))),
        save(tmp_path / "c.png", np.zeros((30, 30))),  # grey
    ]
    col = pd.Series(paths)
    assert image.fit(col, feat()) == {"height": 20, "width": 30, "num_channels": 3, "resize": True, "convert": True}
    assert image.fit(col, feat(infer_image_max_width=25, requires_equal_dimensions=True))["height"] == 20  # min(20, 25)
    assert image.fit(col, feat(infer_image_sample_size=1))["width"] == 20  # the first image only
    grey = pd.Series([paths[2], paths[2], paths[0]])
    assert image.fit(grey, feat())["num_channels"] == 1  # most are grey
    given = image.fit(col, feat(height=8, width=6, num_channels=4))
    assert (given["height"], given["width"], given["num_channels"]) == (8, 6, 4)
    first = image.fit(col, feat(infer_image_dimensions=False, infer_image_num_channels=False))
    assert first == {"height": 10, "width": 20, "num_channels": 3, "resize": False, "convert": False}


def test_images_are_converted_and_resized_to_bytes_channels_first(tmp_path):
    rgb = np.zeros((4, 6, 3), dtype=np.uint8)
    rgb[:, :, 0] = 200  # red
    rgb[1, 2] = (0, 50, 100)
    col = pd.Series([save(tmp_path / "rgb.png", rgb), None, save(tmp_path / "grey.png", np.full((2, 2), 77))])
    f = feat(height=4, width=6, num_channels=3)
    array, keep = image.transform(col, f, image.fit(col, f))
    assert array.dtype == np.uint8 and array.shape == (3, 3, 4, 6) and keep is None
    assert array[0, :, 1, 2].tolist() == [0, 50, 100] and array[0, 0, 0, 0] == 200
    assert (array[1] == 128).all()  # a missing image: grey (fill_value)
    assert (array[2] == 77).all()  # grey to RGB, and 2x2 interpolated up to 4x6
    grey = feat(height=4, width=6, num_channels=1, missing_value_strategy="drop_row")
    array, keep = image.transform(col, grey, image.fit(col, grey))
    assert array.shape == (3, 1, 4, 6) and keep.tolist() == [True, False, True]
    # crop_or_pad: the centre, padded with black
    cropped = feat(height=2, width=8, num_channels=3, resize_method="crop_or_pad")
    array, _ = image.transform(col.iloc[:1], cropped, image.fit(col.iloc[:1], cropped))
    # rows 1 and 2 of 4, every column of 6 one to the right: pixel (1, 2) is at (0, 3)
    assert array[0, 0].tolist() == [[0, 200, 200, 0, 200, 200, 200, 0], [0, 200, 200, 200, 200, 200, 200, 0]]
    assert array[0, :, 0, 3].tolist() == [0, 50, 100]


def test_images_unlike_the_first_are_refused_when_inference_is_off(tmp_path):
    col = pd.Series([save(tmp_path / "a.png", np.zeros((4, 4, 3))), save(tmp_path / "b.png", np.zeros((5, 4, 3)))])
    f = feat(infer_image_dimensions=False)
    with pytest.raises(ConfigError, match=r"column 'img' .* row 1: file '.*b.png' has size 5x4, unlike the first training image \(4x4\)"):
        image.transform(col, f, image.fit(col, f))


def test_missing_and_unreadable_files_name_the_column_the_row_and_the_file(tmp_path):
    good = save(tmp_path / "a.png", np.zeros((4, 4, 3)))
    col = pd.Series([good, str(tmp_path / "nowhere.png")])
    with pytest.raises(ConfigError, match=r"column 'img' \(input_features 'img', type image\) names image files that do not exist, "
                       r"such as \['.*nowhere.png'\] \(first at row 1\); a relative path starts at the dataset file's directory"):
        image.check(col, feat(), "input_features")
    assert image.block_summary(col, feat()) == {"bad": 1, "example": str(tmp_path / "nowhere.png")}
    (tmp_path / "broken.png").write_bytes(b"not a png")
    col = pd.Series([good, str(tmp_path / "broken.png")])
    image.check(col, feat(), "input_features")  # it exists
    with pytest.raises(ConfigError, match=r"column 'img' .*, row 1: file '.*broken.png' cannot be read as an image"):
        image.transform(col, feat(), image.fit(col.iloc[:1], feat()))


def test_relative_paths_start_at_the_dataset_file_s_directory(tmp_path):
    config = ModelConfig.model_validate({"input_features": [{"name": "img", "type": "image"}], "output_features": [{"name": "y", "type": "binary"}]})
    df = pd.DataFrame({"img": ["images/a.png", str(tmp_path / "b.png"), None, "s3://bucket/c.png"], "y": [1, 0, 1, 0]})
    resolved = resolve_files(df, config, str(tmp_path / "data" / "train.csv"))["img"].tolist()
    assert resolved[0] == os.path.join(str(tmp_path / "data"), "images/a.png")
    assert resolved[1] == str(tmp_path / "b.png") and pd.isna(resolved[2]) and resolved[3] == "s3://bucket/c.png"
    assert resolve_files(df, config, "s3://bucket/sets/train.csv")["img"][0] == "s3://bucket/sets/images/a.png"


def test_settings_that_cannot_work_are_config_errors():
    with pytest.raises(ValueError, match="height is set without width"):
        feat(height=8)
    with pytest.raises(ValueError, match=r"bfill \(Ludwig's default for images\) fills a missing image from a neighbouring row.*use fill_with_const"):
        feat(missing_value_strategy="bfill")
    with pytest.raises(ValueError, match=r"stacked_cnn.*mlp_mixer"):  # Ludwig's torchvision encoders need their weights
        feat(encoder={"type": "convnext"})
    meta = {"height": 8, "width": 8, "num_channels": 3}
    with pytest.raises(ConfigError, match=r"encoder.patch_size 3 must divide the images' height and width \(8x8\)"):
        image.encoder(feat({"type": "mlp_mixer", "patch_size": 3}), meta)
    with pytest.raises(ConfigError, match=r"encoder.conv_layers.1 cannot take the \(4, 3, 3\)"):
        image.encoder(feat({"conv_layers": [{"out_channels": 4}, {"kernel_size": 5}], "pool_kernel_size": None}), {**meta, "height": 5, "width": 5})


def test_stacked_cnn_is_ludwig_s_two_layers_then_one_of_128_and_takes_its_keys():
    f = feat()
    enc = f.encoder
    assert [(c.out_channels, c.kernel_size, c.padding, c.pool_kernel_size) for c in enc.conv_layers] == [(32, 3, "valid", 2), (64, 3, "valid", 2)]
    assert [layer.output_size for layer in enc.fc_layers] == [128]
    module, width = image.encoder(f, {"height": 16, "width": 16, "num_channels": 3})
    x = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    assert width == 128 and module(x).shape == (2, 128)
    assert module.inner.fc[0].in_features == 64 * 2 * 2  # 16 -> 14 -> 7 -> 5 -> 2
    custom = feat({"num_conv_layers": 3, "out_channels": 4, "padding": "same", "conv_norm": "batch", "num_fc_layers": 2, "output_size": 10})
    assert [c.out_channels for c in custom.encoder.conv_layers] == [4, 4, 4] and custom.encoder.conv_layers[0].norm == "batch"
    module, width = image.encoder(custom, {"height": 16, "width": 16, "num_channels": 1})
    assert width == 10 and module(torch.zeros(3, 1, 16, 16, dtype=torch.uint8)).shape == (3, 10)
    mixer, width = image.encoder(feat({"type": "mlp_mixer", "patch_size": 4, "embed_size": 8, "token_size": 16, "channel_dim": 8,
                                       "num_layers": 2}), {"height": 8, "width": 12, "num_channels": 3})
    assert width == 8 and mixer(torch.zeros(2, 3, 8, 12, dtype=torch.uint8)).shape == (2, 8)


def test_init_config_gives_image_file_names_the_image_type():
    assert infer_type(pd.Series(["a/1.png", "b/2.JPG", "c.jpeg"])) == "image"
    assert infer_type(pd.Series(["a.png", "not an image"])) != "image"


CONFIG = """\
input_features:
  - name: image
    type: image
    encoder: {conv_layers: [{out_channels: 8}, {out_channels: 16}], output_size: 32}
output_features:
  - {name: shape, type: category}
trainer: {epochs: 6, batch_size: 32, learning_rate: 0.003}
preprocessing: {split: {type: random, probabilities: [0.7, 0.1, 0.2]}}
backend: {type: local}
"""


def test_a_stacked_cnn_learns_shapes_from_png_files_and_predicts_elsewhere(tmp_path):
    """Squares, horizontal and vertical bars in random colours and places: the model
    learns them from files named relative to the dataset (the test runs elsewhere), and
    predicts a dataset in another directory, whose relative paths start there."""
    train_dir, other = tmp_path / "train", tmp_path / "other"
    df = write_images(str(train_dir), 240)
    df.to_csv(train_dir / "data.csv", index=False)
    (tmp_path / "config.yaml").write_text(CONFIG)
    out = api.train(load_config(str(tmp_path / "config.yaml")), str(train_dir / "data.csv"), output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["accuracy"] >= 0.9, out["evaluation"]
    fresh = write_images(str(other), 30, seed=5, sub="pics")
    fresh.drop(columns="shape").to_csv(other / "new.csv", index=False)
    predicted = api.predict(out["model_path"], str(other / "new.csv"), None)
    assert (predicted["shape_predictions"] == fresh["shape"]).mean() >= 0.9


# An image input and a timeseries output with every key Ludwig 0.17's schema gives them, at
# its defaults (written from ludwig/schema/features/preprocessing/image.py and
# schema/encoders/image/base.py; but missing_value_strategy, Ludwig's bfill, not available).
LUDWIG_STYLE = """\
input_features:
  - name: image
    type: image
    column: image
    proc_column: image_mZFLky
    active: true
    tied: null
    augmentation: false
    preprocessing:
      missing_value_strategy: fill_with_const
      fill_value: null
      computed_fill_value: null
      height: null
      width: null
      num_channels: null
      resize_method: interpolate
      infer_image_num_channels: true
      infer_image_dimensions: true
      infer_image_max_height: 256
      infer_image_max_width: 256
      infer_image_sample_size: 100
      standardize_image: null
      in_memory: true
      num_processes: 1
      requires_equal_dimensions: false
      num_classes: null
      infer_image_num_classes: false
      mode: lazy
      prefetch_size: null
      lazy_cache_dir: null
    encoder:
      type: stacked_cnn
      skip: false
      conv_dropout: 0.0
      conv_activation: relu
      height: null
      width: null
      num_channels: null
      out_channels: 32
      kernel_size: 3
      stride: 1
      padding_mode: zeros
      padding: valid
      dilation: 1
      groups: 1
      pool_function: max
      pool_kernel_size: 2
      pool_stride: null
      pool_padding: 0
      pool_dilation: 1
      output_size: 128
      conv_use_bias: true
      conv_norm: null
      conv_norm_params: null
      num_conv_layers: null
      conv_layers: null
      fc_dropout: 0.0
      fc_activation: relu
      fc_use_bias: true
      fc_bias_initializer: zeros
      fc_weights_initializer: xavier_uniform
      fc_norm: null
      fc_norm_params: null
      num_fc_layers: 1
      fc_layers: null
output_features:
  - name: future
    type: timeseries
    column: future
    proc_column: future_mZFLky
    active: true
    horizon: null
    reduce_input: null
    dependencies: []
    reduce_dependencies: null
    default_validation_metric: mean_squared_error
    preprocessing:
      tokenizer: space
      timeseries_length_limit: 256
      padding_value: 0.0
      padding: right
      missing_value_strategy: drop_row
      fill_value: ''
      computed_fill_value: ''
      horizon: 0
      cache_encoder_embeddings: false
    decoder: {type: projector, output_size: null, activation: null, multiplier: 1.0, clip: null, use_bias: true,
              weights_initializer: xavier_uniform, bias_initializer: zeros, fc_layers: null, num_fc_layers: 0,
              fc_output_size: 256, fc_use_bias: true, fc_weights_initializer: xavier_uniform, fc_bias_initializer: zeros,
              fc_norm: null, fc_norm_params: null, fc_activation: relu, fc_dropout: 0.0}
    loss: {type: huber, weight: 1.0, delta: 1.0}
"""


def test_ludwig_s_image_and_timeseries_output_keys_at_their_defaults_load_as_raylight_s_defaults(tmp_path):
    (tmp_path / "c.yaml").write_text(LUDWIG_STYLE)
    config = load_config(str(tmp_path / "c.yaml"))
    inp, out = config.input_features[0], config.output_features[0]
    plain = ModelConfig.model_validate({"input_features": [{"name": "image", "type": "image"}], "output_features": [{"name": "future", "type": "timeseries"}]})
    assert inp == plain.input_features[0].model_copy(update={"column": "image"})
    assert out == plain.output_features[0].model_copy(update={"column": "future"})
    for key, value in (("preprocessing.num_classes", 2), ("augmentation", True), ("encoder.height", 32)):
        with pytest.raises(ConfigError, match=rf"input_features\.0\.{key}"):
            load_config(str(tmp_path / "c.yaml"), [f"input_features.0.{key}={value}"])
    with pytest.raises(ConfigError, match=r"output_features\.0\.preprocessing\.horizon.*set the output's horizon"):
        load_config(str(tmp_path / "c.yaml"), ["output_features.0.preprocessing.horizon=3"])


@pytest.mark.parametrize(("variant", "width", "weights"), [(18, 512, 11_176_512), (50, 2048, 23_508_032)])
def test_resnet_is_torchvision_s_architecture_built_from_scratch(variant, width, weights):
    """Its weights count torchvision's resnet18 / resnet50 less their classifier (11,689,512
    - 513,000 and 25,557,032 - 2,049,000); it takes the preprocessing's channels and size."""
    f = feat({"type": "resnet", "model_variant": variant, "use_pretrained": False})
    module, out = image.encoder(f, {"height": 32, "width": 32, "num_channels": 3})
    assert out == width and sum(p.numel() for p in module.parameters()) == weights
    grey, _ = image.encoder(f, {"height": 20, "width": 28, "num_channels": 1})
    grey.train()
    assert grey(torch.zeros(1, 1, 20, 28, dtype=torch.uint8)).shape == (1, width)  # one row in training: 1x1 maps normalise
    with pytest.raises(ValueError, match="use_pretrained: the pre-trained resnet's weights are downloaded"):
        feat({"type": "resnet"})


def test_vit_is_torchvision_s_architecture_built_from_scratch():
    """b_16 at torchvision's 224x224 counts vit_b_16's weights less its head (86,567,656 -
    769,000); other sizes take their own positions; the patch must divide the size."""
    f = feat({"type": "vit", "use_pretrained": False})
    module, width = image.encoder(f, {"height": 224, "width": 224, "num_channels": 3})
    assert width == 768 and sum(p.numel() for p in module.parameters()) == 85_798_656
    small = feat({"type": "vit", "model_variant": "b_32", "use_pretrained": False, "trainable": False})
    module, _ = image.encoder(small, {"height": 64, "width": 32, "num_channels": 1})
    assert module(torch.zeros(2, 1, 64, 32, dtype=torch.uint8)).shape == (2, 768)
    assert not any(p.requires_grad for p in module.parameters())
    with pytest.raises(ConfigError, match=r"model_variant b_32 cuts the images into 32-pixel patches, which must divide .* \(48x32\)"):
        image.encoder(small, {"height": 48, "width": 32, "num_channels": 1})


def test_a_search_over_image_encoder_types_starts_each_from_its_own_defaults():
    from raylight.declarative.config.parameters import set_path

    config = ModelConfig.model_validate({
        "input_features": [{"name": "img", "type": "image", "encoder": {"conv_dropout": 0.1, "fc_dropout": 0.2}}],
        "output_features": [{"name": "y", "type": "binary"}],
    }).model_dump(mode="json")
    mixer = set_path(config, "img.encoder.type", "mlp_mixer")["input_features"][0]["encoder"]
    assert mixer == {"type": "mlp_mixer"}  # stacked_cnn's settings are not a mixer's
    resnet = ModelConfig.model_validate(set_path(config, "img.encoder.type", "resnet")).input_features[0].encoder
    assert resnet.type == "resnet" and resnet.model_variant == 50 and not resnet.use_pretrained
    back = set_path(set_path(config, "img.encoder.type", "vit"), "input_features.0.encoder.type", "stacked_cnn")
    assert ModelConfig.model_validate(back).input_features[0].encoder.conv_dropout == 0.0  # from stacked_cnn's own defaults
