"""The agent an option names (``package.module:attribute``): a factory or a mapping of
``Kernel`` keyword arguments; anything else is a ``ConfigError`` naming the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from statekernel._front.agents import load_agent, load_named
from statekernel.errors import ConfigError


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_agent_options.py").write_text(
        "OPTIONS = {'max_turns': 3}\n"
        "def make():\n    return {'max_turns': 4}\n"
        "def bad():\n    return 5\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_agent_options"


def test_load_agent_calls_a_factory_or_takes_a_mapping(module: str) -> None:
    assert load_agent(None) == {}
    assert load_agent(f"{module}:OPTIONS") == {"max_turns": 3}
    assert load_agent(f"{module}:make") == {"max_turns": 4}
    with pytest.raises(
        ConfigError, match=r"--agent 'my_agent_options:bad' gave int, not a mapping"
    ):
        load_agent(f"{module}:bad")


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("no_colon", r"agent must look like package.module:function, got 'no_colon'"),
        ("my_agent_options:missing", r"cannot load agent 'my_agent_options:missing'"),
        ("no_such_module_here:x", r"cannot load agent 'no_such_module_here:x'"),
    ],
)
def test_a_name_that_cannot_be_loaded_is_named_with_its_option(
    module: str, spec: str, said: str
) -> None:
    with pytest.raises(ConfigError, match=said):
        load_named("agent", spec)
