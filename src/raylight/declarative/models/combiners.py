"""The combiners' torch modules other than TabNet's (``models/tabnet.py``): concat's
stack, the transformer combiners (transformer, tabtransformer, ft_transformer),
project_aggregate, comparator, sequence_concat, sequence and hypernetwork. Their config models and
what they do are in ``raylight.declarative.combiners``; each module takes the encoded
inputs in the config's order (``(rows, width)``, or ``(rows, steps, width)`` per step)
and gives ``(rows, width)``, its width in ``width``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from raylight.base.exceptions import ConfigError
from raylight.declarative.combiners.base import Encoded
from raylight.declarative.combiners.tabtransformer import UNEMBEDDED
from raylight.declarative.models.ecd import FCStack


def _flat(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each part as one vector per row (Ludwig's combiners flatten a per-step output)."""
    return [p.reshape(p.shape[0], -1) for p in parts]


def _last_steps(h: torch.Tensor) -> torch.Tensor:
    """Each row's steps up to its last one that is not all zeros, at least 1 (Ludwig's
    ``sequence_length_3D``)."""
    real = h.abs().sum(-1) != 0
    last = torch.where(real, torch.arange(1, h.shape[1] + 1, device=h.device), 0).amax(1)
    return last.clamp(min=1)


def reduce_steps(h: torch.Tensor, mode: str | None) -> torch.Tensor:
    """``h`` (rows, steps, width) reduced over the steps as Ludwig's SequenceReducer does;
    None sums them (Ludwig's outputs' default ``reduce_input``)."""
    if mode in (None, "sum"):
        return h.sum(1)
    if mode in ("mean", "avg"):
        return h.mean(1)
    if mode == "max":
        return h.amax(1)
    if mode == "concat":
        return h.reshape(h.shape[0], -1)
    if mode == "last":
        return h[torch.arange(h.shape[0], device=h.device), _last_steps(h) - 1]
    raise AssertionError(f"reduction {mode!r}")  # the config models allow no other


def reduced_width(mode: str | None, steps: int, width: int) -> int:
    return steps * width if mode == "concat" else width


def _blocks(c: Any) -> nn.TransformerEncoder:
    """Ludwig's TransformerStack: post-norm blocks, ReLU feed-forward, layer-norm epsilon 1e-6."""
    block = nn.TransformerEncoderLayer(
        c.hidden_size, c.num_heads, c.transformer_output_size, c.dropout, batch_first=True, layer_norm_eps=1e-6
    )
    return nn.TransformerEncoder(block, c.num_layers, enable_nested_tensor=False)


class ConcatModule(FCStack):
    """The inputs concatenated, then the concat combiner's FCStack (its weights keep the
    names they had: ``combiner.0.weight``, ...)."""

    def forward(self, parts: list[torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        return super().forward(torch.cat(parts, dim=1))


class TransformerModule(nn.Module):
    def __init__(self, c: Any, inputs: list[Encoded]) -> None:
        super().__init__()
        self.projectors = nn.ModuleList(nn.Linear(e.size, c.hidden_size) for e in inputs)
        self.blocks = _blocks(c)
        self.reduce = c.reduce_output
        # Ludwig: the layers only after a reduction (null leaves the steps to the outputs)
        width = reduced_width(self.reduce, len(inputs), c.hidden_size)
        self.fc: nn.Module = FCStack(c.stack(), width) if self.reduce is not None else nn.Identity()
        self.width = self.fc.width if isinstance(self.fc, FCStack) else width

    def forward(self, parts: list[torch.Tensor]) -> torch.Tensor:
        x = torch.stack([p(v) for p, v in zip(self.projectors, _flat(parts), strict=True)], dim=1)
        return self.fc(reduce_steps(self.blocks(x), self.reduce))


class FTTransformerModule(nn.Module):
    def __init__(self, c: Any, inputs: list[Encoded]) -> None:
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, c.hidden_size))
        self.projectors = nn.ModuleList(nn.Linear(e.size, c.hidden_size) for e in inputs)
        self.blocks = _blocks(c)
        self.fc = FCStack(c.stack(), c.hidden_size)
        self.width = self.fc.width

    def forward(self, parts: list[torch.Tensor]) -> torch.Tensor:
        x = torch.stack([p(v) for p, v in zip(self.projectors, _flat(parts), strict=True)], dim=1)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        return self.fc(self.blocks(x)[:, 0])


