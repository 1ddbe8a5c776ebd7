"""Where the workers find the user's code and what a user reads when they cannot
(``raylight.worker_group.user_code``): pure, no Ray."""

from __future__ import annotations

import os
import sys
import types

import pytest

from raylight.worker_group.user_code import (
    driver_sys_path,
    import_error_message,
    merged_sys_path,
    missing_module,
    moved_modules,
    unpicklable_message,
    unpicklable_parts,
    use_driver_sys_path,
    user_modules,
)


def test_the_driver_s_entries_come_first_in_its_order_and_the_worker_keeps_its_own():
    driver = ["/proj/lib", "/venv/site", "/proj/lib", "/proj"]
    own = ["/ray/workers", "/venv/site", "/job/working_dir"]
    assert merged_sys_path(driver, own) == ["/proj/lib", "/venv/site", "/proj", "/ray/workers", "/job/working_dir"]


def test_a_worker_takes_the_driver_s_path_in_place_and_none_leaves_it(monkeypatch):
    monkeypatch.setattr(sys, "path", ["/ray/workers", "/venv/site"])
    same = sys.path
    use_driver_sys_path(())
    assert sys.path == ["/ray/workers", "/venv/site"]
    use_driver_sys_path(("/proj/lib", "/venv/site"))
    assert sys.path is same and sys.path == ["/proj/lib", "/venv/site", "/ray/workers"]


def test_the_driver_s_relative_entries_are_made_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", "src", "/abs"])
    assert driver_sys_path() == [str(tmp_path), os.path.join(str(tmp_path), "src"), "/abs"]


class _RayTaskErrorLike(Exception):
    """The shape of Ray's error for an argument a worker could not unpickle:
    ``RayTaskError(RaySystemError)`` whose ``cause`` holds the worker's exception in
    ``client_exc``."""

    def __init__(self, text: str, inner: BaseException | None) -> None:
        super().__init__(text)
        self.cause = type("RaySystemErrorLike", (Exception,), {})("System error")
        self.cause.client_exc = inner


