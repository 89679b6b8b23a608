"""The internal API's upstream rule: every escape from the declared upstream is refused before anything is sent."""

from __future__ import annotations

import pytest

from sidecar.errors import Forbidden
from sidecar.oauth.target import UpstreamRule

RULE = UpstreamRule(base_url="https://api.example.com/v3", paths=["/repos/", "/search/issues"], methods=["GET", "POST"])


def test_an_allowed_path_becomes_a_url_under_the_base_with_its_query_and_a_template_without_values() -> None:
    target = RULE.resolve("GET", "/repos/alice/secret-project/issues", "state=open&per_page=5")
    assert target.url == "https://api.example.com/v3/repos/alice/secret-project/issues?state=open&per_page=5"
    assert target.template == "/repos/*"
    assert RULE.resolve("POST", "/search/issues", "").template == "/search/issues"


@pytest.mark.parametrize(
    ("method", "path", "query"),
    [
        ("DELETE", "/repos/a/b", ""),  # a method not declared
        ("GET", "/user", ""),  # not under a declared prefix
        ("GET", "/repos/../user", ""),  # dot-dot
        ("GET", "/repos/./a", ""),
        ("GET", "/repos//evil.example/x", ""),  # empty segment
        ("GET", "/repos/a%2Fb", ""),  # an encoded slash
        ("GET", "/repos/a%2fb", ""),
        ("GET", "/repos/%2e%2e/user", ""),  # an encoded dot
        ("GET", "/repos/a%5Cb", ""),  # an encoded backslash
        ("GET", "/repos/a%40evil.example", ""),  # an encoded @
        ("GET", "/repos/a%252Fb", ""),  # a double escape
        ("GET", "/repos/a%zz", ""),  # a malformed escape
        ("GET", "/repos/user@evil.example/x", ""),  # @
        ("GET", "/repos/a\\b", ""),  # backslash
        ("GET", "/repos/http://evil.example/", ""),  # an absolute URL (it has '//')
        ("GET", "/repos/a b", ""),  # a space
        ("GET", "/repos/a", "x=1#frag"),  # a fragment in the query
        ("GET", "/repos/a", "x=\r\nHost: evil"),  # header injection
    ],
)
def test_every_escape_is_refused(method: str, path: str, query: str) -> None:
    with pytest.raises(Forbidden):
        RULE.resolve(method, path, query)


def test_a_redirect_stays_on_the_same_origin_base_path_and_prefixes() -> None:
    assert RULE.check_url("https://api.example.com/v3/repos/a/b").template == "/repos/*"
    for url in (
        "https://evil.example/v3/repos/a",
        "http://api.example.com/v3/repos/a",  # another scheme is another origin
        "https://api.example.com:8443/v3/repos/a",
        "https://api.example.com/v4/repos/a",
        "https://api.example.com/v3/user",
        "https://api.example.com/v3/repos/%2e%2e/user",
    ):
        with pytest.raises(Forbidden):
            RULE.check_url(url)


def test_a_root_prefix_allows_every_plain_path_but_still_no_escape() -> None:
    rule = UpstreamRule(base_url="http://127.0.0.1:9000", paths=["/"], methods=["GET"])
    assert rule.resolve("GET", "/anything/at/all", "").url == "http://127.0.0.1:9000/anything/at/all"
    with pytest.raises(Forbidden):
        rule.resolve("GET", "/a/../../b", "")