class TabTransformerModule(nn.Module):
    def __init__(self, c: Any, inputs: list[Encoded]) -> None:
        super().__init__()
        self.embedded = [i for i, e in enumerate(inputs) if e.type not in UNEMBEDDED]
        self.unembedded = [i for i, e in enumerate(inputs) if e.type in UNEMBEDDED]
        name = c.embed_input_feature_name
        names = c.hidden_size if name == "add" else name
        self.add_names = name == "add"
        self.names = nn.Embedding(len(self.embedded), names) if names and self.embedded else None
        projected = c.hidden_size - (name if isinstance(name, int) else 0)
        self.projectors = nn.ModuleList(nn.Linear(inputs[i].size, projected) for i in self.embedded)
        beside = sum(inputs[i].size for i in self.unembedded)
        # Ludwig leaves out the layer norm of a single value (it would always give 0)
        self.norm: nn.Module = nn.LayerNorm(beside) if beside > 1 else nn.Identity()
        self.blocks = _blocks(c) if self.embedded else None
        self.reduce = c.reduce_output
        width = reduced_width(self.reduce, len(self.embedded), c.hidden_size) if self.embedded else 0
        self.fc = FCStack(c.stack(), width + beside)
        self.width = self.fc.width

    def forward(self, parts: list[torch.Tensor]) -> torch.Tensor:
        flat = _flat(parts)
        hidden = []
        if self.blocks is not None:
            x = torch.stack([p(flat[i]) for p, i in zip(self.projectors, self.embedded, strict=True)], dim=1)
            if self.names is not None:
                names = self.names.weight[None].expand(x.shape[0], -1, -1)
                x = x + names if self.add_names else torch.cat([x, names], dim=-1)
            hidden.append(reduce_steps(self.blocks(x), self.reduce))
        if self.unembedded:
            hidden.append(self.norm(torch.cat([flat[i] for i in self.unembedded], dim=1)))
        return self.fc(torch.cat(hidden, dim=1))


class ProjectAggregateModule(nn.Module):
    def __init__(self, c: Any, inputs: list[Encoded]) -> None:
        super().__init__()
        self.projectors = nn.ModuleList(nn.Linear(e.size, c.projection_size) for e in inputs)
        self.fc = FCStack(c, c.projection_size)
        self.width = self.fc.width

    def forward(self, parts: list[torch.Tensor]) -> torch.Tensor:
        x = torch.stack([p(v) for p, v in zip(self.projectors, _flat(parts), strict=True)], dim=1)
        return self.fc(x.mean(1))


class ComparatorModule(nn.Module):
    def __init__(self, c: Any, inputs: list[Encoded]) -> None:
        super().__init__()
        where = {e.name: i for i, e in enumerate(inputs)}
        self.first, self.second = [where[n] for n in c.entity_1], [where[n] for n in c.entity_2]
        self.fc1 = FCStack(c, sum(inputs[i].size for i in self.first))
        self.fc2 = FCStack(c, sum(inputs[i].size for i in self.second))
        if self.fc1.width != self.fc2.width:  # no layers: the inputs themselves are compared
            raise ConfigError(
                f"combiner: with no fc_layers the comparator compares entity_1's concatenated inputs ({self.fc1.width} "
                f"values) with entity_2's ({self.fc2.width}); they must be as wide: give fc_layers (or num_fc_layers >= 1)"
            )
        last = self.fc1.width
        # Ludwig's bilinear weights: a random matrix, a buffer (not trained)
        self.register_buffer("bilinear", torch.randn(last, last))
        self.width = 2 * last + 2

    def forward(self, parts: list[torch.Tensor]) -> torch.Tensor:
        flat = _flat(parts)
        a = self.fc1(torch.cat([flat[i] for i in self.first], dim=1))
        b = self.fc2(torch.cat([flat[i] for i in self.second], dim=1))
        bilinear = ((a @ self.bilinear) * b).sum(1, keepdim=True)
        return torch.cat([(a * b).sum(1, keepdim=True), a * b, (a - b).abs(), bilinear], dim=1)


