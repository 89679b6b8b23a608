"""The pure guard checks: table tests of what passes and what is refused, plus properties on random text."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.config import parse_origin
from sidecar.errors import FetchSiteRejected, HostRejected, OriginRejected
from sidecar.net.hostcheck import check_fetch_site, check_host, check_origin, check_target

PORT = 8765
EXACT_HOSTS = (f"127.0.0.1:{PORT}", f"localhost:{PORT}", f"[::1]:{PORT}")
ALLOWED = frozenset(
    parse_origin(o) for o in (f"http://localhost:{PORT}", "https://app.example.com", f"http://[::1]:{PORT}")
)
PROPERTY_SETTINGS = settings(
    max_examples=400, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# --- Host ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        f"127.0.0.1:{PORT}",
        f"localhost:{PORT}",
        f"LOCALHOST:{PORT}",
        f"LocalHost:{PORT}",
        f"[::1]:{PORT}",
    ],
)
def test_host_accepts_the_three_loopback_forms_with_the_listening_port(value: str) -> None:
    check_host([value], port=PORT)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "127.0.0.1",
        "localhost",
        "[::1]",
        f"::1:{PORT}",
        f"[::1]{PORT}",
        f"[0:0:0:0:0:0:0:1]:{PORT}",
        f"127.0.0.1:{PORT}.",
        f"127.0.0.1.:{PORT}",
        f"localhost.:{PORT}",
        f"127.0.0.1:0{PORT}",
        f"127.0.0.1:{PORT}0",
        f"127.0.0.1:{PORT + 1}",
        f"127.0.0.1:+{PORT}",
        "127.0.0.1:",
        f"user@127.0.0.1:{PORT}",
        f"127.0.0.1:{PORT}@evil.com",
        "evil.com",
        f"evil.com:{PORT}",
        f"localhost.evil.com:{PORT}",
        f"127.0.0.1:{PORT}, evil",
        f" 127.0.0.1:{PORT}",
        f"127.0.0.1:{PORT} ",
        f"127.0.0.1 :{PORT}",
        f"127.0.0.1:{PORT}/x",
        f"127.0.0.2:{PORT}",
        f"0.0.0.0:{PORT}",
        f"2130706433:{PORT}",
        "127.0.0.1:\uff18\uff17\uff16\uff15",  # fullwidth digits
        f"localhost:{PORT}\x00",
    ],
)
def test_host_refuses_anything_else(value: str) -> None:
    with pytest.raises(HostRejected) as info:
        check_host([value], port=PORT)
    assert f"127.0.0.1:{PORT}" in str(info.value)  # the remedy names the right Host


@pytest.mark.parametrize(
    "values",
    [
        [],
        [f"127.0.0.1:{PORT}", f"127.0.0.1:{PORT}"],
        [f"127.0.0.1:{PORT}", "evil.com"],
        ["evil.com", f"127.0.0.1:{PORT}"],
    ],
)
def test_host_must_be_exactly_one_header(values: list[str]) -> None:
    with pytest.raises(HostRejected):
        check_host(values, port=PORT)


def test_host_message_names_the_problem_and_only_the_log_detail_shows_the_value() -> None:
    with pytest.raises(HostRejected) as info:
        check_host(["evil\n<script>" + "x" * 10_000], port=PORT)
    message = str(info.value)
    assert "evil" not in message and "<script>" not in message and "xxx" not in message
    assert "characters outside a loopback host:port" in message
    assert info.value.sent is not None
    assert info.value.sent.startswith("'evil\\n<script>")  # repr'd: no raw newline for the log
    assert "\n" not in info.value.sent
    assert len(info.value.sent) <= 100


def test_host_with_an_impossible_listening_port_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="port"):
        check_host([f"127.0.0.1:{PORT}"], port=0)


@PROPERTY_SETTINGS
@given(value=st.text(), port=st.integers(min_value=1, max_value=65535))
def test_no_random_host_passes_unless_it_is_an_exact_form(value: str, port: int) -> None:
    _assert_host_exact(value, port)


@PROPERTY_SETTINGS
@given(
    exact=st.sampled_from(EXACT_HOSTS),
    prefix=st.text(max_size=3),
    suffix=st.text(max_size=3),
    flip_case=st.lists(st.booleans(), min_size=16, max_size=16),
)
def test_no_near_miss_of_an_exact_form_passes(exact: str, prefix: str, suffix: str, flip_case: list[bool]) -> None:
    cased = "".join(c.upper() if flip else c for c, flip in zip(exact, flip_case, strict=False))
    _assert_host_exact(prefix + cased + suffix, PORT)


def _assert_host_exact(value: str, port: int) -> None:
    exact = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
    should_pass = value.isascii() and value.lower() in exact
    try:
        check_host([value], port=port)
    except HostRejected:
        assert not should_pass
    else:
        assert should_pass


# --- Origin ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        [],
        [f"http://localhost:{PORT}"],
        [f"HTTP://LOCALHOST:{PORT}"],
        ["https://app.example.com"],
        ["https://app.example.com:443"],
        [f"http://[::1]:{PORT}"],
    ],
)
def test_origin_absent_or_exactly_allowed_passes(values: list[str]) -> None:
    check_origin(values, allowed=ALLOWED)


@pytest.mark.parametrize(
    "value",
    [
        "null",
        "NULL",
        "",
        " ",
        f"http://localhost:{PORT}0",
        f"http://localhost:0{PORT}",
        "http://localhost",
        "http://localhost:",
        f"https://localhost:{PORT}",
        f"http://127.0.0.1:{PORT}",
        f"http://localhost:{PORT}/path",
        f"http://localhost:{PORT}/",
        f"http://localhost:{PORT}?q=1",
        f"http://localhost:{PORT}#f",
        f"http://user@localhost:{PORT}",
        f"http://localhost:{PORT}@evil.com",
        f"http://loc\talhost:{PORT}",
        f"http://localhost:{PORT} ",
        f"localhost:{PORT}",
        f"ws://localhost:{PORT}",
        "file://",
        "https://example.com.evil.com",
        "https://app.example.com.evil.com",
        "https://app.example.comedy",
        "https://evil.com/app.example.com",
        "http://app.example.com",
        "https://app.example.com:8443",
        f"http://localhost:{PORT}, https://app.example.com",
        "https://app.ex\u0430mple.com",
    ],
)
def test_origin_refuses_null_empty_unparsable_and_unlisted(value: str) -> None:
    with pytest.raises(OriginRejected):
        check_origin([value], allowed=ALLOWED)


def test_origin_refuses_more_than_one_value_even_if_each_is_allowed() -> None:
    with pytest.raises(OriginRejected):
        check_origin([f"http://localhost:{PORT}", f"http://localhost:{PORT}"], allowed=ALLOWED)


def test_origin_is_refused_when_nothing_is_allowed() -> None:
    with pytest.raises(OriginRejected):
        check_origin([f"http://127.0.0.1:{PORT}"], allowed=frozenset())


@PROPERTY_SETTINGS
@given(values=st.lists(st.text(), max_size=3))
def test_origin_never_raises_anything_but_origin_rejected(values: list[str]) -> None:
    with contextlib.suppress(OriginRejected):
        check_origin(values, allowed=ALLOWED)


@PROPERTY_SETTINGS
@given(
    value=st.one_of(
        st.text(),
        st.builds(
            "{}://{}{}".format,
            st.sampled_from(["http", "https", "HTTP", "ws", ""]),
            st.sampled_from(["localhost", "app.example.com", "[::1]", "LocalHost", "user@localhost"]),
            st.one_of(st.just(""), st.text(max_size=6).map(lambda s: ":" + s)),
        ),
    )
)
def test_an_accepted_origin_is_one_the_settings_parser_maps_to_an_allowed_tuple(value: str) -> None:
    try:
        check_origin([value], allowed=ALLOWED)
    except OriginRejected:
        return
    assert parse_origin(value) in ALLOWED


# --- Sec-Fetch-Site --------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[], ["same-origin"], ["none"], ["Same-Origin"], ["NONE"], ["same-origin", "none"]])
def test_fetch_site_same_origin_none_or_absent_passes(values: list[str]) -> None:
    check_fetch_site(values)


@pytest.mark.parametrize(
    "values",
    [
        ["cross-site"],
        ["same-site"],
        ["CROSS-SITE"],
        ["Same-Site"],
        ["same-origin", "cross-site"],
        ["same-origin, same-site"],
        ["bogus"],
        [""],
    ],
)
def test_fetch_site_cross_site_same_site_and_unknown_are_refused(values: list[str]) -> None:
    with pytest.raises(FetchSiteRejected):
        check_fetch_site(values)


# --- Request target --------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["/", "/mcp", "/mcp?x=1", "/a//b", "/%2F%2Fevil"])
def test_target_origin_form_passes(target: str) -> None:
    check_target(target)


@pytest.mark.parametrize(
    "target",
    [
        "//evil.com/x",
        "http://evil/x",
        "HTTP://EVIL/x",
        f"http://127.0.0.1:{PORT}/mcp",
        "https://evil.com/",
        "evil.com:443",
        "*",
        "",
        "mcp",
    ],
)
def test_target_other_than_origin_form_is_refused_as_a_host_problem(target: str) -> None:
    with pytest.raises(HostRejected) as info:
        check_target(target)
    assert info.value.status == 403


def test_target_message_names_the_form_and_the_log_detail_never_shows_the_query_string() -> None:
    with pytest.raises(HostRejected) as info:
        check_target("http://evil.com/cb?code=SECRETCODE#frag")
    assert "SECRETCODE" not in str(info.value) and "evil.com" not in str(info.value)
    assert "absolute-form" in str(info.value)
    assert info.value.sent is not None
    assert "SECRETCODE" not in info.value.sent
    assert "evil.com/cb" in info.value.sent
