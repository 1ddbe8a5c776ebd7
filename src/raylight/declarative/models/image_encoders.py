"""The image encoders' modules (``features.image``; settings in
``features/image_encoders.py``): Ludwig's Stacked2DCNN, MLP-Mixer, ResNet and ViT (from scratch), after the bytes
are scaled to [0, 1] (and standardised where the feature says). Imported only when a model
is built."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from raylight.base.exceptions import ConfigError
from raylight.declarative.models.ecd import ACTIVATIONS, FCStack

# ImageNet's channel means and deviations (Ludwig's IMAGENET1K_MEAN / _STD, torchvision's).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class _BatchNorm2d(nn.BatchNorm2d):
    """Batch normalisation that takes one value per channel in training (a one-row
    micro-batch of 1x1 maps, where torch's raises) with its running statistics, as
    ``models/ecd.py``'s one-dimensional one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] * x.shape[2] * x.shape[3] < 2:
            return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        return super().forward(x)


def _pool(layer: Any) -> nn.Module:
    if layer.pool_kernel_size is None:
        return nn.Identity()
    stride = layer.pool_stride or layer.pool_kernel_size
    if layer.pool_function == "max":
        return nn.MaxPool2d(layer.pool_kernel_size, stride, layer.pool_padding, dilation=layer.pool_dilation)
    return nn.AvgPool2d(layer.pool_kernel_size, stride, layer.pool_padding)


class Stacked2DCNN(nn.Module):
    """Each of ``conv_layers``: the convolution, its norm, activation, dropout and pooling;
    then the flattened maps through the fully connected layers."""

    def __init__(self, enc: Any, shape: tuple[int, int, int], name: str) -> None:
        super().__init__()
        blocks, x = [], torch.zeros(1, *shape)
        for i, layer in enumerate(enc.conv_layers):
            parts: list[nn.Module] = [nn.Conv2d(
                x.shape[1], layer.out_channels, layer.kernel_size, layer.stride, layer.padding, layer.dilation,
                layer.groups, layer.use_bias, layer.padding_mode,
            )]
            try:
                with torch.no_grad():
                    x = parts[0](x)
                    if layer.norm is not None:
                        parts.append(_BatchNorm2d(layer.out_channels) if layer.norm == "batch" else nn.LayerNorm(tuple(x.shape[2:])))
                    parts += [ACTIVATIONS[layer.activation](), nn.Dropout(layer.dropout) if layer.dropout > 0 else nn.Identity(), _pool(layer)]
                    x = parts[-1](x)
            except RuntimeError as exc:  # torch's word for a map smaller than the filter, or channels that do not divide
                problem = " ".join(str(exc).split())[:200]
                raise ConfigError(
                    f"input_features {name!r}: encoder.conv_layers.{i} cannot take the {tuple(x.shape[1:])} (channels, height, "
                    f"width) it is given ({problem}); use fewer or smaller layers, padding: same, or larger images "
                    "(preprocessing.height and width)"
                ) from None
            blocks.append(nn.Sequential(*parts))
        self.convs = nn.Sequential(*blocks)
        self.fc = FCStack(enc.fc(), int(x.numel()))
        self.width = self.fc.width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(x).flatten(1))


class _MLP(nn.Sequential):
    def __init__(self, width: int, hidden: int, dropout: float) -> None:
        super().__init__(nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, width), nn.Dropout(dropout))


class _MixerBlock(nn.Module):
    def __init__(self, patches: int, enc: Any) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(enc.embed_size), nn.LayerNorm(enc.embed_size)
        self.tokens = _MLP(patches, enc.token_size, enc.dropout)
        self.channels = _MLP(enc.embed_size, enc.channel_dim, enc.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (rows, patches, embed)
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class MLPMixer(nn.Module):
    """Patches embedded by a strided convolution, mixer blocks, a layer norm, the mean."""

    def __init__(self, enc: Any, shape: tuple[int, int, int], name: str) -> None:
        super().__init__()
        channels, height, width = shape
        if height % enc.patch_size or width % enc.patch_size:
            raise ConfigError(
                f"input_features {name!r}: encoder.patch_size {enc.patch_size} must divide the images' height and width "
                f"({height}x{width}); choose a patch_size that does, or set preprocessing.height and width"
            )
        patches = (height // enc.patch_size) * (width // enc.patch_size)
        self.embed = nn.Conv2d(channels, enc.embed_size, enc.patch_size, enc.patch_size)
        self.blocks = nn.Sequential(*(_MixerBlock(patches, enc) for _ in range(enc.num_layers)))
        self.norm = nn.LayerNorm(enc.embed_size)
        self.avg_pool = enc.avg_pool
        self.width = enc.embed_size if enc.avg_pool else enc.embed_size * patches

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.blocks(self.embed(x).flatten(2).transpose(1, 2)))
        return h.mean(1) if self.avg_pool else h.flatten(1)


class _Residual(nn.Module):
    """He et al.'s residual block: two 3x3 convolutions (``bottleneck``: 1x1, 3x3, 1x1 with
    4x the width out), each batch-normalised, added to the input (projected by a 1x1
    convolution where the shape changes), then ReLU; the stride in the 3x3 convolution."""

    def __init__(self, channels: int, width: int, stride: int, bottleneck: bool) -> None:
        super().__init__()
        out = width * (4 if bottleneck else 1)
        shapes = [(channels, width, 1, 1), (width, width, 3, stride), (width, out, 1, 1)] if bottleneck else [
            (channels, width, 3, stride), (width, out, 3, 1)]
        layers: list[nn.Module] = []
        for i, (c_in, c_out, k, s) in enumerate(shapes):
            layers += [nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False), _BatchNorm2d(c_out)]
            if i < len(shapes) - 1:
                layers.append(nn.ReLU())
        self.body = nn.Sequential(*layers)
        self.skip = nn.Identity() if stride == 1 and channels == out else nn.Sequential(
            nn.Conv2d(channels, out, 1, stride, bias=False), _BatchNorm2d(out))
        self.out = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


