"""Each example says which extras it needs ("Needs: pip install 'raylight[a,b]'" in its
docstring, its notebook's first cell or its YAML's comments), and those extras, with the
core, install every package it imports (issue 55: the README's Lightning example imported
scikit-learn, which no extra it named installed)."""

from __future__ import annotations

import ast
import json
import re
import sys

import pytest

from tests import packaging_meta as meta

pytestmark = pytest.mark.unit

EXAMPLES = meta.REPO / "examples"
NEEDS = re.compile(r"Needs: pip install (?:'raylight\[([a-z,]+)\]'|raylight\b)")
# Imports that need more than their distribution's plain install: Ray's libraries come
# with Ray's extras, raylight's products with raylight's.
SUBMODULE_NEEDS = {
    "ray.tune": "ray[tune]", "ray.data": "ray[data]", "ray.train": "ray[train]", "ray.serve": "ray[serve]",
    "raylight.lightning": "lightning", "raylight.tune": "ray[tune]", "raylight.declarative": "pandas",
}
# `import horovod.torch` in the Horovod examples is served by raylight.horovod's import
# hook (they run under `python -m raylight.horovod`): no Horovod to install.
SERVED_BY_RAYLIGHT = {"horovod"}


def _examples() -> list[str]:
    found = [*EXAMPLES.rglob("*.py"), *EXAMPLES.rglob("*.ipynb")]
    found += [p for p in EXAMPLES.rglob("*.yaml") if p.parent.name != "cluster"]  # cluster configs: not run here
    return sorted(str(p.relative_to(EXAMPLES)) for p in found)


def _source(path) -> tuple[str, str]:
    """(where the Needs line must be, the Python source) of one example."""
    text = path.read_text()
    if path.suffix == ".ipynb":
        cells = json.loads(text)["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        return "".join(cells[0]["source"]), code
    if path.suffix == ".yaml":
        return "".join(line for line in text.splitlines(True) if line.lstrip().startswith("#")), ""
    return ast.get_docstring(ast.parse(text)) or "", text


def _imports(code: str, folder, seen: set[str]) -> set[str]:
    """Dotted names ``code`` imports, a sibling module's own imports followed."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    for name in sorted(names):
        sibling = folder / f"{name.split('.')[0]}.py"
        if sibling.exists() and name not in seen:
            seen.add(name)
            names |= _imports(sibling.read_text(), folder, seen)
    return names


def _needed(name: str, folder) -> str | None:
    """The requirement (``dist`` or ``dist[extra]``) that import ``name`` needs; None for
    the standard library, raylight's core and this repository's own modules."""
    top = name.split(".")[0]
    for prefix, requirement in SUBMODULE_NEEDS.items():
        if name == prefix or name.startswith(prefix + "."):
            return requirement
    if top in sys.stdlib_module_names or top in SERVED_BY_RAYLIGHT or top == "raylight":
        return None
    if (folder / f"{top}.py").exists():  # a sibling example: its imports are followed
        return None
    dists = meta.distributions_of(top)
    assert dists, f"no installed distribution provides {top!r}"
    return sorted(dists)[0]


@pytest.mark.parametrize("example", _examples())
def test_the_extras_an_example_names_install_what_it_imports(example):
    path = EXAMPLES / example
    where, code = _source(path)
    found = NEEDS.search(where)
    assert found, (
        f"examples/{example} does not say what it needs: add a line "
        "\"Needs: pip install 'raylight[EXTRA,...]'\" (or \"Needs: pip install raylight\" for the core) "
        "to its docstring, first notebook cell or YAML comments"
    )
    named = [e for e in (found.group(1) or "").split(",") if e]
    unknown = [e for e in named if e not in meta.PYPROJECT["optional-dependencies"]]
    assert not unknown, f"examples/{example} names extras pyproject.toml does not have: {unknown}"
    installed = meta.closure(meta.PYPROJECT["dependencies"])
    for extra in named:
        installed |= meta.closure(meta.PYPROJECT["optional-dependencies"][extra])
    if path.suffix == ".yaml":  # a config for `raylight train` / `raylight hyperopt`
        assert meta.extra("declarative") <= installed, (
            f"examples/{example} is run by raylight train: it needs 'raylight[declarative]' (or an extra that includes it)"
        )
        return
    missing = sorted({
        f"{name} ({need})" for name in _imports(code, path.parent, set())
        if (need := _needed(name, path.parent)) is not None and meta.norm(need) not in installed
    })
    assert not missing, (
        f"examples/{example} imports what pip install 'raylight[{','.join(named)}]' does not install: "
        f"{missing}; name the extra that brings it in its Needs line (or add it to an extra in pyproject.toml)"
    )
