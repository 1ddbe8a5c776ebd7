"""Every float option of the `raylight` commands refuses NaN and infinities at parse
time (raylight.cli.options.finite_float): a usage error, exit 2, naming the option."""

from __future__ import annotations

import re
from typing import Any, get_args

import pytest
import typer
from typer.testing import CliRunner

from raylight.cli import app
from raylight.cli.options import finite_float

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def _float_options() -> list[tuple[str, Any]]:
    """(command and option, its typer parameter) for every option annotated float."""
    found = []

    def walk(cmd: Any, path: str) -> None:
        for p in cmd.params:
            annotation = p.type_descriptor.annotation
            if annotation is float or float in get_args(annotation):
                found.append((f"{path} {p.opts[0]}".strip(), p))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    return found


FLOAT_OPTIONS = _float_options()


def test_the_commands_have_float_options_and_all_are_finite():
    names = [name for name, _ in FLOAT_OPTIONS]
    assert {"run --cpus", "run --init-timeout", "submit --cpus", "submit --connect-timeout", "jobs list --connect-timeout"} <= set(names)
    plain = [name for name, p in FLOAT_OPTIONS if p.type_descriptor.parameter_info.parser is not finite_float]
    assert not plain, f"float options that would take nan: {plain}; give them parser=finite_float"


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "1e999"])
def test_the_parser_refuses_what_is_not_finite(text):
    with pytest.raises(ValueError, match="not a finite number"):
        finite_float(text)
    assert finite_float("1.5") == 1.5


@pytest.mark.parametrize("argv,option", [
    (["run", "--cpus", "nan", "script.py"], "--cpus"),
    (["run", "--gpus", "inf", "script.py"], "--gpus"),
    (["submit", "--connect-timeout", "inf", "--address", "http://127.0.0.1:1", "--", "python", "x.py"], "--connect-timeout"),
    (["jobs", "list", "--connect-timeout", "nan", "--address", "http://127.0.0.1:1"], "--connect-timeout"),
])
def test_a_non_finite_flag_is_a_usage_error_naming_the_option(argv, option):
    result = CliRunner().invoke(app, argv)
    text = " ".join(result.output.replace("│", " ").split())  # the error box wraps lines
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in text and "not a finite number" in text, result.output


@pytest.mark.parametrize("flag", ["a=nan", "a=inf", "*=1e999"])
def test_a_non_finite_price_is_a_usage_error(tmp_path, flag):
    result = CliRunner().invoke(app, ["report", str(tmp_path), "--price", flag])
    assert result.exit_code == 2, result.output
    assert "finite number of USD per hour" in " ".join(result.output.split())


def _commands() -> list[tuple[list[str], Any]]:
    """(argv prefix, click command) for `raylight` and every verb, `jobs` verbs included."""
    found = []

    def walk(cmd: Any, path: list[str]) -> None:
        found.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


# The type tags typer's rich help prints: a Python type's name in angle brackets
# (<str>, <int>, <float>, <bool>, <list[str]>, <Path>, <int range>, <a|b>). Help texts
# may use angle brackets for their own placeholders (<output-directory>/model).
TYPE_TAG = re.compile(r"<(?:str|int|float|bool|Path|datetime|list\[[^\]]*\]|[a-z]+ range|[\w.-]+(?:\|[\w.-]+)+)>")


@pytest.mark.parametrize("path,cmd", _commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_help_shows_no_type_tags(path, cmd):
    """`raylight VERB --help` (every verb, `jobs` verbs included) shows what a value looks
    like, never typer's type tags: a flag's row (--help's too) no <bool>, an option its
    metavar (KEY=VALUE, FILE, N), an argument its name in capitals (COMMAND... where it
    takes many, not <list[str]>), and the usage line names arguments as the rows do."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250"}, terminal_width=250)
    assert result.exit_code == 0, result.output
    assert not TYPE_TAG.search(result.output), result.output
    usage = next(line for line in result.output.splitlines() if "Usage:" in line)
    assert "{" not in usage and "<" not in usage, usage
    rows = {}  # an option's first name -> its row (a required one's starts with "*")
    for line in result.output.splitlines():
        names = [w for w in line.strip("│ *").split() if w.startswith("-")]
        if line.startswith("│ ") and names:
            rows.setdefault(names[0], line)
    flags = [p.opts[0] for p in cmd.params if getattr(p, "is_flag", False) and not p.hidden] + ["--help"]
    for flag in flags:
        assert flag in rows, (flag, result.output)
        assert "<" not in rows[flag], rows[flag]
    for opt in (p for p in cmd.params if p.param_type_name == "option" and not p.hidden and not p.is_flag):
        assert re.search(rf"{re.escape(opt.opts[0])}\b.*\s{re.escape(opt.metavar)}\s", rows[opt.opts[0]]), rows[opt.opts[0]]
        assert opt.metavar and "<" not in opt.metavar and opt.metavar.upper() == opt.metavar, opt.opts
    for arg in (p for p in cmd.params if p.param_type_name == "argument"):
        label = arg.name.upper() + ("..." if arg.nargs != 1 else "")
        assert label in usage, (label, usage)
        assert any(line.startswith("│") and label in line.split() for line in result.output.splitlines()), result.output


def test_submit_s_command_reads_as_the_other_arguments():
    """Issue 55: `raylight submit --help` showed <list[str]> beside its COMMAND."""
    result = CliRunner().invoke(app, ["submit", "--help"], env={"COLUMNS": "250"}, terminal_width=250)
    row = next(line for line in result.output.splitlines() if "After --: the command" in line)
    assert row.split()[1:3] == ["COMMAND...", "After"], row
    assert "Usage: root submit [OPTIONS] [COMMAND...]" in result.output, result.output
