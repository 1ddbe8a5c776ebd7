"""Every code block of the README and docs is run by tests/project/test_doc_blocks_on_ray.py, or says
why it cannot run on one machine (tests/doc_blocks.py); the README stays short."""

from __future__ import annotations

import pytest

from tests.doc_blocks import PAGES, ROOT, Block, all_blocks, blocks

BLOCKS = all_blocks()


def test_every_not_run_comment_gives_a_reason():
    bare = [b.id for b in BLOCKS if b.not_run is not None and not b.not_run]
    assert not bare, f"<!-- not-run: REASON --> needs a reason: {bare}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.not_run], ids=lambda b: b.id)
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
