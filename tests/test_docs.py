"""The README stays a guide that tells the truth: what it shows exists, and it stays short.

Every ``sidecar …`` command the README shows (in a shell block or an inline code span, and
``scripts/run …``, which passes its flags to ``sidecar serve``) must be a real command, and each of its
``--flags`` must be in that command's ``--help``. The help is the argparse parser's own, asked in-process
through ``sidecar.cli.main([..., "--help"])``: no daemon, no subprocess. A flag shown on its own
(`` `--ttl 90m` ``) must be in some command's help. Every config key named as ``[section] key`` or
``key = value`` must be a field of the settings model, every repository path the README links or quotes
must exist, the README stays at most 400 lines, and a measured time ("about 2 s", "0.7 ms") appears only
beside the date it was measured — such figures belong in docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.config import Settings

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES = 400

_FENCE = re.compile(r"^( *)```([\w-]*)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
_SHELL = {"", "bash", "sh", "shell", "console"}
_SPAN = re.compile(r"`([^`\n]+)`")
_ARGS = r"((?:[^|;&>)#`\n]|(?<!\s)>)*)"  # up to a pipe, a redirection (` > `), a comment; <id> stays
_SIDECAR = re.compile(r"(?<![\w./-])(?:\.venv/bin/)?sidecar[ \t]+(?=[a-z-])" + _ARGS)
_SCRIPTS_RUN = re.compile(r"(?<![\w./-])scripts/run[ \t]+(?=-)" + _ARGS)
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_GROUP_USAGE = re.compile(r"\b(?:COMMAND|ACTION) \.\.\.")
_SUBCOMMAND = re.compile(r"^ {4}([a-z][a-z-]*)(?: {2,}|$)", re.MULTILINE)
_SECTION_KEY = re.compile(r"^\[(\w+)\](?:\s+(\w+))?")
_ASSIGNMENT = re.compile(r"^(\w+) = \S")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_REPO_PATH = re.compile(r"^(?:docs|config|connectors|scripts|tests|sidecar|\.ci)/[\w./-]*$")
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
_NUMBER = r"\d[\d.,]*(?:\s*[\u2013-]\s*\d[\d.,]*)?"  # 43-47, or with an en dash
_TIME_CLAIMS = (
    re.compile(rf"(?:about|around|roughly|~|≈)\s*{_NUMBER}\s*(?:ms|µs|s|seconds?|minutes?)\b"),
    re.compile(rf"{_NUMBER}\s*(?:ms|µs)\b"),
    re.compile(rf"{_NUMBER}\s*s wall\b"),
)


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _shell_lines(text: str) -> list[str]:
    """The lines of the README's shell blocks, continuations joined."""
    lines: list[str] = []
    for found in _FENCE.finditer(text):
        if found[2] in _SHELL:
            lines += found[3].replace("\\\n", " ").splitlines()
    return lines


def _prose(text: str) -> str:
    """The README without its fenced blocks, one paragraph a line (inline spans may wrap)."""
    return "\n".join(p.replace("\n", " ") for p in _FENCE.sub("", text).split("\n\n"))


def _spans(text: str) -> list[str]:
    return [span.strip() for span in _SPAN.findall(_prose(text))]


def shown_commands(text: str) -> list[str]:
    """Every ``sidecar …`` invocation the README shows, as the words after ``sidecar``."""
    found: list[str] = []
    for source in [*_shell_lines(text), *_spans(text)]:
        code = source.split(" # ", 1)[0]
        found += [m.strip() for m in _SIDECAR.findall(code)]
        found += ["serve " + m.strip() for m in _SCRIPTS_RUN.findall(code)]
    return found


@functools.cache
def command_help(path: tuple[str, ...]) -> tuple[int, str]:
    """``sidecar <path> --help`` in-process: its exit code and its help text."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([*path, "--help"])
        except SystemExit as exc:
            return (exc.code if isinstance(exc.code, int) else 1), out.getvalue()
    raise AssertionError(f"sidecar {' '.join(path)} --help did not exit")


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:  # a placeholder such as <the app's client id>
        return command.split()


def check_command(command: str) -> list[str]:
    """What is wrong with ``sidecar <command>`` as the README shows it: an unknown command, or a flag
    that is not in that command's help. Empty when it is right."""
    words = _words(command)
    if "--" in words:
        words = words[: words.index("--")]  # what follows is the agent's command line (sidecar exec)
    path: tuple[str, ...] = ()
    rest = list(words)
    while rest and not rest[0].startswith("-"):
        code, _ = command_help((*path, rest[0]))
        if code != 0:
            break
        path = (*path, rest.pop(0))
    code, text = command_help(path)
    if code != 0 or _GROUP_USAGE.search(text.splitlines()[0] if text else ""):
        return [f"`sidecar {command}`: `sidecar {' '.join([*path, *rest[:1]])}` is not a command"]
    known = set(_FLAG.findall(text))
    return [
        f"`sidecar {command}`: {flag} is not in `sidecar {' '.join(path)} --help`"
        for word in rest
        if word.startswith("--")
        for flag in _FLAG.findall(word.split("=", 1)[0])
        if flag not in known
    ]


