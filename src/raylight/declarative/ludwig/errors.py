"""Every problem of a config in one error, at Ludwig's key paths: the Ludwig keys
``check.py`` refuses and pydantic's errors of the rest, joined (one round, not one per
fix), each pydantic location without the segments its unions add (a tagged union's tag,
``input_features.0.number.name``; a union member's name, ``trainer.batch_size.int``),
which are no key of the config."""

from __future__ import annotations

import re
import typing
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ErrorType

from raylight.declarative.ludwig.schema_keys import LUDWIG_SECTION_KEYS

_KNOWN: frozenset[str] = frozenset(typing.get_args(ErrorType))
_LOST = object()  # the walk left the data (a key the data lacks: a missing field)


def key_path(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """``loc`` (a pydantic error's location in ``data``) as the config's key path: a part
    that is no key of the section it is in but the name of the section's union member
    (its ``type``) goes, and so does every part past a value that is no section."""
    out: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict):
            if part in node:
                out.append(part)
                node = node[part]
            elif _tag(node) == part:
                continue  # the union's tag: the same section
            else:
                out.append(part)
                node = _LOST
        elif isinstance(node, list):
            out.append(part)
            node = node[part] if isinstance(part, int) and 0 <= part < len(node) else _LOST
        elif node is _LOST or node is None:
            out.append(part)
        else:
            break  # a value: the rest names union members tried on it
    return tuple(out)


def _tag(section: dict[Any, Any]) -> Any:
    """The name of the union member ``section`` is: its ``type`` (features, encoders,
    schedulers), ``space`` (hyperopt's), or, without a type, its ``name`` (strategies)."""
    for key in ("type", "space"):
        if key in section:
            return section[key]
    return section.get("name")


def details(item: ErrorDetails, loc: tuple[Any, ...]) -> InitErrorDetails:
    """``item`` (from ``ValidationError.errors()``) as an error to raise again at ``loc``:
    its own type and context where pydantic knows the type, else its message as it is."""
    if item["type"] in _KNOWN:
        out = InitErrorDetails(type=item["type"], loc=loc, input=item.get("input"))
        if "ctx" in item:
            out["ctx"] = item["ctx"]
        try:
            ValidationError.from_exception_data("check", [out])
        except (KeyError, TypeError, ValueError):
            pass  # a context pydantic cannot take back: the message as it is
        else:
            return out
    return InitErrorDetails(type=PydanticCustomError(item["type"], item["msg"]), loc=loc, input=item.get("input"))


def value_error(loc: tuple[Any, ...], message: str, value: Any) -> InitErrorDetails:
    """An error of raylight's own at ``loc``; no context given: the message is shown as it
    is, braces included."""
    return InitErrorDetails(type=PydanticCustomError("ludwig_key", message), loc=loc, input=value)


def joined(title: str, problems: list[InitErrorDetails], err: ValidationError | None, data: Any) -> ValidationError:
    """One ValidationError of ``problems`` (at key paths already) and ``err``'s errors
    (locations in ``data``, as ``key_path`` gives them), each once."""
    out = list(problems)
    for item in err.errors() if err is not None else ():
        loc = key_path(item["loc"], data)
        detail = _at_its_key(item) or _ludwig_s(item, loc, data) or details(item, loc)
        if not any(o["loc"] == detail["loc"] and _message(o) == _message(detail) for o in out):
            out.append(detail)
    return ValidationError.from_exception_data(title, out)


def _ludwig_s(item: ErrorDetails, loc: tuple[Any, ...], data: Any) -> InitErrorDetails | None:
    """An unknown key of a feature or of its encoder, decoder, loss or preprocessing that is
    a key of Ludwig 0.17's section (of another type, encoder or decoder), told so."""
    if item["type"] != "extra_forbidden" or len(loc) not in (3, 4) or loc[0] not in ("input_features", "output_features"):
        return None
    section = "feature" if len(loc) == 3 else str(loc[2])
    if str(loc[-1]) not in LUDWIG_SECTION_KEYS.get(section, frozenset()):
        return None
    feature = data[loc[0]][loc[1]] if isinstance(data, dict) else {}
    kind = feature.get("type") if isinstance(feature, dict) else None
    where = f"a {kind} feature" if section == "feature" else f"a {kind} feature's {section}"
    message = (
        f"a key of Ludwig 0.17's schema, which {where} does not take in raylight; remove it "
        "(docs/declarative.md, \"Ludwig 0.17's keys\", says what raylight does with Ludwig's keys)"
    )
    return InitErrorDetails(type=PydanticCustomError("ludwig_key", message), loc=loc, input=item.get("input"))


_NAMED = re.compile(r"^([A-Za-z_][\w]*(?:\.[\w]+)+): (.+)$", re.DOTALL)


def _at_its_key(item: ErrorDetails) -> InitErrorDetails | None:
    """A check across sections (a model validator: location the root) whose message starts
    with the key path it is about (``backend.trainer.strategy: ...``), at that path."""
    if item["loc"] or item["type"] != "value_error":
        return None
    match = _NAMED.match(item["msg"].removeprefix("Value error, "))
    if match is None:
        return None
    loc = tuple(int(p) if p.isdigit() else p for p in match.group(1).split("."))
    # a value_error's message is shown as it is (the config itself is no value to quote)
    return InitErrorDetails(type=PydanticCustomError("value_error", match.group(2)), loc=loc, input=None)


def _message(detail: InitErrorDetails) -> str:
    kind = detail["type"]
    return str(kind) if isinstance(kind, PydanticCustomError) else f"{kind}:{detail.get('ctx')}"
