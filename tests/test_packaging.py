"""The wheel as published: built from the source tree with the declared build backend
(offline, no build isolation), it carries the license file and the PEP 639 metadata, and
its engine extras install from binary wheels alone in a fresh environment."""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "statekernel", "stores", "providers")
"""What the wheel is built from (copied, so the build writes nothing into the work tree)."""


def _backend_installed() -> None:
    """Fail, saying how to fix it, unless this environment has the build backend at a
    version ``[build-system]`` accepts (the build runs without isolation)."""
    for text in PYPROJECT["build-system"]["requires"]:
        requirement = Requirement(text)
        found = Version(version(requirement.name))
        assert requirement.specifier.contains(found, prereleases=True), (
            f"{requirement.name} {found} is installed, the build needs {requirement}:"
            " pip install -e '.[test]'"
        )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built by pip with the installed backend and no index."""
    _backend_installed()
    tree = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            ignored = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(source, tree / name, ignore=ignored)
        else:
            shutil.copy2(source, tree / name)
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps"]
    command += ["--no-index", "--quiet", "--wheel-dir", str(out), str(tree)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    (found,) = out.glob("statekernel-*.whl")
    return found


def _dist_info(names: list[str]) -> str:
    (info,) = {name.split("/")[0] for name in names if ".dist-info/" in name}
    return info


def test_the_wheel_ships_the_license_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = _dist_info(names)
        license_text = archive.read(f"{info}/licenses/LICENSE").decode()
    assert license_text == (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text
    assert "Version 2.0, January 2004" in license_text
    # the vendored htmx keeps its own license beside it
    assert "statekernel/web/static/LICENSE-htmx" in names


def test_the_metadata_declares_the_license_expression_and_urls(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        info = _dist_info(archive.namelist())
        metadata = email.parser.HeaderParser().parsestr(archive.read(f"{info}/METADATA").decode())
    assert Version(metadata["Metadata-Version"]) >= Version("2.4")
    assert metadata["License-Expression"] == PYPROJECT["project"]["license"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["License"] is None, "the deprecated License field is not written"
    classifiers = metadata.get_all("Classifier") or []
    assert classifiers == PYPROJECT["project"]["classifiers"]
    assert not [c for c in classifiers if c.startswith("License ::")], (
        "PEP 639: the license expression replaces License classifiers"
    )
    urls = dict(line.split(", ", 1) for line in metadata.get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Documentation", "Changelog", "Issues"}
    assert urls == PYPROJECT["project"]["urls"]


def test_the_wheel_ships_every_module_of_the_source_tree(wheel: Path) -> None:
    """``[tool.setuptools] packages`` lists the packages by hand: a new one left out
    would be missing from every regular install, though an editable one finds it."""
    with zipfile.ZipFile(wheel) as opened:
        shipped = {name for name in opened.namelist() if name.endswith(".py")}
    folders = {"statekernel": "statekernel", "stores": "statekernel/stores"}
    folders["providers"] = "statekernel/providers"
    expected = set()
    for folder, installed in folders.items():
        for path in (ROOT / folder).rglob("*.py"):
            expected.add(f"{installed}/{path.relative_to(ROOT / folder).as_posix()}")
    assert sorted(expected - shipped) == []


ENGINES_CHECK = """
import os, sys, tempfile
import temporalio.runtime
from dbos import DBOS
import psycopg
import statekernel as sk
from statekernel.integrations import temporal
from statekernel.integrations.dbos import StatekernelDBOS
from statekernel.providers import ScriptedProvider

temporalio.runtime.Runtime(telemetry=temporalio.runtime.TelemetryConfig())  # its native core
assert psycopg.pq.__impl__ == "binary", psycopg.pq.__impl__  # libpq from the wheel
folder = tempfile.mkdtemp()
store = f"sqlite:///{folder}/runs.db"
DBOS(config={"name": "check", "system_database_url": f"sqlite:///{folder}/dbos.sqlite"})
app = StatekernelDBOS(
    lambda: sk.Kernel(store, providers={"scripted": ScriptedProvider(["Hello."])}),
    queue="agents",
)
DBOS.launch()
DBOS.register_queue("agents", polling_interval_sec=0.05)
segment = app.start(model="scripted/m", messages=["Hi"], run_id="r1").get_result()
print(segment["state"], temporal.workflow_id("r1"))
app.close()
DBOS.destroy()
"""
"""Run in the fresh environment: both engines' libraries load (Temporal's native core,
psycopg's bundled libpq) and a run goes through DBOS on SQLite."""


@pytest.mark.slow
def test_the_engine_extras_install_from_wheels_alone_and_run(wheel: Path, tmp_path: Path) -> None:
    """``statekernel[dbos,temporal]`` installs in a fresh environment from binary wheels
    alone (no compiler, no system library: what a machine with only Python has), and
    works there."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    command = [python, "-m", "pip", "install", "--quiet", "--only-binary=:all:"]
    done = subprocess.run(
        [*command, f"{wheel}[dbos,temporal]"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
    env = {"PATH": str(venv / "bin"), "PSYCOPG_IMPL": "binary", "HOME": str(tmp_path)}
    ran = subprocess.run(
        [python, "-I", "-c", ENGINES_CHECK],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.split() == ["completed", "statekernel-run-r1"]
