"""The settings of the image encoders (``features.image``), Ludwig's keys and defaults:
``stacked_cnn`` (Stacked2DCNN: 2-D convolutions, each with its pooling, flattened, then
fully connected layers), ``mlp_mixer`` (MLP-Mixer), ``resnet`` and ``vit`` (from scratch). Pure config; the modules are
``models/image_encoders.py``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from raylight.config.base import ConfigModel
from raylight.declarative.features.base import MAX_WIDTH
from raylight.declarative.layers import Activation, FCLayer, FCStackConfig, Norm

Pair = int | tuple[int, int]  # a square size, or (height, width)
Padding = int | tuple[int, int] | Literal["valid", "same"]
Pool = Literal["max", "average", "avg", "mean"]


class Conv2DLayer(ConfigModel):
    """One convolution and what follows it (Ludwig's Conv2DLayer): normalisation, the
    activation, dropout, then its pooling. The encoder fills what an entry leaves out."""

    out_channels: int = Field(ge=1, le=MAX_WIDTH, description="Filters (output channels).")
    kernel_size: Pair = Field(description="The filters' size: one side, or (height, width).")
    stride: Pair = Field(description="The convolution's stride.")
    padding: Padding = Field(description="valid (none), same, or pixels on each side.")
    dilation: Pair = Field(description="The filters' dilation.")
    groups: int = Field(ge=1, le=MAX_WIDTH, description="Groups of channels convolved apart (both channel counts must divide by it).")
    use_bias: bool = Field(description="Whether the convolution has a bias.")
    padding_mode: Literal["zeros", "reflect", "replicate", "circular"] = Field(description="What padding pads with.")
    norm: Norm | None = Field(description="batch (over channels) or layer (over height and width) after the convolution; null: none.")
    activation: Activation = Field(description="The activation (Ludwig's names).")
    dropout: float = Field(ge=0, lt=1, description="Dropout after the activation.")
    pool_function: Pool = Field(description="max, or average (avg, mean).")
    pool_kernel_size: Pair | None = Field(description="The pooling's size; null: no pooling.")
    pool_stride: Pair | None = Field(description="The pooling's stride; null: its size.")
    pool_padding: Pair = Field(description="Pixels the pooling pads on each side.")
    pool_dilation: Pair = Field(description="The max pooling's dilation.")


_LAYER_DEFAULTS = {  # the encoder's key for each of a layer's (Ludwig's default_* arguments)
    "out_channels": "out_channels", "kernel_size": "kernel_size", "stride": "stride", "padding": "padding",
    "dilation": "dilation", "groups": "groups", "use_bias": "conv_use_bias", "padding_mode": "padding_mode",
    "norm": "conv_norm", "activation": "conv_activation", "dropout": "conv_dropout", "pool_function": "pool_function",
    "pool_kernel_size": "pool_kernel_size", "pool_stride": "pool_stride", "pool_padding": "pool_padding",
    "pool_dilation": "pool_dilation",
}


class Stacked2DCNN(ConfigModel):
    """Ludwig's Stacked2DCNN: ``conv_layers`` one after another (by default two, of 32 and
    64 filters of 3x3, no padding, each followed by a 2x2 max pooling; ``num_conv_layers``
    of ``out_channels`` instead), flattened, then ``fc_layers`` (one of ``output_size``, 128,
    by default). A layer's keys the entry leaves out take the encoder's (``out_channels``,
    ``kernel_size``, ..., ``conv_activation``, ``conv_dropout``, ``conv_norm``,
    ``conv_use_bias``); the fully connected layers take ``fc_activation``, ``fc_dropout``,
    ``fc_norm`` and ``fc_use_bias``."""

    type: Literal["stacked_cnn"] = Field("stacked_cnn", description="Ludwig's Stacked2DCNN.")
    conv_layers: list[Conv2DLayer] = Field(default_factory=list, max_length=64, description="The convolutions, in order.")
    out_channels: int = Field(32, ge=1, le=MAX_WIDTH, description="A layer's filters where its entry has none.")
    kernel_size: Pair = Field(3, description="A layer's filter size where its entry has none.")
    stride: Pair = Field(1, description="A layer's stride where its entry has none.")
    padding: Padding = Field("valid", description="A layer's padding where its entry has none.")
    dilation: Pair = Field(1, description="A layer's dilation where its entry has none.")
    groups: int = Field(1, ge=1, le=MAX_WIDTH, description="A layer's groups where its entry has none.")
    conv_use_bias: bool = Field(True, description="Whether a layer has a bias where its entry does not say.")
    padding_mode: Literal["zeros", "reflect", "replicate", "circular"] = Field("zeros", description="A layer's padding mode where its entry has none.")
    conv_norm: Norm | None = Field(None, description="A layer's normalisation where its entry has none.")
    conv_activation: Activation = Field("relu", description="A layer's activation where its entry has none.")
    conv_dropout: float = Field(0.0, ge=0, lt=1, description="A layer's dropout where its entry has none.")
    pool_function: Pool = Field("max", description="A layer's pooling where its entry has none.")
    pool_kernel_size: Pair | None = Field(2, description="A layer's pooling size where its entry has none; null: no pooling.")
    pool_stride: Pair | None = Field(None, description="A layer's pooling stride where its entry has none; null: the size.")
    pool_padding: Pair = Field(0, description="A layer's pooling padding where its entry has none.")
    pool_dilation: Pair = Field(1, description="A layer's pooling dilation where its entry has none.")
    fc_layers: list[FCLayer] = Field(
        default_factory=lambda: [FCLayer(output_size=128)], max_length=64, description="The fully connected layers after the convolutions."
    )
    fc_activation: Activation = Field("relu", description="The fully connected layers' activation where an entry has none.")
    fc_dropout: float = Field(0.0, ge=0, lt=1, description="Dropout after each fully connected layer where an entry has none.")
    fc_norm: Norm | None = Field(None, description="Each fully connected layer's normalisation where an entry has none.")
    fc_use_bias: bool = Field(True, description="Whether the fully connected layers have biases.")

    @model_validator(mode="before")
    @classmethod
    def _ludwig_layers(cls, data: Any) -> Any:
        """Ludwig's defaults written out: its two layers (or ``num_conv_layers`` of the
        encoder's settings), each layer's missing keys the encoder's, and ``num_fc_layers``
        x ``output_size`` as ``fc_layers``; nulls Ludwig writes for "the default" dropped."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (k in ("conv_layers", "num_conv_layers", "fc_layers") and v is None)}
        defaults = {key: data.get(own, cls.model_fields[own].default) for key, own in _LAYER_DEFAULTS.items()}
        count = data.pop("num_conv_layers", None)
        layers = data.get("conv_layers")
        if layers is None:
            layers = [{"out_channels": 32}, {"out_channels": 64}] if count is None else [{}] * count
        if isinstance(layers, list):
            data["conv_layers"] = [{**defaults, **layer} if isinstance(layer, dict) else layer for layer in layers]
        fc_count, size = data.pop("num_fc_layers", None), data.pop("output_size", 128)
        if "fc_layers" not in data:
            data["fc_layers"] = [{"output_size": size}] * (1 if fc_count is None else fc_count)
        elif isinstance(data["fc_layers"], list):
            data["fc_layers"] = [{"output_size": size, **layer} if isinstance(layer, dict) else layer for layer in data["fc_layers"]]
        return data

    def fc(self) -> FCStackConfig:
        """The fully connected layers as the combiner's stack (norms per layer, none on the inputs)."""
        layers = [
            layer.model_copy(update={k: v for k, v in (("norm", self.fc_norm), ("dropout", self.fc_dropout)) if getattr(layer, k) is None})
            for layer in self.fc_layers
        ]
        return FCStackConfig(fc_layers=layers, activation=self.fc_activation, use_bias=self.fc_use_bias, dropout=self.fc_dropout)