class SequenceConcatModule(nn.Module):
    def __init__(self, main: str | None, reduce: str | None, inputs: list[Encoded]) -> None:
        super().__init__()
        stepped = [i for i, e in enumerate(inputs) if len(e.shape) == 2]
        assert stepped, "the config's check_inputs requires an input per step"
        self.main = next(i for i, e in enumerate(inputs) if e.name == main) if main is not None else stepped[0]
        self.steps = inputs[self.main].shape[0]
        for i in stepped:
            if inputs[i].shape[0] != self.steps:
                raise ConfigError(
                    f"combiner: input {inputs[i].name!r} gives {inputs[i].shape[0]} steps and the main sequence "
                    f"{inputs[self.main].name!r} {self.steps}; a per-step input is concatenated step by step: give "
                    "both the same preprocessing.max_sequence_length (and pooling), or a reduce_output to one of them"
                )
        self.channels = sum(e.shape[-1] for e in inputs)
        self.reduce = reduce
        self.width = reduced_width(reduce, self.steps, self.channels)

    def concatenated(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """(rows, steps, channels): every input at each of the main input's steps, zeros
        after its last non-zero one."""
        main = parts[self.main]
        lengths = _last_steps(main)
        order = [parts[self.main], *(p for i, p in enumerate(parts) if i != self.main)]
        h = torch.cat([p if p.dim() == 3 else p[:, None, :].expand(-1, self.steps, -1) for p in order], dim=2)
        real = torch.arange(self.steps, device=h.device)[None, :] < lengths[:, None]
        return h * real[:, :, None].to(h.dtype)

    def forward(self, parts: list[torch.Tensor]) -> torch.Tensor:
        return reduce_steps(self.concatenated(parts), self.reduce)


class SequenceModule(nn.Module):
    def __init__(self, c: Any, inputs: list[Encoded]) -> None:
        from raylight.declarative.models.encoders import sequence_encoder

        super().__init__()
        self.concat = SequenceConcatModule(c.main_sequence_feature, None, inputs)
        reduce = {"avg": "mean"}.get(c.reduce_output, c.reduce_output)
        self.reduce = reduce
        enc = c.encoder.model_copy(update={"reduce_output": reduce})
        self.encoder = sequence_encoder(enc, None, self.concat.steps, channels=self.concat.channels)
        if reduce is None:
            with torch.no_grad():
                was = self.encoder.training
                self.encoder.eval()
                self.width = self.encoder.steps(torch.zeros(1, self.concat.steps, self.concat.channels))[0].shape[-1]
                self.encoder.train(was)
        else:
            self.width = self.encoder.width

    def forward(self, parts: list[torch.Tensor]) -> torch.Tensor:
        x = self.concat.concatenated(parts)
        if self.reduce is None:
            return reduce_steps(self.encoder.steps(x)[0], None)
        return self.encoder(x)


class HyperNetworkModule(nn.Module):
    """Ludwig's HyperNetworkCombiner: the first input's projection generates, per row, the
    matrix that transforms each other input's projection."""

    def __init__(self, c: Any, inputs: list[Encoded]) -> None:
        super().__init__()
        size = c.hidden_size
        self.projectors = nn.ModuleList(nn.Linear(e.size, size) for e in inputs)
        self.hyper = nn.Sequential(nn.Linear(size, c.hyper_hidden_size), nn.ReLU(), nn.Linear(c.hyper_hidden_size, size * size))
        self.fc = FCStack(c, size * len(inputs))
        self.width = self.fc.width

    def forward(self, parts: list[torch.Tensor]) -> torch.Tensor:
        projected = [p(v) for p, v in zip(self.projectors, _flat(parts), strict=True)]
        rows, size = projected[0].shape
        weights = self.hyper(projected[0]).view(rows, size, size)
        transformed = [projected[0], *(torch.bmm(weights, h.unsqueeze(-1)).squeeze(-1) for h in projected[1:])]
        return self.fc(torch.cat(transformed, dim=1))