def every_command_path(path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group, from the parser's own help."""
    code, text = command_help(path)
    assert code == 0, path
    if not _GROUP_USAGE.search(text.splitlines()[0]):
        return [path]
    return [path, *(p for name in _SUBCOMMAND.findall(text) for p in every_command_path((*path, name)))]


def test_the_readmes_first_code_block_is_the_two_commands() -> None:
    first = _FENCE.search(_readme())
    assert first is not None
    assert [line.split("#")[0].strip() for line in first[3].splitlines()] == ["scripts/run", "scripts/test"]


def test_the_readme_shows_commands_for_the_test_to_check() -> None:
    # An extractor that finds nothing would pass everything below.
    shown = shown_commands(_readme())
    assert len(shown) >= 20, shown
    assert any(c.startswith("connectors connect") and "--client-secret-file" in c for c in shown), shown


def test_every_sidecar_command_the_readme_shows_exists_with_its_flags() -> None:
    problems = [problem for command in shown_commands(_readme()) for problem in check_command(command)]
    assert not problems, "\n".join(problems)


def test_a_misspelt_flag_or_command_is_caught() -> None:
    assert check_command("session new --workspace ~/code/myproject") == []
    assert check_command("exec --mode read-only -- claude --resume") == []
    assert check_command("session new --workspaces ~/code/myproject")
    assert check_command("connectors connect github --client-secret ~/secret")
    assert check_command("sesion new")
    assert check_command("connectors")


def test_every_command_in_the_contracts_table_exists_with_its_flags() -> None:
    # docs/contract.md §2 is the reference the README points to: its table rows must match the parser too.
    text = (REPO / "docs" / "contract.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `sidecar ([^`]+)` \|", text, re.MULTILINE)
    assert len(rows) >= 20, rows
    # `show\|trust ID` → `show ID` (the first of the alternatives); `[--port N]` → `--port N`.
    commands = [re.sub(r"(\S+?)(?:\\\|\S+?)+(?=\s|$)", r"\1", row).replace("[", "").replace("]", "") for row in rows]
    problems = [problem for command in commands for problem in check_command(command)]
    assert not problems, "\n".join(problems)
    # And the table is whole: every command the parser has is a row (each of a row's alternatives counts).
    documented = {" ".join(w for w in words if re.fullmatch(r"[a-z-]+", w)) for row in rows for words in _expand(row)}
    leaves = {" ".join(path) for path in every_command_path() if path and path != ("service",)}
    missing = sorted(leaf for leaf in leaves if not any(d.startswith(leaf) for d in documented))
    assert not missing, f"commands missing from docs/contract.md §2: {missing}"


def _expand(row: str) -> list[list[str]]:
    """A table row's command words for each of its alternatives: `show\\|trust ID` → show ID, trust ID."""
    words = row.split()[:3]
    alternatives = [w.split("\\|") for w in words]
    count = max(len(a) for a in alternatives)
    return [[a[i] if i < len(a) else a[0] for a in alternatives] for i in range(count)]


def test_every_flag_the_readme_names_alone_is_in_some_commands_help() -> None:
    known = {flag for path in every_command_path() for flag in _FLAG.findall(command_help(path)[1])}
    shown = {flag for span in _spans(_readme()) if span.startswith("--") for flag in _FLAG.findall(span)}
    assert shown, "the README names no flag on its own: has the extractor broken?"
    assert not shown - known, f"flags in the README that no command has: {sorted(shown - known)}"


def test_every_config_key_the_readme_names_is_a_setting() -> None:
    sections = {
        name: set(type(value).model_fields)
        for name, value in Settings().__dict__.items()
        if hasattr(type(value), "model_fields")
    }
    top = set(Settings.model_fields)
    problems: list[str] = []
    checked = 0
    for span in _spans(_readme()):
        if found := _SECTION_KEY.match(span):
            section, key = found[1], found[2]
            checked += 1
            if section not in sections:
                problems.append(f"`{span}`: no section [{section}]")
            elif key is not None and key not in sections[section]:
                problems.append(f"`{span}`: [{section}] has no {key}")
        elif found := _ASSIGNMENT.match(span):
            checked += 1
            if found[1] not in top:
                problems.append(f"`{span}`: {found[1]} is not a top-level setting")
    assert checked >= 5, "the README names almost no setting: has the extractor broken?"
    assert not problems, "\n".join(problems)


def test_every_repository_path_the_readme_links_or_quotes_exists() -> None:
    text = _readme()
    linked = [target.split("#", 1)[0] for target in _LINK.findall(text) if not re.match(r"[a-z]+:|#", target)]
    quoted = [span for span in _spans(text) if _REPO_PATH.match(span)]
    assert linked, "the README links no file: has the extractor broken?"
    missing = [path for path in [*linked, *quoted] if not (REPO / path).exists()]
    assert not missing, f"the README points at files that do not exist: {missing}"


def test_the_readme_is_a_guide_of_at_most_400_lines() -> None:
    lines = len(_readme().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines; reference belongs in docs/contract.md"


@pytest.mark.parametrize(
    ("paragraph", "claim"),
    [
        ("The hop adds about 0.5 ms at p50.", True),
        ("The suite runs in 43\u201347 s wall on two cores.", True),
        ("The first search takes about 2 s.", True),
        ("It ran in about 45 s (measured 2026-12-03).", False),
        ("An approval expires after 10 minutes; a sign-in link works within 60 seconds.", False),
    ],
)
def test_a_time_claim_is_one_with_a_measured_figure_and_no_date(paragraph: str, claim: bool) -> None:
    assert bool(undated_time_claims(paragraph)) is claim


def undated_time_claims(text: str) -> list[str]:
    return [
        found[0]
        for paragraph in _prose(text).splitlines() + _shell_lines(text)
        if not _DATE.search(paragraph)
        for pattern in _TIME_CLAIMS
        for found in pattern.finditer(paragraph)
    ]


def test_the_readme_makes_no_time_claim_without_its_date() -> None:
    claims = undated_time_claims(_readme())
    assert not claims, f"measured times belong in docs/benchmarks.md, with their dates: {claims}"