class MLPMixer(ConfigModel):
    """Ludwig's MLP-Mixer: the image cut into ``patch_size`` squares (which must divide its
    height and width), each embedded to ``embed_size``, ``num_layers`` mixer blocks (an MLP
    across the patches of ``token_size`` units, one across the channels of ``channel_dim``,
    each after a layer norm, with residuals), a layer norm, then the mean over the patches
    (``avg_pool``; false: every patch's, flattened)."""

    type: Literal["mlp_mixer"] = Field(description="Ludwig's MLPMixer.")
    patch_size: int = Field(16, ge=1, le=4096, description="The patches' side, in pixels.")
    embed_size: int = Field(512, ge=1, le=MAX_WIDTH, description="Each patch's embedding.")
    token_size: int = Field(2048, ge=1, le=MAX_WIDTH, description="Hidden units of the MLP across the patches.")
    channel_dim: int = Field(256, ge=1, le=MAX_WIDTH, description="Hidden units of the MLP across the channels.")
    num_layers: int = Field(8, ge=1, le=64, description="Mixer blocks.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout in the MLPs.")
    avg_pool: bool = Field(True, description="The mean over the patches; false: every patch's embedding, flattened.")


class ResNet(ConfigModel):
    """Ludwig's resnet (torchvision's ResNet, its classifier removed), built here from
    scratch: a 7x7 convolution of stride 2, a max pooling, four stages of residual blocks
    (basic blocks for 18 and 34 layers, bottlenecks for 50, 101, 152) and the mean over the
    map; 512 values (18, 34) or 2048. Pre-trained weights would need a download: raylight
    trains it from ``use_pretrained: false``. It takes the preprocessing's size and channels
    (Ludwig's torchvision encoders resize to 224x224 RGB and standardise by ImageNet's)."""

    type: Literal["resnet"] = Field(description="Ludwig's resnet, from scratch.")
    model_variant: Literal[18, 34, 50, 101, 152] = Field(50, description="Layers: 18, 34, 50, 101 or 152.")
    use_pretrained: bool = Field(
        True, description="Must be false: pre-trained weights are downloaded, which raylight does not do (Ludwig's default: true)."
    )
    trainable: bool = Field(True, description="Whether its weights train (false: its random initial features, frozen).")

    @model_validator(mode="after")
    def _from_scratch(self) -> ResNet:
        return _from_scratch(self)


