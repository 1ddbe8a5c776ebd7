"""AdaptDL's own goodput unit tests (adaptdl/goodput_test.py and fit_test.py, shipped in
its 0.2.11 wheel: the dev extra installs it) run against raylight.adaptive.

Their modules are imported from the installed package with ``adaptdl.goodput`` replaced,
for that import only, by a thin adapter over raylight.adaptive (nothing of AdaptDL's code
is copied here, and its own ``adaptdl.goodput`` is never imported). Every test function of
theirs, with each of its parameter sets, is one case here: 702, all passing (500 failed
at their first check, ``isinstance(goodput, float)``, while ``optimize`` returned 0-d
arrays). The one difference they could show, AdaptDL's single-worker rule, raylight now
follows (docs/adaptive.md), so no case is marked as an expected failure.
Without adaptdl installed, the module is skipped (``pip install --no-deps adaptdl==0.2.11``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import itertools
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from raylight.adaptive import goodput as rl_goodput
from raylight.adaptive import perf_model as rl_perf


def _installed() -> str | None:
    """adaptdl's installed version, read without importing it (an import would leave it in
    sys.modules, where the compatibility layer's import hook would find it)."""
    try:
        return importlib.metadata.version("adaptdl")
    except importlib.metadata.PackageNotFoundError:
        return None


if _installed() != "0.2.11":
    pytest.skip(
        f"adaptdl 0.2.11 is not installed (found: {_installed()}); the dev extra installs it, "
        "or: pip install --no-deps adaptdl==0.2.11",
        allow_module_level=True,
    )


def _adapter() -> types.ModuleType:
    """``adaptdl.goodput``'s names, as AdaptDL's tests call them, on raylight.adaptive."""
    mod = types.ModuleType(
        "adaptdl.goodput", "raylight.adaptive under AdaptDL's names (tests only)"
    )
    mod.PerfParams = rl_goodput.PerfParams  # type: ignore[attr-defined]  # same fields, same order
    mod.GradParams = rl_goodput.GradParams  # type: ignore[attr-defined]
    mod.GoodputFunction = rl_goodput.GoodputFunction  # type: ignore[attr-defined]
    mod.fit_perf_params = rl_perf.fit_perf_params  # type: ignore[attr-defined]
    # The private model pieces fit_test.py generates its data with and scores fits by.
    mod._predict_accum_time = rl_goodput.predict_grad_time  # type: ignore[attr-defined]
    mod._predict_network_time = rl_goodput.predict_sync_time  # type: ignore[attr-defined]
    mod._obj_fn = rl_perf.fit_loss  # type: ignore[attr-defined]
    return mod


def _import_theirs(names: list[str]) -> list[types.ModuleType]:
    """AdaptDL's test modules, imported with the adapter standing in for adaptdl.goodput;
    sys.modules is left as it was (their functions keep the adapter in their globals)."""
    saved = {k: v for k, v in sys.modules.items() if k == "adaptdl" or k.startswith("adaptdl.")}
    try:
        sys.modules["adaptdl.goodput"] = _adapter()
        return [importlib.import_module(f"adaptdl.{name}") for name in names]
    finally:
        for key in [k for k in sys.modules if k == "adaptdl" or k.startswith("adaptdl.")]:
            del sys.modules[key]
        sys.modules.update(saved)


def _cases(module: types.ModuleType) -> Iterator[Any]:
    """One pytest.param per test function and parameter set (their @parametrize marks)."""
    for name, func in sorted(vars(module).items()):
        if not (name.startswith("test_") and callable(func)):
            continue
        marks = [m for m in getattr(func, "pytestmark", []) if m.name == "parametrize"]
        axes = [[(m.args[0], value) for value in m.args[1]] for m in marks]
        for i, combo in enumerate(itertools.product(*axes)):
            case_id = f"{module.__name__.split('.')[-1]}.{name}" + (f"[{i}]" if marks else "")
            yield pytest.param(func, dict(combo), id=case_id)


_GOODPUT_TEST, _FIT_TEST = _import_theirs(["goodput_test", "fit_test"])


@pytest.mark.parametrize("func, kwargs", [*_cases(_GOODPUT_TEST), *_cases(_FIT_TEST)])
def test_adaptdl_s_own_test(func: Callable[..., None], kwargs: dict[str, Any]) -> None:
    np.random.seed(0)  # fit_test.py draws its data from numpy's global generator, unseeded
    func(**kwargs)
