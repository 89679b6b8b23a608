"""The shipped config/ and connectors/ are package data, found with importlib.resources (issue 10, item 10).

``scripts/check_wheel.py`` (run by ``scripts/test``) installs the built wheel into a fresh environment
and starts the daemon from it; these check the checkout's side of the same arrangement.
"""

from __future__ import annotations

import glob
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from sidecar import app

REPO = Path(__file__).resolve().parents[1]


def test_a_checkout_finds_the_repositorys_own_config_and_connectors() -> None:
    assert app.SHIPPED_BILLING == REPO / "config" / "high-credit-tools.json"
    assert app.SHIPPED_BILLING.is_file()
    assert app.SHIPPED_CONNECTORS == REPO / "connectors"
    assert (app.SHIPPED_CONNECTORS / "workspace" / "connector.json").is_file()


def test_the_package_data_names_every_shipped_file() -> None:
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["sidecar"]
    packaged = {
        Path(found).resolve()
        for pattern in patterns
        for found in glob.glob(str(REPO / "sidecar" / pattern), recursive=True)
        if Path(found).is_file()
    }
    shipped = [
        path
        for top in ("config", "connectors")
        for path in (REPO / top).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    ]
    assert len(shipped) >= 5  # the settings, the billing manifest, the workspace connector's files
    assert [str(p.relative_to(REPO)) for p in shipped if p.resolve() not in packaged] == []


@pytest.mark.slow
def test_the_first_scripts_run_says_what_it_does_and_hides_setuptools_noise(tmp_path: Path) -> None:
    # A fresh virtual environment, as on a newcomer's first run: each step is named, and the editable
    # install's "be careful" warning (expected) is not shown.
    env = {**os.environ, "SIDECAR_VENV": str(tmp_path / "venv"), "SIDECAR_HOME": str(tmp_path / "home")}
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "run"), "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("sidecar: ")]
    assert [line.split()[1] for line in lines] == ["creating", "installing", "installed"], result.stderr
    assert "careful" not in result.stderr and "Editable" not in result.stderr, result.stderr
    assert "usage: sidecar serve" in result.stdout
