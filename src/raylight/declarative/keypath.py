"""Dotted key paths into a config's nested dicts and lists (``trainer.epochs``,
``combiner.fc_layers.0.output_size``): the one walk behind ``--set`` overrides and
hyperopt parameters. Each caller words the error its own way from ``KeyPathError``.
"""

from __future__ import annotations

from typing import Any, Literal


class KeyPathError(Exception):
    """Part ``at`` of ``parts`` cannot be followed: ``index`` (not an index of a list of
    ``size`` items), ``key`` (not a key of a mapping whose keys are ``keys``; only where
    missing keys are not created) or ``value`` (the path so far ends at a value)."""

    def __init__(
        self, problem: Literal["index", "key", "value"], parts: list[str], at: int, *, size: int = 0,
        keys: list[str] | None = None, found: Any = None,
    ) -> None:
        super().__init__(problem, ".".join(parts[: at + 1]))
        self.problem = problem
        self.parts = parts
        self.at = at
        self.size = size
        self.keys = keys or []
        self.found = found  # ``value``: the value the path so far ends at (None: null)

    @property
    def where(self) -> str:
        """The path up to and including the part that failed."""
        return ".".join(self.parts[: self.at + 1])

    @property
    def parent(self) -> str:
        """The path before the part that failed ('' at the root)."""
        return ".".join(self.parts[: self.at])


def assign(data: dict[str, Any], parts: list[str], value: Any, *, create: bool) -> None:
    """Set ``data[parts[0]][parts[1]]...`` to ``value`` in place; list items by index
    (existing ones only). ``create``: missing keys of mappings are made on the way (a
    list where the next part is an index, else a mapping), and so are sections set to null
    (a section left out); otherwise they are errors."""
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise KeyPathError("index", parts, i, size=len(node))
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if part not in node and not create:
                raise KeyPathError("key", parts, i, keys=sorted(node))
            if last:
                node[part] = value
            else:
                if create and node.get(part) is None:
                    node[part] = [] if parts[i + 1].isdigit() else {}
                node = node[part]
        else:
            raise KeyPathError("value", parts, i, found=node)
