"""One-time console codes and console sessions (``sidecar.auth.console``), on a clock the test moves."""

from __future__ import annotations

from sidecar.auth.console import CODE_TTL, MAX_CODES, SESSION_TTL, ConsoleSignIn, cookie_name


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_code_signs_in_once() -> None:
    signin = ConsoleSignIn(clock=Clock())
    code = signin.mint_code()
    first = signin.exchange(code)
    assert first is not None
    cookie, session = first
    assert signin.session(cookie) == session
    assert signin.exchange(code) is None


def test_a_code_dies_after_sixty_seconds_and_is_spent_by_a_late_try() -> None:
    clock = Clock()
    signin = ConsoleSignIn(clock=clock)
    code = signin.mint_code()
    clock.now += CODE_TTL
    assert signin.exchange(code) is None
    clock.now -= CODE_TTL  # even back in time, a code that was presented is gone
    assert signin.exchange(code) is None


def test_a_code_just_in_time_works() -> None:
    clock = Clock()
    signin = ConsoleSignIn(clock=clock)
    code = signin.mint_code()
    clock.now += CODE_TTL - 0.001
    assert signin.exchange(code) is not None


def test_a_console_session_expires_and_can_be_signed_out() -> None:
    clock = Clock()
    signin = ConsoleSignIn(clock=clock)
    exchanged = signin.exchange(signin.mint_code())
    assert exchanged is not None
    cookie, _ = exchanged
    clock.now += SESSION_TTL
    assert signin.session(cookie) is None
    exchanged = signin.exchange(signin.mint_code())
    assert exchanged is not None
    signin.sign_out(exchanged[0])
    assert signin.session(exchanged[0]) is None


def test_codes_cookies_and_tokens_are_distinct_secrets() -> None:
    signin = ConsoleSignIn(clock=Clock())
    code = signin.mint_code()
    exchanged = signin.exchange(code)
    assert exchanged is not None
    cookie, session = exchanged
    assert len({code, cookie, session.csrf}) == 3 and all(len(v) == 43 for v in (code, cookie, session.csrf))
    assert signin.session(code) is None and signin.session(session.csrf) is None


def test_the_csrf_check_takes_only_the_exact_token() -> None:
    signin = ConsoleSignIn(clock=Clock())
    exchanged = signin.exchange(signin.mint_code())
    assert exchanged is not None
    session = exchanged[1]
    assert session.csrf_matches(session.csrf)
    for wrong in (None, "", session.csrf[:-1], session.csrf + "x", "é" * 43, session.csrf.upper()):
        assert not session.csrf_matches(wrong)


def test_unspent_codes_are_bounded() -> None:
    signin = ConsoleSignIn(clock=Clock())
    first = signin.mint_code()
    for _ in range(MAX_CODES):
        signin.mint_code()
    assert signin.exchange(first) is None  # the oldest made room


def test_the_cookie_name_carries_the_port() -> None:
    assert cookie_name(8765) == "sidecar_console_8765"
