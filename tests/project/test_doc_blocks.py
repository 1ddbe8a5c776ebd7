"""Every code block of the README and docs is run by tests/project/test_doc_blocks_on_ray.py, or
checked here in-process (tests/doc_checks.py: its imports, calls, CLI flags, extras or config keys),
or says why neither is honest (tests/doc_blocks.py); the README stays short."""

from __future__ import annotations

import pytest

from tests.doc_blocks import PAGES, ROOT, Block, all_blocks, blocks
from tests.doc_checks import CHECKS, check_config, check_python, check_shell

BLOCKS = all_blocks()
# The language each check reads.
LANG = {"python": "python", "shell": "bash", "config": "yaml"}


def test_every_marker_is_known_and_gives_a_reason():
    bare = [b.id for b in BLOCKS if b.not_run is not None and not b.not_run]
    assert not bare, (
        f"<!-- not-run: REASON --> and <!-- check: KIND: REASON --> need a reason: {bare}"
    )
    unknown = [
        f"{b.id}: {b.check!r}" for b in BLOCKS if b.check is not None and b.check not in CHECKS
    ]
    assert not unknown, f"unknown checks (tests/doc_checks.py has {sorted(CHECKS)}): {unknown}"
    wrong = [
        f"{b.id}: {b.check} on ```{b.lang}"
        for b in BLOCKS
        if b.check in CHECKS and LANG[b.check] != b.lang
    ]
    assert not wrong, f"a check reads one language: {LANG}: {wrong}"


def test_every_config_block_is_checked_or_says_why_not():
    loose = [b.id for b in BLOCKS if b.lang == "yaml" and b.not_run is None]
    assert not loose, f"mark each with <!-- check: config: REASON --> (or not-run: REASON): {loose}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.check], ids=lambda b: f"{b.id}-{b.check}")
def test_a_doc_block_passes_its_check(block: Block):
    problems = CHECKS[block.check or ""](block)
    assert not problems, f"{block.id} ({block.check} check):\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.not_run and not b.check], ids=lambda b: b.id
)
def test_blocks_marked_not_run(block: Block):
    """Lists each block left out, with its reason (pytest -ra shows them)."""
    pytest.skip(f"{block.id} not run: {block.not_run}")


def test_the_readme_quick_start_is_short_runnable_and_prints_its_result():
    readme = [b for b in BLOCKS if b.page.name == "README.md"]
    text = (ROOT / "README.md").read_text()
    quick = next(b for b in readme if b.lang == "python" and b.line > text[: text.index("## Quick start")].count("\n"))
    assert quick.runnable and quick.not_run is None
    lines = [line for line in quick.code.splitlines() if line.strip()]
    assert len(lines) <= 24, f"the quick start has {len(lines)} lines"
    assert "print(" in quick.code, "a quick start that prints nothing looks like it did nothing"
    assert len(text.splitlines()) <= 250, "the README is at most 250 lines: the rest goes to docs/"


