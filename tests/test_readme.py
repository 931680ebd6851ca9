"""Every python block of the README runs as pasted (see ``tests/markdown_blocks.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .markdown_blocks import ROOT, Block, blocks, openai_url, params, run_block

__all__ = ["openai_url"]  # the fixture the blocks' tests use

BLOCKS = blocks(ROOT / "README.md")


def test_the_readme_blocks_are_found_and_few_are_fragments() -> None:
    python = [block for block in BLOCKS if block.lang == "python"]
    assert len(python) >= 2
    fragments = [block.id for block in python if not block.runs]
    assert len(fragments) <= 1, f"fragments at {fragments}: make them run"


@pytest.mark.parametrize("block", params(BLOCKS))
def test_a_readme_block_runs_as_pasted(
    block: Block, tmp_path: Path, openai_url: str, request: pytest.FixtureRequest
) -> None:
    run_block(block, tmp_path, openai_url, request)