def _from_scratch(enc: Any) -> Any:
    if enc.use_pretrained:
        raise ValueError(
            f"use_pretrained: the pre-trained {enc.type}'s weights are downloaded, which raylight does not do; set "
            "use_pretrained: false to train it from scratch, or use type: stacked_cnn"
        )
    return enc


class ViT(ConfigModel):
    """Ludwig's vit (torchvision's VisionTransformer, its head removed), built here from
    scratch: ``model_variant``'s patches (b_16: 16 pixels), embedded by a strided
    convolution, a class token and learned positions, its pre-norm transformer blocks
    (GELU, layer norms of epsilon 1e-6), a final layer norm; the class token's output
    (768 values for b, 1024 for l, 1280 for h). ``use_pretrained: false`` as resnet's. The
    patch size must divide the preprocessing's height and width (torchvision's: 224)."""

    type: Literal["vit"] = Field(description="Ludwig's vit, from scratch.")
    model_variant: Literal["b_16", "b_32", "l_16", "l_32", "h_14"] = Field("b_16", description="Size and patch: b, l or h; 16, 32 or 14 pixels.")
    use_pretrained: bool = Field(
        True, description="Must be false: pre-trained weights are downloaded, which raylight does not do (Ludwig's default: true)."
    )
    trainable: bool = Field(True, description="Whether its weights train (false: its random initial features, frozen).")

    @model_validator(mode="after")
    def _from_scratch(self) -> ViT:
        return _from_scratch(self)


ImageEncoder = Stacked2DCNN | MLPMixer | ResNet | ViT
ENCODERS = ("stacked_cnn", "mlp_mixer", "resnet", "vit")


def encoder_with_type(section: dict[str, Any]) -> Any:
    """An encoder section without a ``type`` is Ludwig's default, stacked_cnn."""
    return {"type": "stacked_cnn", **section}


MODELS: dict[str, type[ConfigModel]] = {"stacked_cnn": Stacked2DCNN, "mlp_mixer": MLPMixer, "resnet": ResNet, "vit": ViT}


def retyped_encoder(section: dict[str, Any], kind: str) -> dict[str, Any]:
    """``section`` (an encoder as a saved config writes it) as a ``kind`` encoder: the
    settings it changed from its own type's defaults that ``kind`` has too, and ``kind``'s
    defaults for the rest, so that a search over encoder types (hyperopt's
    ``image.encoder.type``) trains each type as Ludwig configures it; resnet and vit from
    scratch (``use_pretrained: false``, the one value raylight takes)."""
    name = section.get("type", "stacked_cnn")
    own, target = MODELS.get(name), MODELS.get(kind)
    if own is None or target is None:
        return {**section, "type": kind}  # validated later, with the usual message
    base = {"use_pretrained": False} if "use_pretrained" in own.model_fields else {}
    defaults = own.model_validate({"type": name, **base}).model_dump(mode="json")
    changed = {k: v for k, v in section.items() if k != "type" and defaults.get(k) != v}
    out = {"type": kind, **{k: v for k, v in changed.items() if k in target.model_fields}}
    return {"use_pretrained": False, **out} if "use_pretrained" in target.model_fields else out