def test_a_not_run_comment_must_stand_above_a_fence(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("<!-- not-run: needs a GPU -->\n\n```python\nimport torch\n```\n```bash\nraylight run -n 2 x.py\n```\n")
    first, second = blocks(page)
    assert first.not_run == "needs a GPU" and first.runnable
    assert second.not_run is None and second.runnable
    page.write_text("<!-- not-run: needs a GPU -->\nSome text.\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match=r"p\.md:1: .*right above a code fence"):
        blocks(page)
    page.write_text("text\n<!-- not-run: x -->\n")
    with pytest.raises(ValueError, match="above no code block"):
        blocks(page)


def test_only_blocks_that_run_python_or_the_cli_are_runnable(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```bash\npip install -e .\n```\n```bash\nRAY_AUTH_MODE=token raylight jobs list\n```\n```yaml\na: 1\n```\n")
    pip, cli, yaml = blocks(page)
    assert not pip.runnable and cli.runnable and not yaml.runnable


def test_the_pages_are_the_readme_and_every_doc():
    assert PAGES[0].name == "README.md" and len(PAGES) > 10 and {b.page for b in BLOCKS} <= set(PAGES)


def test_a_check_marker_names_its_check_then_its_reason(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("<!-- check: shell: needs a cluster -->\n```bash\nraylight jobs list\n```\n")
    (block,) = blocks(page)
    assert block.check == "shell" and block.not_run == "needs a cluster"
    page.write_text("<!-- check: shell -->\n```bash\nraylight jobs list\n```\n")
    assert (
        blocks(page)[0].not_run == ""
    )  # no reason: test_every_marker_is_known_and_gives_a_reason fails it
    page.write_text("<!-- check: shell: x -->\ntext\n```bash\nraylight jobs list\n```\n")
    with pytest.raises(ValueError, match=r"<!-- check: \.\.\. --> comment must stand right above"):
        blocks(page)


def _block(lang: str, code: str, check: str) -> Block:
    return Block(ROOT / "x.md", 1, lang, code, "a test", check=check)


def test_the_python_check_finds_missing_names_bad_arguments_and_refused_values():
    def problems(code: str) -> str:
        return "\n".join(check_python(_block("python", code, "python")))

    assert problems("import raylight\nraylight.fit(loop, num_workers=2)\n") == ""
    assert "has no attribute 'fitt'" in problems("import raylight\nraylight.fitt(loop)\n")
    assert "raylight has no Nope" in problems("from raylight import Nope\n")
    assert "no module raylight.nope" in problems("import raylight.nope\n")
    assert "unexpected keyword argument 'num_workrs'" in problems(
        "import raylight.tune as rt\nrt.trainable(f, num_workrs=2)\n"
    )
    assert "lr_rule" in problems("import raylight\nraylight.AdaptiveConfig(lr_rule='nope')\n")
    nested = "from raylight import TrainerConfig, ScalingConfig\nTrainerConfig(scaling=ScalingConfig(num_workers=-3))\n"
    assert "num_workers" in problems(nested)
    assert "invalid syntax" in problems("def f(:\n")
    # ctx is the loop's TrainContext; what a raylight call returns is its annotated class
    assert "ctx (a TrainContext) has no attribute 'prepare_modle'" in problems("def loop(ctx, config):\n    ctx.prepare_modle(net)\n")
    assert "unexpected keyword argument 'shufle'" in problems("ctx.prepare_loader(ds, batch_size=64, shufle=True)\n")
    assert problems("def loop(ctx, config):\n    ctx.rank, ctx.world_size, ctx.batch_size, ctx.epochs(3)\n") == ""
    assert "ctx (a RunContext) has no attribute 'prepare_model'" in problems("import raylight\nctx = raylight.run_context()\nctx.prepare_model(m)\n")
    assert "plan (a ConcurrencyPlan) has no attribute 'max_concurent'" in problems(
        "import raylight.tune as rt\nplan = rt.check_resources(t, num_trials=8)\nplan.max_concurent\n"
    )
    assert "r (a Result) has no attribute 'nope'" in problems("import raylight\nr = raylight.fit(f, num_workers=2)\nr.metrics, r.nope\n")
    # what is not raylight's, or not a literal, is left alone
    assert (
        problems(
            "import torch\nimport raylight\nraylight.AdaptiveConfig(max_batch_size=n)\ntorch.nope()\n"
        )
        == ""
    )


def test_the_shell_check_parses_raylight_commands_and_checks_extras_targets_and_paths():
    def problems(code: str) -> str:
        return "\n".join(check_shell(_block("bash", code, "shell")))

    ok = "RAY_AUTH_MODE=token raylight submit -u http://h:8265 --retries 3 -- raylight run -n 2 x.py --lr 0.1  # it's\n"
    assert problems(ok + "raylight hyperopt --config C --dataset D [--set k=v] [--quiet]\n") == ""
    assert "has no command 'trian'" in problems("raylight trian --config c\n")
    assert "has no command 'lst'" in problems("raylight jobs lst\n")
    assert "No such option: --epochs" in problems(
        "raylight train --config c --dataset d --epochs 3\n"
    )
    assert "Missing option '--dataset'" in problems("raylight train --config c\n")
    assert "'--retries'" in problems("raylight submit -u http://h:1 --retries x -- python t.py\n")
    assert "raylight run has no option '--nope'" in problems(
        "raylight submit -u http://h:1 -- raylight run -n 2 --nope a.py\n"
    )
    assert "has no command 'trains'" in problems(
        "torchrun --nproc-per-node 2 -m raylight.cli trains --config c\n"
    )
    assert "no module raylight.horovd" in problems("mpirun -np 2 python -m raylight.horovd x.py\n")
    assert "no extra 'nope'" in problems("pip install -e '.[nope,tune]'\n")
    assert "no target 'runn'" in problems("make runn && python examples/nope.py\n")
    assert "examples/nope.py is not in the repository" in problems(
        "make run && python examples/nope.py\n"
    )


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runnable and b.not_run is None], ids=lambda b: b.id)
def test_the_checks_pass_the_blocks_that_run(block: Block):
    """No false alarms: a block that runs as written (test_doc_blocks_on_ray.py) passes its
    language's check too."""
    assert CHECKS[{"python": "python", "bash": "shell"}[block.lang]](block) == []


def test_the_config_check_validates_with_the_loader():
    assert check_config(_block("yaml", "trainer: {epochs: 3}\n", "config")) == []
    (problem,) = check_config(_block("yaml", "trainer: {epochz: 3}\n", "config"))
    assert "trainer.epochz" in problem and "did you mean 'epochs'" in problem
    assert check_config(_block("yaml", "- a\n", "config")) == [
        "a config is a mapping, this is list"
    ]
