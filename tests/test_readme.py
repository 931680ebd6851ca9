"""Every python block of the README runs as pasted (see ``tests/markdown_blocks.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .markdown_blocks import ROOT, Block, blocks, openai_url, params, run_block

__all__ = ["openai_url"]  # the fixture the blocks' tests use

BLOCKS = blocks(ROOT / "README.md")


def test_the_readme_blocks_are_found_and_none_is_a_fragment() -> None:
    python = [block for block in BLOCKS if block.lang == "python"]
    assert python, "the README's quickstart is a python block"
    fragments = [block.id for block in python if not block.runs]
    assert not fragments, f"fragments at {fragments}: the README's code runs as pasted"


def test_the_readme_is_short_and_links_into_the_docs() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).exists(), link


@pytest.mark.parametrize("block", params(BLOCKS))
def test_a_readme_block_runs_as_pasted(
    block: Block, tmp_path: Path, openai_url: str, request: pytest.FixtureRequest
) -> None:
    run_block(block, tmp_path, openai_url, request)
