"""Where the default store URL comes from: environment, project files, built-in default."""

from __future__ import annotations

from pathlib import Path

import pytest

from statekernel._storage.config import DEFAULT_STORE_URL, ENV_VAR, default_store_url
from statekernel.errors import ConfigError


def test_built_in_default(tmp_path: Path) -> None:
    """Outside a project: ``.statekernel/runs.db`` in the working directory."""
    default = f"sqlite:///{tmp_path}/.statekernel/runs.db"
    assert default_store_url(environ={}, cwd=tmp_path) == default
    assert DEFAULT_STORE_URL == "sqlite:///.statekernel/runs.db"


def test_from_a_subfolder_the_projects_config_and_default_are_found(tmp_path: Path) -> None:
    deep = tmp_path / "src" / "app"
    deep.mkdir(parents=True)
    (tmp_path / ".git").mkdir()  # the project's root
    root_default = f"sqlite:///{tmp_path}/.statekernel/runs.db"
    assert default_store_url(environ={}, cwd=deep) == root_default
    (tmp_path / "statekernel.toml").write_text(
        'store = "sqlite:///data/runs.db?synchronous=normal"\n'
    )
    found = f"sqlite:///{tmp_path}/data/runs.db?synchronous=normal"  # relative to the file
    assert default_store_url(environ={}, cwd=deep) == found
    (tmp_path / "src" / "pyproject.toml").write_text('[project]\nname = "inner"\n')
    inner_default = f"sqlite:///{tmp_path}/src/.statekernel/runs.db"  # a nearer root
    assert default_store_url(environ={}, cwd=deep) == inner_default


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("statekernel.toml", 'store = "memory://x"\nstroe = "typo"\n'),
        ("pyproject.toml", '[tool.statekernel]\nstores = "memory://x"\n'),
    ],
)
def test_an_unknown_key_names_the_file_and_the_key(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match="unknown key") as info:
        default_store_url(environ={}, cwd=tmp_path)
    assert str(tmp_path / name) in str(info.value)
    assert ("stroe" if name == "statekernel.toml" else "stores") in str(info.value)


def test_environment_comes_first(tmp_path: Path) -> None:
    (tmp_path / "statekernel.toml").write_text('store = "file:///from/toml"\n')
    env = {ENV_VAR: "  redis://127.0.0.1:6379/0  "}
    assert default_store_url(environ=env, cwd=tmp_path) == "redis://127.0.0.1:6379/0"
    assert default_store_url(environ={ENV_VAR: "   "}, cwd=tmp_path) == "file:///from/toml"


def test_process_environment_and_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV_VAR, raising=False)
    (tmp_path / "statekernel.toml").write_text('store = "memory://cwd"\n')
    assert default_store_url() == "memory://cwd"
    monkeypatch.setenv(ENV_VAR, "memory://env")
    assert default_store_url() == "memory://env"


def test_statekernel_toml(tmp_path: Path) -> None:
    (tmp_path / "statekernel.toml").write_text('# runs\nstore = "sqlite:///runs/here.db"\n')
    here = f"sqlite:///{tmp_path}/runs/here.db"  # relative to the file's folder
    assert default_store_url(environ={}, cwd=tmp_path) == here


def test_tool_section_of_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.statekernel]\nstore = "file:///var/runs"\n'
    )
    assert default_store_url(environ={}, cwd=tmp_path) == "file:///var/runs"


def test_statekernel_toml_before_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.statekernel]\nstore = "memory://py"\n')
    (tmp_path / "statekernel.toml").write_text('store = "memory://sk"\n')
    assert default_store_url(environ={}, cwd=tmp_path) == "memory://sk"


@pytest.mark.parametrize(
    "text",
    [
        '[project]\nname = "x"\n',
        '[tool.other]\nstore = "memory://not-ours"\n',
        'store = "memory://top-level-is-not-read-in-pyproject"\n',
        "[tool]\nstatekernel = 3\n",
    ],
)
def test_pyproject_without_a_store_falls_through(tmp_path: Path, text: str) -> None:
    (tmp_path / "pyproject.toml").write_text(text)
    default = f"sqlite:///{tmp_path}/.statekernel/runs.db"
    assert default_store_url(environ={}, cwd=tmp_path) == default


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("statekernel.toml", 'store = "unclosed\n'),
        ("statekernel.toml", "store = \n"),
        ("pyproject.toml", "[tool.statekernel\nstore = 'x'\n"),
        ("statekernel.toml", b"store = '\xff\xfe'\n"),
    ],
)
def test_malformed_file_names_the_file(tmp_path: Path, name: str, text: str | bytes) -> None:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ConfigError) as info:
        default_store_url(environ={}, cwd=tmp_path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("value", ["3", '""', '"   "', "['memory://']", "{ url = 'x' }"])
def test_store_that_is_not_a_url_string_names_the_file(tmp_path: Path, value: str) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text(f"[tool.statekernel]\nstore = {value}\n")
    with pytest.raises(ConfigError, match="store") as info:
        default_store_url(environ={}, cwd=tmp_path)
    assert str(path) in str(info.value)


def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "statekernel.toml").mkdir()
    with pytest.raises(ConfigError) as info:
        default_store_url(environ={}, cwd=tmp_path)
    assert "statekernel.toml" in str(info.value)


def test_a_project_folder_with_url_characters_in_its_name(tmp_path: Path) -> None:
    from statekernel.stores import SQLiteStore, open_store

    odd = tmp_path / "C# proj?x"
    odd.mkdir()
    (odd / ".git").mkdir()
    url = default_store_url(environ={}, cwd=odd)
    store = open_store(url)
    assert isinstance(store, SQLiteStore)
    assert store.path == str(odd / ".statekernel" / "runs.db")
