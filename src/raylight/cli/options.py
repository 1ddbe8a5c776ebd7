"""Parsers shared by every `raylight` command: the one home for what a number on the
command line may be. A value refused here is a usage error (exit 2) at parse time,
naming the option, before the command does anything."""

from __future__ import annotations

import math
from typing import Any

import typer.core


def finite_float(value: Any) -> float:
    """A float option's value: a finite number. ``nan``, ``inf`` and ``1e999``, which
    ``float()`` accepts, are refused; ranges (> 0 CPUs, ...) stay with the setting they
    bound."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number; give one such as 1.5")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a number; give one such as 1.5") from None
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number; give one such as 1.5")
    return number


# typer's rich help prints a type tag beside every parameter: ``<str>``, ``<int>``,
# ``<float>``, ``<list[str]>`` beside a repeatable one or a COMMAND..., ``<bool>`` beside a
# flag that takes no value. A row shows what its value looks like instead: a flag's
# metavar is this (nothing), an option's is its own (``KEY=VALUE``) or, where it gives
# none, its name in capitals (``--name NAME``); an argument's row and the usage line name
# it in capitals, ``...`` when it takes many (``[COMMAND...]``).
NO_VALUE = ""


def _untagged(option: Any) -> Any:
    if option is not None:
        option.metavar = NO_VALUE
    return option


class _Argument(typer.core.TyperArgument):
    """A positional argument as the help shows it: its metavar alone (typer adds the
    annotation's type, ``<list[str]>``) and, on the usage line, ``NAME`` or ``[NAME...]``
    (typer writes ``{name}``)."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def get_usage_pieces(self, ctx: Any) -> list[str]:
        label = self.metavar or (self.name or "").upper()
        return [label if self.required else f"[{label}]"]


def _label(params: list[Any]) -> None:
    """Give every parameter that takes a value a metavar (see NO_VALUE above)."""
    for param in params:
        if isinstance(param, typer.core.TyperArgument):
            if param.metavar is None:
                param.metavar = (param.name or "").upper()
            if param.nargs != 1 and not param.metavar.endswith("..."):
                param.metavar += "..."
            param.__class__ = _Argument  # typer builds its own class; this one only renders help
        elif isinstance(param, typer.core.TyperOption) and param.metavar is None:
            param.metavar = NO_VALUE if param.is_flag else (param.name or "").upper()


class Command(typer.core.TyperCommand):
    """Every `raylight` command: its ``--help`` shows no type tags (typer makes the help
    flag itself, so its metavar is set here)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _label(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        return _untagged(super().get_help_option(ctx))


class Group(typer.core.TyperGroup):
    """`raylight` and `raylight jobs`: as ``Command``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _label(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        return _untagged(super().get_help_option(ctx))
