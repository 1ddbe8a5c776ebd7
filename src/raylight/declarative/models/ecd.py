"""Encoder-combiner-decoder model built from a ModelConfig and preprocessing metadata.

Encoders come from each input's type (``raylight.declarative.features``): numbers and
binaries pass through; categories get an embedding; text gets a mean bag of token
embeddings (padding ignored). The combiner is the config's type's (``declarative.combiners``;
concat: an MLP over the concatenated encodings); the decoder is, per output, its fully
connected layers (Ludwig's decoder fc_layers, none by default), then one linear
layer: a logit (binary), class logits (category, set), a value (number, in
standardised units) or the floats of a vector (as they are, Ludwig's projector). The
model returns each output's by its name (Ludwig's multi-task ECD: the outputs share the
encoders and the combiner).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from raylight.declarative.combiners import COMBINERS, Encoded
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.features import FEATURES
from raylight.declarative.outputs import OUTPUTS

_RESERVED = frozenset(dir(nn.ModuleDict()))  # names a ModuleDict cannot hold as keys


def module_key(name: str) -> str:
    """The ModuleDict key of a feature: its name where torch allows it (so weights files
    keep their names), else ``~`` + the name with ``%`` and ``.`` escaped. A key of the
    first kind never starts with ``~``, so no two names share a key."""
    if name and "." not in name and not name.startswith("~") and name not in _RESERVED:
        return name
    return "~" + name.replace("%", "%25").replace(".", "%2E")


# Ludwig's activations by name (ludwig.utils.torch_utils.activations).
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "elu": nn.ELU, "leakyRelu": nn.LeakyReLU, "logSigmoid": nn.LogSigmoid, "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh, "softmax": lambda: nn.Softmax(dim=-1), "gelu": nn.GELU, "silu": nn.SiLU, "swish": nn.SiLU,
    "mish": nn.Mish, "selu": nn.SELU, "prelu": nn.PReLU, "relu6": nn.ReLU6,
}
class _BatchNorm(nn.BatchNorm1d):
    """Batch normalisation that takes a one-row batch in training (an epoch's last
    micro-batch on a worker can be one row, where torch's raises) with its running
    statistics, as in evaluation, leaving them as they are."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] < 2:
            return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        return super().forward(x)


NORMS: dict[str, Callable[[int], nn.Module]] = {"batch": _BatchNorm, "layer": nn.LayerNorm}


class FCStack(nn.Sequential):
    """The combiner's layers as Ludwig's FCStack builds them: the inputs normalised (with
    ``norm``), then per layer linear, normalisation, activation, dropout; with ``residual``,
    a layer's input is added to its output where their widths match. One flat Sequential,
    so the weights keep the names they had before these settings existed
    (``combiner.0.weight``, ...)."""

    def __init__(self, c: Any, width: int) -> None:
        modules: list[nn.Module] = [NORMS[c.norm](width)] if c.norm else []
        blocks: list[tuple[int, int, bool]] = []  # (first module, end, residual)
        for fc in c.fc_layers:
            start = len(modules)
            norm = fc.norm if fc.norm is not None else c.norm
            dropout = fc.dropout if fc.dropout is not None else c.dropout
            modules.append(nn.Linear(width, fc.output_size, bias=fc.use_bias if fc.use_bias is not None else c.use_bias))
            if norm:
                modules.append(NORMS[norm](fc.output_size))
            modules.append(ACTIVATIONS[fc.activation or c.activation]())
            if dropout > 0:
                modules.append(nn.Dropout(dropout))
            blocks.append((start, len(modules), c.residual and fc.output_size == width))
            width = fc.output_size
        super().__init__(*modules)
        self.blocks, self.width = blocks, width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        modules = list(self)
        first = self.blocks[0][0] if self.blocks else len(modules)
        for module in modules[:first]:  # the inputs' normalisation
            x = module(x)
        for start, end, residual in self.blocks:
            out = x
            for module in modules[start:end]:
                out = module(out)
            x = x + out if residual else out
        return x


class DeclarativeModel(nn.Module):
    def __init__(self, config: ModelConfig, meta: dict[str, Any]) -> None:
        super().__init__()
        self.inputs = [f.name for f in config.input_features]
        # One encoder per input, its type's. The name "embeddings" is the one weights files
        # know; pass-through encoders (nn.Identity) hold no weights and add no keys.
        self.embeddings = nn.ModuleDict()
        # inputs whose encoders give their outputs per step (reduce_output: null), for a
        # sequence combiner
        self.stepped = {f.name for f in config.input_features if getattr(getattr(f, "encoder", None), "reduce_output", "") is None}
        encoded = []
        for feat in config.input_features:
            encoder, size = FEATURES[feat.type].encoder(feat, meta[feat.name])
            self.embeddings[module_key(feat.name)] = encoder
            shape = _step_shape(encoder, feat, meta[feat.name]) if feat.name in self.stepped else (size,)
            encoded.append(Encoded(feat.name, feat.type, shape))
        self.combiner = COMBINERS[config.combiner.type].build(config.combiner, encoded)
        width = int(self.combiner.width)  # type: ignore[arg-type]  # every combiner module sets it
        # One decoder per output. A model of one output saved before there could be more
        # named its decoder "decoder": such weights load (``_one_decoder``).
        self.output_types = {out.name: out.type for out in config.output_features}
        self.decoders = nn.ModuleDict()
        for out in config.output_features:
            size = OUTPUTS[out.type].decoder_size(out, meta[out.name])
            own = getattr(OUTPUTS[out.type], "decoder", None)
            if own is not None:  # a type whose decoder is its own (anomaly's center distance)
                self.decoders[module_key(out.name)] = own(out, width)
                continue
            layers: list[nn.Module] = []
            if out.decoder.fc_layers:  # Ludwig's decoder layers, then the output's linear layer
                stack = FCStack(out.decoder.stack(), width)
                layers = [stack, nn.Linear(stack.width, size)]
            if getattr(out.decoder, "calibration", None) == "temperature_scaling":
                from raylight.declarative.models.uncertainty import TemperatureScale

                layers = [*(layers or [nn.Linear(width, size)]), TemperatureScale()]
            # one linear layer alone: the names weights files written before decoder layers have
            self.decoders[module_key(out.name)] = nn.Sequential(*layers) if layers else nn.Linear(width, size)
        self.register_load_state_dict_pre_hook(self._one_decoder)
        self._initialise()

    def _one_decoder(self, module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
        """Weights of a one-output model written before decoders were per output
        (``decoder.weight``) load as that output's decoder."""
        if len(self.output_types) != 1:
            return
        key = module_key(next(iter(self.output_types)))
        for part in ("weight", "bias"):
            old = f"{prefix}decoder.{part}"
            if old in state:
                state[f"{prefix}decoders.{key}.{part}"] = state.pop(old)

    def _initialise(self) -> None:
        """Ludwig's initialisation: xavier-uniform weights and zero biases for the layers,
        xavier-uniform embeddings (a padding row stays zero). With torch's defaults the
        category embeddings (N(0, 1), 32 wide) outweighed the standardised numbers in the
        concatenated inputs. Measured on diamonds (bench/declarative.py's files and config,
        local backend, one run each), held-out accuracy with torch's defaults and with
        this: 0.5809 and 0.6127 at 1k rows, 0.7067 and 0.7167 at 50k, 0.7293 and 0.7626 at
        500k (Ludwig 0.17: 0.6076, 0.7039, 0.7646)."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.xavier_uniform_(module.weight)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, nn.Embedding | nn.EmbeddingBag):
                    nn.init.xavier_uniform_(module.weight)
                    if module.padding_idx is not None:
                        module.weight[module.padding_idx].zero_()

    def combined(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The combiner's output, which every decoder reads."""
        parts = []
        for name in self.inputs:
            encoder = self.embeddings[module_key(name)]
            stepped = name in self.stepped
            parts.append(encoder.steps(batch[name])[0] if stepped else encoder(batch[name]))  # type: ignore[operator]
        return self.combiner(parts)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each output's logits or value, by the output's name."""
        hidden = self.combined(batch)
        outs = {}
        for name, kind in self.output_types.items():
            out = self.decoders[module_key(name)](hidden)
            outs[name] = out if OUTPUTS[kind].WIDE else out.squeeze(1)
        return outs


def _step_shape(encoder: nn.Module, feat: Any, meta: dict[str, Any]) -> tuple[int, int]:
    """(steps, width) of a sequence encoder's outputs per step, from one row of padding."""
    length = meta.get("length") or feat.preprocessing.max_sequence_length
    was = encoder.training
    encoder.eval()
    with torch.no_grad():
        h = encoder.steps(torch.zeros(1, length, dtype=torch.long))[0]  # type: ignore[operator]  # a sequence encoder's
    encoder.train(was)
    return int(h.shape[1]), int(h.shape[2])


def build_model(config: ModelConfig, meta: dict[str, Any]) -> DeclarativeModel:
    torch.manual_seed(config.trainer.seed)
    return DeclarativeModel(config, meta)
