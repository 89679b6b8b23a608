"""One-time console codes and console sessions (``sidecar.auth.console``), on a clock the test moves."""

from __future__ import annotations

from sidecar.auth.console import CODE_TTL, IDLE_TTL, MAX_CODES, SESSION_TTL, ConsoleSignIn


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_code_signs_in_once() -> None:
    signin = ConsoleSignIn(clock=Clock())
    code = signin.mint_code()
    secret = signin.exchange(code)
    assert secret is not None and signin.session(secret) is not None
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
    secret = signin.exchange(signin.mint_code())
    assert secret is not None
    clock.now += SESSION_TTL
    assert signin.session(secret) is None
    secret = signin.exchange(signin.mint_code())
    assert secret is not None
    signin.sign_out(secret)
    assert signin.session(secret) is None


def test_a_session_in_use_lives_on_and_an_idle_one_ends() -> None:
    clock = Clock()
    signin = ConsoleSignIn(clock=clock)
    secret = signin.exchange(signin.mint_code())
    assert secret is not None
    for _ in range(3):  # used just inside the idle bound, again and again: it lives past it
        clock.now += IDLE_TTL - 1
        assert signin.session(secret) is not None
    clock.now += IDLE_TTL
    assert signin.session(secret) is None
    clock.now -= IDLE_TTL  # ended for good, not merely hidden
    assert signin.session(secret) is None


def test_codes_and_secrets_are_distinct_and_only_the_exact_secret_works() -> None:
    signin = ConsoleSignIn(clock=Clock())
    code = signin.mint_code()
    secret = signin.exchange(code)
    assert secret is not None and secret != code and len(secret) == len(code) == 43
    for wrong in (code, None, "", secret[:-1], secret + "x", "é" * 43, secret.upper(), "x" * 5000):
        assert signin.session(wrong) is None, wrong


def test_unspent_codes_are_bounded() -> None:
    signin = ConsoleSignIn(clock=Clock())
    first = signin.mint_code()
    for _ in range(MAX_CODES):
        signin.mint_code()
    assert signin.exchange(first) is None  # the oldest made room
