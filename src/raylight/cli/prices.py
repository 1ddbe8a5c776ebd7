"""The price options shared by `train`, `experiment`, `report` and `submit`."""

from __future__ import annotations

from typing import Annotated

import typer

PriceOpt = Annotated[
    list[str] | None,
    typer.Option("--price", help="Price of a node type in USD per hour: m5.xlarge=0.192, '*=0.1' for the rest (repeatable).", metavar="TYPE=USD"),
]
PricesOpt = Annotated[str | None, typer.Option("--prices", help="YAML/JSON file {node_type: USD per hour}.", metavar="FILE")]


def price_table(price: list[str] | None, prices_file: str | None) -> dict[str, float] | None:
    """--prices FILE, then each --price over it; None when neither is given."""
    from raylight.base.cost import load_prices, parse_prices

    if not price and not prices_file:
        return None
    table = load_prices(prices_file) if prices_file else {}
    return {**table, **parse_prices(price or [])}
