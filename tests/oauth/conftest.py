"""Fixtures for the OAuth unit tests: the fake servers of ``fakes.py`` and a credential store's directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.oauth.fakes import FakeServers


@pytest.fixture
def servers() -> FakeServers:
    return FakeServers()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    return data
