"""oauth-client.json: strict, every problem naming the file and the field."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sidecar.connectors.manifest.sources import load_package
from sidecar.errors import ConfigError

GOOD: dict[str, Any] = {
    "authorization_endpoint": "https://github.com/login/oauth/authorize",
    "token_endpoint": "https://github.com/login/oauth/access_token",
    "scopes": ["repo"],
    "authorize_params": {"prompt": "consent", "access_type": "offline"},
    "upstream": {"base_url": "https://api.github.com", "paths": ["/repos/", "/search/"], "methods": ["GET", "POST"]},
}


def _package(tmp_path: Path, oauth: dict[str, Any]) -> Path:
    directory = tmp_path / "gh"
    directory.mkdir()
    files = {
        "connector.json": {"id": "gh", "name": "GH", "description": "d", "version": "1", "type": "mcp"},
        "mcp.json": {"mcpServers": {"gh": {"command": "python3", "args": ["${SIDECAR_CONNECTOR_ROOT}/s.py"]}}},
        "oauth-client.json": oauth,
    }
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content))
        os.chmod(directory / name, 0o600)
    return directory


def test_a_provider_without_a_client_id_in_the_package_loads_with_its_upstream_and_parameters(tmp_path: Path) -> None:
    spec = load_package(_package(tmp_path, GOOD))
    assert spec.oauth is not None
    assert spec.oauth.client_id is None  # the user's own OAuth app: connect --client-id
    assert spec.oauth.pkce is True
    assert dict(spec.oauth.authorize_params) == {"prompt": "consent", "access_type": "offline"}
    assert spec.oauth.upstream.paths == ("/repos/", "/search/")


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"colour": "blue"}, "colour", "unknown key"),
        ({"token_endpoint": "http://auth.example/token"}, "token_endpoint", "only to loopback"),
        ({"token_endpoint": "ftp://auth.example/token"}, "token_endpoint", "scheme must be http or https"),
        ({"issuer": "https://auth.example"}, "authorization_endpoint", "either issuer"),
        ({"authorize_params": {"redirect_uri": "https://evil.example"}}, "authorize_params", "set by sidecar"),
        ({"upstream": {**GOOD["upstream"], "paths": ["/repos/../admin"]}}, "upstream.paths[0]", "'..'"),
        ({"upstream": {**GOOD["upstream"], "paths": ["/a%2Fb"]}}, "upstream.paths[0]", "'%'"),
        ({"upstream": {**GOOD["upstream"], "methods": ["CONNECT"]}}, "upstream.methods[0]", "got 'CONNECT'"),
        ({"upstream": {**GOOD["upstream"], "base_url": "javascript:alert(1)"}}, "upstream.base_url", "scheme"),
        ({"upstream": {**GOOD["upstream"], "extra": 1}}, "upstream.extra", "unknown key"),
        ({"pkce": "no"}, "pkce", "true or false"),
    ],
)
def test_a_wrong_field_is_an_error_naming_file_and_field(
    tmp_path: Path, change: dict[str, Any], field: str, words: str
) -> None:
    directory = _package(tmp_path, {**GOOD, **change})
    with pytest.raises(ConfigError) as caught:
        load_package(directory)
    message = str(caught.value)
    assert f"{directory / 'oauth-client.json'}: {field}: " in message, message
    assert words in message, message


def test_show_tells_the_upstream_and_a_provider_without_pkce(tmp_path: Path) -> None:
    from sidecar.connectors.manager import Connector, ConnectorState

    spec = load_package(_package(tmp_path, {**GOOD, "pkce": False}))
    shown = Connector(spec, "key", ConnectorState.CONFIGURED).public(detail=True)
    assert shown["oauth_pkce"] == "none: the provider has no PKCE; the sign-in relies on state alone"
    assert shown["oauth_client"] == "(yours: connect --client-id)"
    assert shown["upstream"] == "https://api.github.com GET, POST /repos/ /search/"
