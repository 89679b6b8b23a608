"""The one renderer of validation errors: a line per problem, naming source and field, never a long value."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from sidecar.validation import MAX_QUOTE, error_lines, field_path, problem_line, quote, render_errors


def _refuse(value: str) -> str:
    raise ValueError(f"{quote(value)} is refused")


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    command: str
    args: list[str] = Field(default_factory=list)
    env: dict[Annotated[str, Field(pattern=r"^[A-Z_]+$")], str] = Field(default_factory=dict)
    risk: Literal["LOW", "HIGH"] = "LOW"
    disabled: bool = False
    name: Annotated[str, Field(min_length=1, max_length=8)] = "x"
    note: Annotated[str, AfterValidator(_refuse)] | None = None


class File(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    servers: dict[str, Entry] = Field(alias="mcpServers")


def _error(model: type[BaseModel], data: Any) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    return caught.value


def test_each_problem_is_one_line_naming_the_source_and_the_field_path() -> None:
    exc = _error(File, {"mcpServers": {"github": {"command": ["gh"], "args": ["ok", 3]}}})
    assert error_lines(exc, source="/home/ann/mcp.json") == [
        "/home/ann/mcp.json: mcpServers.github.command: must be a string, got a list",
        "/home/ann/mcp.json: mcpServers.github.args[1]: must be a string, got a number",
    ]
    assert render_errors(exc, source="/home/ann/mcp.json") == "\n".join(error_lines(exc, source="/home/ann/mcp.json"))


@pytest.mark.parametrize(
    ("entry", "line"),
    [
        ({}, "command: missing"),
        ({"command": "x", "argz": []}, "argz: unknown key (a typo?)"),
        ({"command": "x", "disabled": "yes"}, "disabled: must be true or false, got a string"),
        ({"command": "x", "args": "a b"}, "args: must be a list, got a string"),
        ({"command": "x", "env": []}, "env: must be an object, got a list"),
        ({"command": "x", "risk": "low"}, "risk: must be 'LOW' or 'HIGH', got 'low'"),
        ({"command": "x", "risk": None}, "risk: must be 'LOW' or 'HIGH', got null"),
        ({"command": "x", "name": ""}, "name: must not be empty"),
        ({"command": "x", "name": "abcdefghij"}, "name: is 10 characters; the limit is 8"),
        ({"command": "x", "env": {"lower": "1"}}, "env.lower: must match the pattern '^[A-Z_]+$'"),
        ({"command": "x", "note": "no"}, "note: 'no' is refused"),
    ],
)
def test_pydantic_wording_becomes_plain_words(entry: dict[str, Any], line: str) -> None:
    assert error_lines(_error(Entry, entry), source="src") == [f"src: {line}"]


def test_the_input_as_a_whole_has_no_field_path() -> None:
    assert error_lines(_error(File, []), source="body") == ["body: the top level must be an object, got a list"]


def test_odd_and_long_keys_are_quoted_and_bounded() -> None:
    long_key = "k" * 500
    exc = _error(File, {"mcpServers": {"a b": {}, "ok.dot": {}, long_key: {}}})
    lines = error_lines(exc, source="f")
    assert lines[0] == "f: mcpServers['a b'].command: missing"
    assert lines[1] == "f: mcpServers['ok.dot'].command: missing"
    cut = "'" + "k" * (MAX_QUOTE - 4) + "..."  # at most MAX_QUOTE characters, quote and cut mark included
    assert lines[2] == f"f: mcpServers[{cut}].command: missing"
    assert field_path(("env", "NOT-A-NAME", "[key]")) == "env.NOT-A-NAME"


def test_a_type_error_names_the_kind_it_got_never_the_value() -> None:
    secret = "s3cr3t-" * 1000
    exc = _error(File, {"mcpServers": {"a": {"command": "x", "args": {"token": secret}, "risk": ["HIGH", secret]}}})
    message = render_errors(exc, source="f")
    assert "s3cr3t" not in message
    assert "f: mcpServers.a.args: must be a list, got an object" in message
    assert "f: mcpServers.a.risk: must be 'LOW' or 'HIGH', got a list" in message


def test_a_quoted_value_is_bounded_and_escaped() -> None:
    assert quote("a\nb\x00") == "'a\\nb\\x00'"
    assert quote("x" * 10_000) == "'" + "x" * (MAX_QUOTE - 4) + "..."
    exc = _error(Entry, {"command": "x", "risk": "\n" + "L" * 10_000})
    (line,) = error_lines(exc, source="f")
    cut = "'\\n" + "L" * (MAX_QUOTE - 6) + "..."
    assert line == f"f: risk: must be 'LOW' or 'HIGH', got {cut}"


def test_a_validator_message_cannot_run_on_without_bound() -> None:
    def chatty(value: str) -> str:
        raise ValueError("bad: " + value)

    class Chatty(BaseModel):
        text: Annotated[str, AfterValidator(chatty)]

    (line,) = error_lines(_error(Chatty, {"text": "y" * 10_000}), source="f")
    assert line.startswith("f: text: bad: yyy")
    assert len(line) < 500 and line.endswith("…")


def test_the_source_may_depend_on_the_field_and_a_prefix_leads_the_path() -> None:
    exc = _error(Entry, {"command": 1, "risk": "x"})
    lines = error_lines(exc, source=lambda loc: f"--{loc[0]}", prefix=("mcpServers", "gh"))
    assert lines == [
        "--command: mcpServers.gh.command: must be a string, got a number",
        "--risk: mcpServers.gh.risk: must be 'LOW' or 'HIGH', got 'x'",
    ]
    assert problem_line("f", (), "not valid JSON") == "f: not valid JSON"
