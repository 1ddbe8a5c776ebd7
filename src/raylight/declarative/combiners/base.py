"""What a combiner type provides (``CombinerType``), and what the types share: what the
model tells a combiner of each input (``Encoded``), Ludwig's spelling of a stack of fully
connected layers, and Ludwig's reductions of a sequence. Pure config: a type's torch
modules are built in ``models/`` when a model is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import Field, field_validator

import raylight.declarative.features  # noqa: F401  # first: layers.py needs it whole (features import layers)
from raylight.config.base import ConfigModel
from raylight.declarative.layers import Activation, FCLayer, FCStackConfig, Norm

if TYPE_CHECKING:
    from torch import nn

# Ludwig's SequenceReducer modes raylight has ("avg" is Ludwig's other name of mean; a
# reduction of null leaves the steps, which a raylight output sums, as Ludwig's outputs'
# default reduce_input does).
Reduce = Literal["sum", "mean", "avg", "max", "concat", "last"]


@dataclass(frozen=True)
class Encoded:
    """One input as its encoder gives it to the combiner: its name and feature type, and
    its output's shape per row: ``(width,)``, or ``(steps, width)`` for a sequence
    encoder with ``reduce_output: null`` (its output at each step)."""

    name: str
    type: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        """The width of the output flattened (Ludwig's combiners flatten a per-step output)."""
        out = 1
        for n in self.shape:
            out *= n
        return out


class CombinerModel(ConfigModel):
    """The field every combiner has; a type's model narrows ``type`` to its name."""

    type: str = Field(description="How the encoded inputs are combined (Ludwig's combiner types).")

    def check_inputs(self, inputs: list[Any]) -> tuple[str | None, str] | None:
        """Where this combiner cannot combine ``inputs`` (the config's input features):
        its key (None: the section) and what to do; None where it can (by default)."""
        return None


class CombinerType(Protocol):
    """A combiner type's module: ``Config``, its config model, and ``build``, which makes
    the torch module (importing torch only then). The module's ``forward`` takes the
    encoded inputs in the config's order (each ``(rows, width)`` or ``(rows, steps,
    width)``) and gives ``(rows, width)``; its ``width`` says that width, and a combiner
    with a loss of its own (TabNet's sparsity) sets ``loss`` in each forward."""

    @property
    def Config(self) -> type[ConfigModel]: ...

    def build(self, config: Any, inputs: list[Encoded]) -> nn.Module: ...


def ludwig_layers(data: Any, count: int, size: int) -> Any:
    """Ludwig's spelling of a combiner's layers, ``num_fc_layers`` layers of ``output_size``
    units (a type's defaults: ``count``, ``size``), or ``fc_layers`` entries without a size
    (taking ``output_size``), written as raylight's ``fc_layers``."""
    if not isinstance(data, dict):
        return data
    data = {k: v for k, v in data.items() if not (k == "fc_layers" and v is None)}  # Ludwig writes null
    if "fc_layers" in data and not {"num_fc_layers", "output_size"} & set(data):
        return data
    n, width = data.pop("num_fc_layers", count), data.pop("output_size", size)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 64:
        raise ValueError(f"num_fc_layers (Ludwig's) must be a whole number from 0 to 64, got {n!r}")
    layers = data.get("fc_layers")
    if layers is None:
        data["fc_layers"] = [{"output_size": width}] * n
    elif isinstance(layers, list):
        data["fc_layers"] = [{"output_size": width, **layer} if isinstance(layer, dict) else layer for layer in layers]
    return data


class FCSettings(ConfigModel):
    """The layers after a transformer combiner (Ludwig's ``fc_*`` keys: its ``dropout``
    is the transformer's)."""

    fc_layers: list[FCLayer] = Field(default_factory=list, max_length=64, description="Layers after the transformer (Ludwig's num_fc_layers: 0).")
    fc_dropout: float = Field(0.0, ge=0, lt=1, description="Dropout after each of the layers.")
    fc_activation: Activation = Field("relu", description="The layers' activation.")
    fc_residual: bool = Field(
        False, description="Add each layer's input to its output where their widths match (null, as Ludwig's docs write it: false)."
    )
    norm: Norm | None = Field(None, description="batch or layer: normalise the layers' inputs and outputs; null: none.")
    use_bias: bool = Field(True, description="Whether the layers have biases.")

    @field_validator("fc_residual", mode="before")
    @classmethod
    def _null_residual(cls, value: Any) -> Any:
        """null is false, as Ludwig reads it (its docs' transformer example writes null)."""
        return False if value is None else value

    def stack(self) -> FCStackConfig:
        """These settings as the FCStack's (``models/ecd.py`` builds it)."""
        return FCStackConfig(
            fc_layers=self.fc_layers, dropout=self.fc_dropout, activation=self.fc_activation, norm=self.norm,
            use_bias=self.use_bias, residual=self.fc_residual,
        )
