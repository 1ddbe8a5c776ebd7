"""The in-process checks of the doc blocks that are not run as written (tests/doc_blocks.py):
a block marked ``<!-- check: KIND: reason -->`` gets ``CHECKS[KIND]``, which returns the
problems found (an empty list: the block is right as far as the check can tell).

- ``python``: the block compiles; every raylight module it imports, every name it imports
  from one and every attribute it reads of one exists; every call of a raylight function or
  class binds to its signature (no unknown keyword, no missing argument); a raylight config
  class (a pydantic model) called with literal arguments is built, so its values are validated.
  ``ctx`` is the loop's ``TrainContext`` (the docs' name for it) unless the block binds it, and
  a name bound to what a raylight call returns (``result = raylight.fit(...)``) is of the class
  its annotation names: their attributes must exist, their methods' calls bind.
- ``shell``: every ``raylight`` command (after ``VAR=value``, a launcher such as ``torchrun``
  or ``submit ... --``, or as ``-m raylight.cli``) is parsed by the CLI as a shell would pass
  it: the verb exists, each flag exists for that verb and takes its value; ``[...]`` marks
  optional parts and ``...`` elided ones. Every extra a ``pip install`` names for raylight
  exists in pyproject.toml, every ``make`` target in the Makefile, every path under
  examples/ or tests/ in the repository, every raylight module run with ``-m``.
- ``config``: the YAML is a declarative config section, validated by the loader's own
  ``validate_config``; a fragment without features is checked over ``READER_CONFIG``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import itertools
import re
import shlex
import textwrap
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from tests.doc_blocks import ROOT, Block
from tests.packaging_meta import PYPROJECT

# The reader's config that a fragment of a declarative config is checked over: a text feature
# named review (docs/tune.md searches its encoder), a number and a binary target.
READER_CONFIG: dict[str, Any] = {
    "input_features": [{"name": "review", "type": "text"}, {"name": "age", "type": "number"}],
    "output_features": [{"name": "income", "type": "binary"}],
}


# ---------------------------------------------------------------------------------- python


class _Unresolved(Exception):
    """An expression the python check cannot evaluate statically (not an error)."""


def check_python(block: Block) -> list[str]:
    try:
        tree = ast.parse(block.code, filename=block.id)
    except SyntaxError as exc:
        return [f"line {exc.lineno}: {exc.msg}"]
    problems: list[str] = []
    names = _imports(tree, problems)
    names.setdefault("ctx", _Instance(_train_context()))  # the docs' name for the loop's context
    assigns = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Assign)), key=lambda n: n.lineno)
    for node in assigns:  # x = raylight.fit(...): x is a Result, its attributes checked
        target = node.targets[0] if len(node.targets) == 1 else None
        if not isinstance(target, ast.Name):
            continue
        if target.id in names and not isinstance(names[target.id], _Instance):
            continue  # an imported name bound again: left as imported
        names.pop(target.id, None)
        cls = _returns(node.value, names)
        if cls is not None:
            names[target.id] = _Instance(cls)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            try:
                _resolve(node.value, names)
            except _Unresolved:
                continue
            except AttributeError as exc:
                problems.append(f"line {node.lineno}: {exc}")
                continue
            try:
                _resolve(node, names)
            except _Unresolved:
                pass
            except AttributeError as exc:
                problems.append(f"line {node.lineno}: {exc}")
        elif isinstance(node, ast.Call):
            problems.extend(_check_call(node, names))
    return sorted(set(problems))


def _imports(tree: ast.Module, problems: list[str]) -> dict[str, Any]:
    """What each name the block's raylight imports bind stands for."""
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "raylight":
                    mod = _import(alias.name, problems, node.lineno)
                    if mod is not None:
                        names[alias.asname or "raylight"] = (
                            mod if alias.asname else importlib.import_module("raylight")
                        )
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "raylight":
            mod = _import(node.module or "", problems, node.lineno)
            for alias in node.names if mod is not None else ():
                if hasattr(mod, alias.name):
                    names[alias.asname or alias.name] = getattr(mod, alias.name)
                elif _import(f"{node.module}.{alias.name}", [], node.lineno) is not None:
                    names[alias.asname or alias.name] = importlib.import_module(
                        f"{node.module}.{alias.name}"
                    )
                else:
                    problems.append(f"line {node.lineno}: {node.module} has no {alias.name}")
    return names


@dataclass(frozen=True)
class _Instance:
    """An object of a raylight class the block holds (``ctx``, what ``raylight.fit`` returns)."""

    cls: type


def _train_context() -> type:
    from raylight import TrainContext

    return TrainContext


