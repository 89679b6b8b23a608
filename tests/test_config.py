"""Settings: the repo's config/sidecar.toml restates the code's defaults; bad input names file and field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sidecar.config import ConnectorSettings, Settings, check_bind_host, load_settings, parse_origin
from sidecar.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_repo_defaults_file_validates_and_equals_the_code_defaults() -> None:
    data = tomllib.loads((REPO / "config" / "sidecar.toml").read_text())
    assert Settings.model_validate(data) == Settings()
    # Every field of the model is written down in the file (nothing silently defaulted).
    assert set(data) == set(Settings.model_fields)
    for section in ("limits", "mcp", "sessions", "tools", "connectors"):
        fields = type(getattr(Settings(), section)).model_fields
        # TOML has no null: a field whose default is "unset" is written as a comment.
        assert set(data[section]) == {name for name, info in fields.items() if info.default is not None}


def test_precedence_is_defaults_then_file_then_env_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "sidecar.toml"
    file.write_text('port = 1111\nallowed_origins = ["http://localhost:3000"]\n[limits]\nmax_json_depth = 10\n')
    assert load_settings(file, env={}).port == 1111
    assert load_settings(file, env={"SIDECAR_PORT": "2222"}).port == 2222
    assert load_settings(file, env={"SIDECAR_PORT": "2222"}, overrides={"port": 3333}).port == 3333
    settings = load_settings(file, env={})
    assert settings.limits.max_json_depth == 10 and settings.limits.max_body_bytes == Settings().limits.max_body_bytes
    assert settings.origin_tuples() == {("http", "localhost", 3000)}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('port = "x"', "port"),
        ("[limits]\nmax_json_depth = 1", "limits.max_json_depth"),
        ("[limits]\nconnections_per_uid = 0", "limits.connections_per_uid"),
        ('host = "0.0.0.0"', "host"),
        ('allowed_origins = ["http://a.example/path"]', "allowed_origins"),
        ("surprise = 1", "surprise"),
    ],
)
def test_bad_settings_name_the_file_and_the_field(tmp_path: Path, text: str, field: str) -> None:
    file = tmp_path / "sidecar.toml"
    file.write_text(text + "\n")
    with pytest.raises(ConfigError) as err:
        load_settings(file, env={})
    assert str(file) in str(err.value) and field in str(err.value)


def test_unparsable_settings_file_is_a_clear_error(tmp_path: Path) -> None:
    file = tmp_path / "sidecar.toml"
    file.write_text("port = = 3\n")
    with pytest.raises(ConfigError, match="cannot read settings"):
        load_settings(file, env={})


@pytest.mark.parametrize("host", ["0.0.0.0", "::1", "::", "192.168.1.10", "localhost", "127.0.0.2"])
def test_only_127_0_0_1_may_be_bound(host: str) -> None:
    with pytest.raises(ConfigError, match=r"127\.0\.0\.1"):
        check_bind_host(host)
    check_bind_host("127.0.0.1")


@pytest.mark.parametrize(
    ("origin", "parsed"),
    [("http://localhost:3000", ("http", "localhost", 3000)), ("https://App.example", ("https", "app.example", 443))],
)
def test_origins_parse_to_tuples_with_default_ports(origin: str, parsed: tuple[str, str, int]) -> None:
    assert parse_origin(origin) == parsed


def test_the_share_of_a_session_stays_below_the_whole_connector() -> None:
    assert ConnectorSettings(max_per_session=4, max_per_connector=4).session_share == 3
    assert ConnectorSettings(max_per_session=2, max_per_connector=4).session_share == 2
    assert ConnectorSettings(max_per_session=4, max_per_connector=1).session_share == 1