_RESNET_BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


class ResNet(nn.Module):
    """A ResNet of ``model_variant`` layers without its classifier: the stem, four stages
    of 64, 128, 256 and 512 wide blocks (the first of each after the first at stride 2),
    the mean over the map."""

    def __init__(self, enc: Any, shape: tuple[int, int, int], name: str) -> None:
        super().__init__()
        bottleneck = enc.model_variant >= 50
        layers: list[nn.Module] = [nn.Conv2d(shape[0], 64, 7, 2, 3, bias=False), _BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        channels = 64
        for stage, count in enumerate(_RESNET_BLOCKS[enc.model_variant]):
            for i in range(count):
                block = _Residual(channels, 64 * 2**stage, 2 if stage > 0 and i == 0 else 1, bottleneck)
                layers.append(block)
                channels = block.out
        self.body = nn.Sequential(*layers)
        self.width = channels
        for module in self.modules():  # torchvision's initialisation of a ResNet
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        self.requires_grad_(enc.trainable)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).mean((2, 3))


# torchvision's ViT variants: (patch, blocks, hidden width, heads, MLP width).
_VIT = {"b_16": (16, 12, 768, 12, 3072), "b_32": (32, 12, 768, 12, 3072), "l_16": (16, 24, 1024, 16, 4096),
        "l_32": (32, 24, 1024, 16, 4096), "h_14": (14, 32, 1280, 16, 5120)}


class ViT(nn.Module):
    """Dosovitskiy et al.'s vision transformer without its head: patches embedded by a
    strided convolution, a class token first, learned positions added, pre-norm blocks
    (GELU, layer norms of epsilon 1e-6), a layer norm; the class token's output."""

    def __init__(self, enc: Any, shape: tuple[int, int, int], name: str) -> None:
        super().__init__()
        patch, blocks, width, heads, mlp = _VIT[enc.model_variant]
        channels, height, wide = shape
        if height % patch or wide % patch:
            raise ConfigError(
                f"input_features {name!r}: encoder.model_variant {enc.model_variant} cuts the images into {patch}-pixel patches, "
                f"which must divide their height and width ({height}x{wide}); set preprocessing.height and width to "
                f"multiples of {patch} (torchvision's: 224), or choose another variant"
            )
        self.embed = nn.Conv2d(channels, width, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.position = nn.Parameter(torch.empty(1, (height // patch) * (wide // patch) + 1, width).normal_(std=0.02))
        block = nn.TransformerEncoderLayer(width, heads, mlp, 0.0, activation="gelu", batch_first=True, norm_first=True, layer_norm_eps=1e-6)
        self.blocks = nn.TransformerEncoder(block, blocks, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.width = width
        self.requires_grad_(enc.trainable)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.position
        return self.norm(self.blocks(h))[:, 0]


class ImageEncoder(nn.Module):
    """The bytes as floats in [0, 1] (standardised by ImageNet's statistics where the
    feature says), then the encoder."""

    def __init__(self, inner: nn.Module, standardize: bool) -> None:
        super().__init__()
        self.inner = inner
        self.standardize = standardize
        self.mean: torch.Tensor
        self.std: torch.Tensor
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.width: int = inner.width  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() / 255.0
        if self.standardize:
            x = (x - self.mean) / self.std
        return self.inner(x)


def image_encoder(feat: Any, meta: dict[str, Any]) -> ImageEncoder:
    shape = (int(meta["num_channels"]), int(meta["height"]), int(meta["width"]))
    kinds: dict[str, Any] = {"stacked_cnn": Stacked2DCNN, "mlp_mixer": MLPMixer, "resnet": ResNet, "vit": ViT}
    inner = kinds[feat.encoder.type](feat.encoder, shape, feat.name)
    return ImageEncoder(inner, feat.preprocessing.standardize_image == "imagenet1k")