def _module(name: str, path: str | None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = path
    return module


def test_the_user_s_modules_are_source_files_outside_the_installed_libraries(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "mine.py").write_text("")
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    modules = {
        "mine": _module("mine", str(tmp_path / "link" / "mine.py")),  # through a link: its real file
        "json": sys.modules["json"],  # the standard library
        "pytest": sys.modules["pytest"],  # installed
        "ext": _module("ext", str(tmp_path / "ext.cpython-311-x86_64-linux-gnu.so")),  # compiled
        "builtin": _module("builtin", None),
        "relative": _module("relative", "_ops.py"),  # torch.ops' __file__: not a path
    }
    assert user_modules(modules) == {"mine": str(real / "mine.py")}


def test_a_module_moved_is_one_the_driver_has_from_another_file():
    held = {"mine": "/a/mine.py", "same": "/a/same.py", "only_here": "/a/only.py"}
    driver = {"mine": "/b/mine.py", "same": "/a/same.py", "only_there": "/b/other.py"}
    assert moved_modules(held, driver) == ["mine (/a/mine.py -> /b/mine.py)"]
    assert moved_modules(held, {}) == []


def test_the_missing_module_is_found_in_ray_s_wrapping_or_its_text():
    wrapped = _RayTaskErrorLike("At least one of the input arguments ...", ModuleNotFoundError("No module named 'helper'", name="helper"))
    assert missing_module(wrapped) == ("helper", "No module named 'helper'")
    name_only = ImportError("cannot import name 'loop' from 'helper' (/x/helper.py)", name="helper")
    assert missing_module(name_only) == ("helper", "cannot import name 'loop' from 'helper' (/x/helper.py)")
    try:
        try:
            raise ModuleNotFoundError("No module named 'pkg.sub'", name="pkg.sub")
        except ImportError as exc:
            raise RuntimeError("worker failed") from exc
    except RuntimeError as chained:
        assert missing_module(chained) == ("pkg.sub", "No module named 'pkg.sub'")
    text_only = RuntimeError("ActorDiedError: ... ModuleNotFoundError: No module named 'raylight'")
    assert missing_module(text_only) == ("raylight", "No module named 'raylight'")


@pytest.mark.parametrize("exc", [RuntimeError("boom"), _RayTaskErrorLike("x", ValueError("bad")), TimeoutError()])
def test_other_failures_are_not_import_failures(exc):
    assert missing_module(exc) is None


def _loop(ctx, config):
    pass


def test_the_message_names_the_module_the_loop_the_driver_s_file_and_the_fix_for_a_cluster():
    text = import_error_message("tests.worker_group.test_user_code", embedded=False, loop=_loop, reason="No module named 'tests'")
    assert "module 'tests.worker_group.test_user_code'" in text and "(tests.worker_group.test_user_code._loop)" in text
    assert f"the driver imported it from {__file__}" in text
    assert "py_modules" in text and "working_dir" in text and "raylight submit --working-dir" in text and "pip install" in text
    assert "sys.path" not in text


def test_on_the_embedded_cluster_the_message_says_the_workers_search_the_driver_s_path():
    text = import_error_message("made_at_run_time", embedded=True, loop=_loop, reason="No module named 'made_at_run_time'")
    assert "driver's sys.path" in text and "define the loop in a file" in text
    assert "imported it from" not in text and "py_modules" not in text


def test_a_cluster_without_raylight_is_told_to_install_it():
    text = import_error_message("raylight.worker_group.worker", embedded=False, loop=_loop, reason="No module named 'raylight'")
    assert text.startswith("the workers cannot import raylight (No module named 'raylight')")
    assert "same version" in text


def _dumps(value):
    import pickle

    return pickle.dumps(value)


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("cannot pickle '_Unpicklable' object")


def test_the_culprit_is_named_by_its_innermost_key_path_in_the_config():
    config = {"lr": 0.1, "data": {"rows": [1, 2], "conn": _Unpicklable()}, "hooks": [0, _Unpicklable()]}
    assert unpicklable_parts(None, config, _dumps) == [
        f"config['data']['conn'] ({__name__}._Unpicklable)", f"config['hooks'][1] ({__name__}._Unpicklable)",
    ]
    assert unpicklable_parts(None, {"lr": 0.1}, _dumps) == []


def test_the_culprit_in_a_loop_s_closure_its_object_or_its_attributes():
    held = _Unpicklable()

    def loop(ctx, config):
        return held

    found = unpicklable_parts(loop, None, _dumps)
    assert f"the loop's closure variable 'held' ({__name__}._Unpicklable)" in found

    class Trainer:
        def __init__(self):
            self.conn = _Unpicklable()

        def loop(self, ctx, config):
            pass

        def __call__(self, ctx, config):
            pass

    obj = Trainer()
    assert any(p.startswith("the loop's object (its self)") for p in unpicklable_parts(obj.loop, None, _dumps))
    assert unpicklable_parts(obj, None, _dumps) == [f"the loop object's attribute 'conn' ({__name__}._Unpicklable)"]


def test_a_module_level_loop_s_globals_are_not_suspects_a_script_s_are():
    glob = {"LOCK": _Unpicklable(), "__name__": "__main__"}
    exec("def loop(ctx, config):\n    return LOCK\n", glob)  # a loop defined in a script
    main_loop = glob["loop"]
    main_loop.__module__ = "__main__"
    assert unpicklable_parts(main_loop, None, _dumps) == [f"the loop's global 'LOCK' ({__name__}._Unpicklable)"]
    assert unpicklable_parts(_loop, None, _dumps) == []  # pickled by reference: its module's globals stay


def test_the_unpicklable_message_says_where_and_what_to_do():
    text = unpicklable_message("TypeError: cannot pickle '_thread.lock' object", ["config['lock'] (_thread.lock)"])
    assert text.startswith("the training loop or its config cannot be sent to the workers: TypeError: cannot pickle")
    assert "Found in: config['lock'] (_thread.lock)." in text and "inside the loop" in text
    assert "Found in" not in unpicklable_message("TypeError: x", [])