def _returns(node: ast.expr, names: dict[str, Any]) -> type | None:
    """The raylight class of what a call returns, where its annotation says."""
    if not isinstance(node, ast.Call):
        return None
    try:
        func = _resolve(node.func, names)
    except (_Unresolved, AttributeError):
        return None
    if inspect.isclass(func):
        out: Any = func
    else:
        try:
            out = typing.get_type_hints(getattr(func, "func", func)).get("return")
        except Exception:  # an annotation only a type checker resolves
            return None
    return out if inspect.isclass(out) and out.__module__.startswith("raylight.") else None


def _has_attribute(cls: type, name: str) -> bool:
    return (
        hasattr(cls, name)
        or any(name in getattr(k, "__annotations__", {}) for k in cls.__mro__)
        or name in getattr(cls, "model_fields", {})
        or any(name in _self_attributes(k) for k in cls.__mro__)
    )


@functools.cache
def _self_attributes(cls: type) -> frozenset[str]:
    """The attributes ``cls``'s own methods set on ``self`` (``self.rank = ...``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # a builtin, or no source
        return frozenset()
    return frozenset(
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name) and n.value.id == "self"
    )


def _import(name: str, problems: list[str], line: int) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "raylight":
            problems.append(f"line {line}: no module {name}")
            return None
        raise  # a dependency of raylight that is missing: the environment's problem, not the doc's


def _resolve(node: ast.expr, names: dict[str, Any]) -> Any:
    """The raylight object a Name or an attribute chain on one stands for (a method of an
    ``_Instance`` as a callable without its self; its other attributes are only checked)."""
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, names)
        if isinstance(base, _Instance):
            if not _has_attribute(base.cls, node.attr):
                raise AttributeError(f"{_dotted(node.value)} (a {base.cls.__name__}) has no attribute {node.attr!r}")
            member = inspect.getattr_static(base.cls, node.attr, None)
            if inspect.isfunction(member):
                return functools.partial(member, None)
            raise _Unresolved  # a property or a field: it exists, its value is not known here
        if inspect.ismodule(base) and not hasattr(base, node.attr):
            try:  # a submodule not imported yet (raylight.tune)
                return importlib.import_module(f"{base.__name__}.{node.attr}")
            except ModuleNotFoundError:
                pass
        if not hasattr(base, node.attr):
            raise AttributeError(f"{_dotted(node.value)} has no attribute {node.attr!r}")
        return getattr(base, node.attr)
    raise _Unresolved


def _dotted(node: ast.expr) -> str:
    return ast.unparse(node)


def _check_call(node: ast.Call, names: dict[str, Any]) -> list[str]:
    try:
        func = _resolve(node.func, names)
    except (_Unresolved, AttributeError):
        return []  # not a raylight callable, or reported as a missing attribute
    if (
        not callable(func)
        or any(isinstance(a, ast.Starred) for a in node.args)
        or any(k.arg is None for k in node.keywords)
    ):
        return []
    where = f"line {node.lineno}: {_dotted(node.func)}(...)"
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    try:
        sig.bind(*node.args, **{k.arg: k.value for k in node.keywords if k.arg})
    except TypeError as exc:
        return [f"{where}: {exc}"]
    if _is_config_class(func):
        try:
            _static(node, names)
        except _Unresolved:
            pass
        except Exception as exc:  # a validation error: the value the doc shows is refused
            return [f"{where} is refused: {exc}"]
    return []


def _is_config_class(obj: Any) -> bool:
    from pydantic import BaseModel

    return (
        inspect.isclass(obj)
        and issubclass(obj, BaseModel)
        and obj.__module__.startswith("raylight.")
    )


def _static(node: ast.expr, names: dict[str, Any]) -> Any:
    """The value of a literal, or of a raylight config class called with static values."""
    if isinstance(node, ast.Call):
        cls = _resolve(node.func, names)
        if not _is_config_class(cls):
            raise _Unresolved
        return cls(
            *[_static(a, names) for a in node.args],
            **{k.arg: _static(k.value, names) for k in node.keywords if k.arg},
        )
    if isinstance(node, ast.Tuple | ast.List):
        items = [_static(e, names) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _Unresolved
        return {
            _static(k, names): _static(v, names)
            for k, v in zip(node.keys, node.values, strict=True)
            if k is not None
        }
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise _Unresolved from None


# ----------------------------------------------------------------------------------- shell

_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def check_shell(block: Block) -> list[str]:
    problems: list[str] = []
    for line in re.sub(r"\\\n\s*", " ", block.code).splitlines():  # continuation lines joined
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError as exc:
            problems.append(f"{line!r}: {exc}")
            continue
        words: list[str] = []
        for token in [*tokens, ";"]:  # each command of && || | ; apart
            if token.strip(";&|"):
                word = _unbracket(token)
                if word and word != "...":  # an elided part
                    words.append(word)
            elif words:
                problems.extend(_check_words(words, line.strip()))
                words = []
    return problems


def _unbracket(token: str) -> str:
    """``[--flag`` and ``value]`` of a synopsis's optional part, without the brackets
    (``.[lightning]``, an extra, keeps its own)."""
    token = token.removeprefix("[")
    return token.removesuffix("]") if "[" not in token else token


def _check_words(words: list[str], line: str) -> list[str]:
    while words and _ASSIGN.match(words[0]):
        words = words[1:]
    if not words:
        return []
    problems = [
        f"{line!r}: {w} is not in the repository"
        for w in words
        if _repo_path(w) and not (ROOT / w).exists()
    ]
    if words[0] == "make":
        targets = set(re.findall(r"^([A-Za-z0-9_.-]+):", (ROOT / "Makefile").read_text(), re.M))
        problems += [
            f"{line!r}: the Makefile has no target {w!r}"
            for w in words[1:]
            if not w.startswith("-") and w not in targets
        ]
    if words[:2] == ["pip", "install"]:
        problems += _check_extras(words[2:], line)
    for flag, module in itertools.pairwise(words):  # python -m raylight.horovod
        if flag == "-m" and module.split(".")[0] == "raylight" and not _module_exists(module):
            problems.append(f"{line!r}: no module {module}")
    for i, word in enumerate(words):
        if word == "raylight" or (word == "raylight.cli" and words[i - 1] == "-m"):
            return problems + _check_cli(words[i + 1 :], line)
    return problems


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package missing
        return False


def _repo_path(word: str) -> bool:
    return word.startswith(("examples/", "tests/")) and "*" not in word


def _check_extras(args: list[str], line: str) -> list[str]:
    extras = set(PYPROJECT["optional-dependencies"])
    problems = []
    for arg in args:
        m = re.fullmatch(r"(?:raylight|\.)\[([^\]]*)\]", arg)
        for name in m.group(1).split(",") if m else ():
            if name.strip() not in extras:
                problems.append(
                    f"{line!r}: pyproject.toml has no extra {name.strip()!r}; it has {sorted(extras)}"
                )
    return problems


def _check_cli(args: list[str], line: str) -> list[str]:
    """``args`` (what follows ``raylight``) parsed by the CLI's own commands, nothing run."""
    import typer

    from raylight.cli import app

    cmd: Any = typer.main.get_command(app)  # typer's own click (vendored): duck-typed here
    path = ["raylight"]
    while hasattr(cmd, "commands"):  # a group: raylight, raylight jobs
        while args and args[0].startswith("-"):  # the root's own options (--local_rank=0)
            args = args[1:]
        if not args:
            return []
        if args[0] not in cmd.commands:
            return [
                f"{line!r}: {' '.join(path)} has no command {args[0]!r}; it has {sorted(cmd.commands)}"
            ]
        path.append(args[0])
        cmd, args = cmd.commands[args[0]], args[1:]
    # submit's entrypoint, after --: itself a command, maybe raylight's
    inner = args[args.index("--") + 1 :] if "--" in args else []
    try:
        ctx = cmd.make_context(" ".join(path), list(args))
    except Exception as exc:  # click's UsageError: an unknown flag, a bad value, a missing option
        message = exc.format_message() if hasattr(exc, "format_message") else repr(exc)
        return [f"{line!r}: {' '.join(path)}: {message}"]
    # raylight run passes what follows the script (or -m MODULE) to it: a flag before it is unknown
    if (
        path[-1] == "run"
        and not ctx.params.get("module")
        and ctx.args
        and ctx.args[0].startswith("-")
    ):
        return [f"{line!r}: raylight run has no option {ctx.args[0]!r}"]
    return _check_words(inner, line) if inner else []


# ---------------------------------------------------------------------------------- config


def check_config(block: Block) -> list[str]:
    from raylight.base.exceptions import ConfigError
    from raylight.declarative.suggest import validate_config

    try:
        data = yaml.safe_load(block.code)
    except yaml.YAMLError as exc:
        return [f"not valid YAML: {exc}"]
    if not isinstance(data, dict):
        return [f"a config is a mapping, this is {type(data).__name__}"]
    try:
        validate_config({**READER_CONFIG, **data})
    except ConfigError as exc:
        return [str(exc)]
    return []


CHECKS: dict[str, Callable[[Block], list[str]]] = {
    "python": check_python,
    "shell": check_shell,
    "config": check_config,
}
