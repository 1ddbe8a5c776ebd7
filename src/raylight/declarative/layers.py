"""The settings of a stack of fully connected layers, Ludwig's FCStack: the concat
combiner's, a date encoder's, an output's decoder's. Pure config (``models/ecd.py``
builds the layers)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from raylight.config.base import ConfigModel
from raylight.declarative.features.base import MAX_WIDTH

# Ludwig's activation names (ludwig.utils.torch_utils.activations); models/ecd.py builds them.
Activation = Literal[
    "relu", "elu", "leakyRelu", "logSigmoid", "sigmoid", "tanh", "softmax", "gelu", "silu", "swish", "mish", "selu",
    "prelu", "relu6",
]
Norm = Literal["batch", "layer"]


class FCLayer(ConfigModel):
    output_size: int = Field(ge=1, le=MAX_WIDTH, description="Units of this fully connected layer.")
    activation: Activation | None = Field(None, description="This layer's activation; null: the stack's.")
    norm: Norm | None = Field(None, description="This layer's normalisation (batch, layer); null: the stack's.")
    dropout: float | None = Field(None, ge=0, lt=1, description="Dropout after this layer; null: the stack's.")
    use_bias: bool | None = Field(None, description="Whether this layer has a bias; null: the stack's.")


class FCStackConfig(ConfigModel):
    """Fully connected layers (each: linear, normalisation, activation, dropout), in
    Ludwig's order; a subclass sets the default layers."""

    # Ludwig's spelling of this stack's layers: the key counting them, its default, and the
    # default output_size (the combiner's; encoders differ).
    LUDWIG_COUNT_KEY: ClassVar[str] = "num_fc_layers"
    LUDWIG_COUNT: ClassVar[int] = 0
    LUDWIG_OUTPUT_SIZE: ClassVar[int] = 256

    fc_layers: list[FCLayer] = Field(default_factory=list, max_length=64, description="The layers.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout after each layer.")
    activation: Activation = Field("relu", description="Each layer's activation (Ludwig's names).")
    norm: Norm | None = Field(
        None,
        description="batch or layer: normalise the stack's inputs and each layer's output before "
        "its activation (Ludwig's); null: none.",
    )
    use_bias: bool = Field(True, description="Whether the layers have biases.")
    residual: bool = Field(False, description="Add each layer's input to its output where their widths match (Ludwig's).")

    @model_validator(mode="before")
    @classmethod
    def _ludwig_layers(cls, data: Any) -> Any:
        """Ludwig's spelling of the layers, ``num_fc_layers`` (LUDWIG_COUNT_KEY) layers of
        ``output_size`` units (its defaults: LUDWIG_COUNT and LUDWIG_OUTPUT_SIZE), or
        ``fc_layers`` entries without a size (taking ``output_size``), written as
        raylight's ``fc_layers``."""
        key = cls.LUDWIG_COUNT_KEY
        if not isinstance(data, dict) or not {key, "output_size"} & set(data):
            return data
        data = dict(data)
        count, size = data.pop(key, cls.LUDWIG_COUNT), data.pop("output_size", cls.LUDWIG_OUTPUT_SIZE)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 64:
            raise ValueError(f"{key} (Ludwig's) must be a whole number from 0 to 64, got {count!r}")
        layers = data.get("fc_layers")
        if layers is None:
            data["fc_layers"] = [{"output_size": size}] * count
        elif isinstance(layers, list):
            data["fc_layers"] = [{"output_size": size, **layer} if isinstance(layer, dict) else layer for layer in layers]
        return data


class DecoderConfig(ConfigModel):
    """An output's ``decoder`` section, Ludwig's keys of its layers: fully connected layers
    between the combiner and the output's own linear layer (none by default, Ludwig's
    too), each linear, normalisation, activation, dropout."""

    fc_layers: list[FCLayer] = Field(default_factory=list, max_length=64, description="The decoder's layers; none: the output's linear layer reads the combiner.")
    fc_activation: Activation = Field("relu", description="Each layer's activation (Ludwig's names).")
    fc_dropout: float = Field(0.0, ge=0, lt=1, description="Dropout after each layer.")
    fc_norm: Norm | None = Field(None, description="batch or layer: normalise each layer's output before its activation; null: none.")
    fc_use_bias: bool = Field(True, description="Whether the layers have biases.")
    calibration: Literal["temperature_scaling"] | None = Field(
        None,
        description="binary, category: temperature_scaling fits one temperature T on the validation split after "
        "training (the NLL of logits / T; Ludwig's), applied to the logits in evaluation and prediction; null: none.",
    )
    mc_dropout_samples: int = Field(
        0, ge=0, le=10_000,
        description="binary, category: at prediction, run the decoder this many times with its dropout on; the mean "
        "probability predicts, and <output>_uncertainty is the probabilities' variance (Ludwig's MC dropout); 0: off.",
    )

    @model_validator(mode="before")
    @classmethod
    def _ludwig_layers(cls, data: Any) -> Any:
        """Ludwig's ``num_fc_layers`` layers of ``fc_output_size`` units (default 256), or
        ``fc_layers`` entries without a size (taking ``fc_output_size``); null layers: none."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (k == "fc_layers" and v is None)}
        if not {"num_fc_layers", "fc_output_size"} & set(data):
            return data
        count, size = data.pop("num_fc_layers", 0), data.pop("fc_output_size", 256)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 64:
            raise ValueError(f"num_fc_layers (Ludwig's) must be a whole number from 0 to 64, got {count!r}")
        layers = data.get("fc_layers")
        if "fc_layers" not in data:  # Ludwig: fc_layers, where given, wins over num_fc_layers
            data["fc_layers"] = [{"output_size": size}] * count
        elif isinstance(layers, list):
            data["fc_layers"] = [{"output_size": size, **layer} if isinstance(layer, dict) else layer for layer in layers]
        return data

    def stack(self) -> FCStackConfig:
        """The layers as an FC stack's settings (what ``models/ecd.py`` builds)."""
        layers = [layer.model_copy(update={"norm": layer.norm or self.fc_norm}) for layer in self.fc_layers]
        return FCStackConfig(fc_layers=layers, activation=self.fc_activation, dropout=self.fc_dropout, use_bias=self.fc_use_bias)
