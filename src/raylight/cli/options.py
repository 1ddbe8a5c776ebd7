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


# typer's rich help prints a type tag beside every option, ``<bool>`` beside a flag that
# takes no value too: a flag's metavar is this (nothing), so its row shows no tag.
NO_VALUE = ""


def _untagged(option: Any) -> Any:
    if option is not None:
        option.metavar = NO_VALUE
    return option


class Command(typer.core.TyperCommand):
    """Every `raylight` command: its ``--help`` row shows no ``<bool>`` (typer makes the
    help flag itself, so its metavar is set here)."""

    def get_help_option(self, ctx: Any) -> Any:
        return _untagged(super().get_help_option(ctx))


class Group(typer.core.TyperGroup):
    """`raylight` and `raylight jobs`: as ``Command``."""

    def get_help_option(self, ctx: Any) -> Any:
        return _untagged(super().get_help_option(ctx))
