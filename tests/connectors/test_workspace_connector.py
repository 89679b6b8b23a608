"""The workspace connector package: its tools, its confinement, and the package as sidecar runs it.

The tools' logic is tested in this process: ``connectors/workspace/server.py`` is imported, and each test
serves ``build_server(Workspace(root))`` to the SDK's own client (``mode="legacy"``, as the daemon talks
to connectors) over the SDK's in-memory transport, so results, tool errors and argument defaults are
exactly what a client of the subprocess gets, with a per-request timeout bounding every wait. Escape
attempts are checked on the file system: a snapshot of everything next to the workspace must be
unchanged afterwards, and the secret outside must never appear in a response.

Two tests (marked slow) run the package as sidecar does, as a real subprocess over stdio: launched from
its ``mcp.json``, and refusing to start without a project directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from mcp import Client, StdioServerParameters, stdio_client, types
from mcp.server.mcpserver.exceptions import ToolError

PACKAGE = Path(__file__).resolve().parents[2] / "connectors" / "workspace"
SERVER = PACKAGE / "server.py"
CALL_TIMEOUT = 30.0  # seconds per MCP request (initialize included): a fail-safe, never a timing assertion
EXIT_TIMEOUT = 30.0  # seconds for a server that should exit at once
SECRET = "TOP SECRET outside the workspace"


def _import_server() -> ModuleType:
    """``connectors/workspace/server.py`` as a module: a connector package is a directory, not a package."""
    spec = importlib.util.spec_from_file_location("sidecar_workspace_connector", SERVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


server = _import_server()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace holding a secret."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret.txt").write_text(SECRET + "\n")
    return directory


@contextlib.asynccontextmanager
async def connector(root: Path) -> AsyncIterator[Client]:
    """The workspace server on ``root``, served in this process, and an initialized client to it.

    A context manager, not a fixture: the SDK's anyio scopes must be left in the task that entered them,
    and pytest-asyncio tears fixtures down in another task.
    """
    served = server.build_server(server.Workspace(str(root)))
    async with Client(served, mode="legacy", read_timeout_seconds=CALL_TIMEOUT) as client:
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> types.CallToolResult:
    return await client.call_tool(tool, arguments)


def texts(result: types.CallToolResult) -> list[str]:
    out = []
    for block in result.content:
        assert isinstance(block, types.TextContent)
        out.append(block.text)
    return out


async def ok(client: Client, tool: str, **arguments: Any) -> str:
    result = await call(client, tool, **arguments)
    assert not result.is_error, texts(result)
    return "\n".join(texts(result))


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    result = await call(client, tool, **arguments)
    assert result.is_error, (tool, arguments, texts(result))
    return "\n".join(texts(result))


def snapshot(top: Path, *, skip: Path) -> dict[str, str]:
    """Everything below ``top`` except ``skip``: files with contents, directories, link targets."""
    seen: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        if here == skip:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            path = here / name
            key = str(path.relative_to(top))
            if path.is_symlink():
                seen[key] = "link:" + os.readlink(path)
            elif path.is_dir():
                seen[key] = "dir"
            else:
                seen[key] = path.read_text()
    return seen


# -- happy paths ----------------------------------------------------------------------------------


async def test_lists_a_directory_in_name_order_marking_directories_and_links(workspace: Path) -> None:
    async with connector(workspace) as client:
        (workspace / "b.txt").write_text("b")
        (workspace / "a.py").write_text("a")
        (workspace / "src").mkdir()
        (workspace / "src" / "inner.py").write_text("x")
        (workspace / "alias").symlink_to("b.txt")

        assert await ok(client, "list_files") == "a.py\nalias@\nb.txt\nsrc/"
        assert await ok(client, "list_files", path="src") == "src/inner.py"
        assert await ok(client, "list_files", pattern="*.py") == "a.py"
        assert "not a directory" in await refused(client, "list_files", path="a.py")
        assert "not found" in await refused(client, "list_files", path="missing")


async def test_lists_recursively_with_patterns_skipping_vcs_internals_and_stops_at_the_limit(workspace: Path) -> None:
    async with connector(workspace) as client:
        (workspace / "pkg" / "sub").mkdir(parents=True)
        (workspace / "pkg" / "mod.py").write_text("")
        (workspace / "pkg" / "sub" / "deep.py").write_text("")
        (workspace / "pkg" / "data.json").write_text("{}")
        (workspace / ".git").mkdir()
        (workspace / ".git" / "HEAD.py").write_text("")

        listing = await ok(client, "list_files", recursive=True)
        assert listing.splitlines() == [".git/", "pkg/", "pkg/data.json", "pkg/mod.py", "pkg/sub/", "pkg/sub/deep.py"]
        assert await ok(client, "list_files", recursive=True, pattern="*.py") == "pkg/mod.py\npkg/sub/deep.py"
        assert await ok(client, "list_files", recursive=True, pattern="pkg/sub/*") == "pkg/sub/deep.py"
        assert await ok(client, "list_files", path=".git") == ".git/HEAD.py"  # named explicitly, it is listed

        limited = (await ok(client, "list_files", recursive=True, limit=2)).splitlines()
        assert limited[:2] == [".git/", "pkg/"]
        assert limited[2].startswith("[listing stopped at 2 entries")
        assert len(limited) == 3
        assert await ok(client, "list_files", pattern="*.none") == "(no matching entries)"


async def test_reads_text_whole_or_in_pieces_that_join_up_at_the_reported_offsets(workspace: Path) -> None:
    async with connector(workspace) as client:
        text = "héllo wörld — ünïcode ✓\nsecond line\n"
        (workspace / "doc.md").write_text(text, encoding="utf-8")
        whole = await call(client, "read_file", path="doc.md")
        assert not whole.is_error
        assert texts(whole) == [text]  # one block: nothing was cut

        pieces: list[str] = []
        offset = 0
        for _ in range(len(text.encode())):  # bounded: each piece advances at least one byte
            result = await call(client, "read_file", path="doc.md", offset=offset, max_bytes=4)
            assert not result.is_error, texts(result)
            blocks = texts(result)
            pieces.append(blocks[0])
            if len(blocks) == 1:
                break
            found = re.search(r"offset=(\d+)", blocks[1])
            assert found, blocks[1]
            assert blocks[1].startswith("[truncated: bytes ")
            assert int(found.group(1)) > offset
            offset = int(found.group(1))
        assert "".join(pieces) == text  # a multi-byte character is never split between pieces
        assert "past the end" in await refused(client, "read_file", path="doc.md", offset=10_000)


async def test_refuses_binary_files_directories_and_missing_files_with_short_messages(workspace: Path) -> None:
    async with connector(workspace) as client:
        (workspace / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
        (workspace / "dir").mkdir()

        message = await refused(client, "read_file", path="image.png")
        assert "binary file" in message
        assert "'image.png'" in message
        assert "is a directory" in await refused(client, "read_file", path="dir")
        assert "is a directory" in await refused(client, "read_file", path=".")
        missing = await refused(client, "read_file", path="nope.txt")
        assert missing.endswith("'nope.txt': not found")
        assert "Traceback" not in missing
        assert str(workspace) not in missing


async def test_reads_latin1_text_with_replacement_characters_and_says_so(workspace: Path) -> None:
    async with connector(workspace) as client:
        (workspace / "old.txt").write_bytes("café\n".encode("latin-1"))
        result = await call(client, "read_file", path="old.txt")
        assert not result.is_error
        assert texts(result)[0] == "caf\ufffd\n"
        assert "not valid UTF-8" in texts(result)[1]


async def test_searches_like_grep_skipping_binary_and_large_files(workspace: Path) -> None:
    async with connector(workspace) as client:
        (workspace / "src").mkdir()
        (workspace / "src" / "a.py").write_text("import os\n# TODO: tidy\nx = 1  # todo later\n")
        (workspace / "src" / "b.txt").write_text("nothing here\nTODO: write docs\n")
        (workspace / "blob.bin").write_bytes(b"TODO\x00binary")
        (workspace / "huge.log").write_text("TODO\n" + "x" * (2 * 1024 * 1024))
        (workspace / ".git").mkdir()
        (workspace / ".git" / "COMMIT_EDITMSG").write_text("TODO in git\n")

        result = await ok(client, "search_files", query="TODO")
        lines = result.splitlines()
        assert lines[:2] == ["src/a.py:2:# TODO: tidy", "src/b.txt:2:TODO: write docs"]
        assert lines[2] == "[skipped 1 binary file(s) and 1 file(s) over 2 MiB]"
        assert len(lines) == 3

        assert await ok(client, "search_files", query="TODO", glob="*.py") == "src/a.py:2:# TODO: tidy"
        assert await ok(client, "search_files", query="TODO", path="src/b.txt") == "src/b.txt:2:TODO: write docs"
        regex = await ok(client, "search_files", query=r"(?i)\btodo\b", regex=True, path="src")
        assert regex.splitlines() == [
            "src/a.py:2:# TODO: tidy",
            "src/a.py:3:x = 1  # todo later",
            "src/b.txt:2:TODO: write docs",
        ]
        limited = (await ok(client, "search_files", query="o", path="src", limit=2)).splitlines()
        assert len(limited) == 3
        assert limited[2] == "[stopped at 2 matches; narrow the query, path or glob]"
        assert await ok(client, "search_files", query="absent", path="src") == "(no matches)"
        assert "invalid regular expression" in await refused(client, "search_files", query="(", regex=True)


async def test_writes_atomically_by_rename_keeping_the_mode_and_leaving_no_temporary_files(workspace: Path) -> None:
    async with connector(workspace) as client:
        assert await ok(client, "write_file", path="new.txt", content="one\n") == "created new.txt (4 bytes)"
        assert (workspace / "new.txt").read_text() == "one\n"

        target = workspace / "new.txt"
        target.chmod(0o640)
        old_link = workspace.parent / "old-version"
        os.link(target, old_link)  # a second name for the old inode
        before = target.stat().st_ino
        assert await ok(client, "write_file", path="new.txt", content="two ✓\n") == "replaced new.txt (8 bytes)"
        assert target.read_text() == "two ✓\n"
        assert target.stat().st_ino != before  # a new file was renamed over it, not written in place
        assert old_link.read_text() == "one\n"
        assert stat.S_IMODE(target.stat().st_mode) == 0o640

        assert "already exists" in await refused(client, "write_file", path="new.txt", content="x", overwrite=False)
        assert target.read_text() == "two ✓\n"
        assert (
            await ok(client, "write_file", path="fresh.txt", content="", overwrite=False)
            == "created fresh.txt (0 bytes)"
        )

        assert "parent directory does not exist" in await refused(client, "write_file", path="a/b/c.txt", content="x")
        assert not (workspace / "a").exists()
        await ok(client, "write_file", path="a/b/c.txt", content="deep", create_dirs=True)
        assert (workspace / "a" / "b" / "c.txt").read_text() == "deep"

        (workspace / "adir").mkdir()
        assert "not a regular file" in await refused(client, "write_file", path="adir", content="x")
        assert "workspace root" in await refused(client, "write_file", path=".", content="x")

        leftovers = [p.name for p in workspace.rglob("*") if p.name.endswith(".tmp")]
        assert leftovers == []
        assert sorted(p.name for p in workspace.iterdir()) == ["a", "adir", "fresh.txt", "new.txt"]


def test_content_over_the_write_bound_is_refused_and_nothing_is_written(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "MAX_WRITE_BYTES", 8)  # the bound is 16 MiB: too big to send in a test
    files = server.Workspace(str(workspace))
    assert files.write_file("fits.txt", "12345678", False, False) == "created fits.txt (8 bytes)"
    with pytest.raises(ToolError, match="content is 9 bytes; write_file takes at most 8"):
        files.write_file("big.txt", "123456789", False, False)
    with pytest.raises(ToolError, match="takes at most 8"):
        files.write_file("fits.txt", "ü" * 5, False, True)  # counted in UTF-8 bytes, not characters
    assert sorted(p.name for p in workspace.iterdir()) == ["fits.txt"]
    assert (workspace / "fits.txt").read_text() == "12345678"


async def test_moves_files_and_directories_and_refuses_an_existing_target_without_overwrite(workspace: Path) -> None:
    async with connector(workspace) as client:
        (workspace / "a.txt").write_text("A")
        (workspace / "b.txt").write_text("B")
        (workspace / "docs").mkdir()

        assert await ok(client, "move_file", source="a.txt", destination="docs/a.md") == "moved a.txt to docs/a.md"
        assert (workspace / "docs" / "a.md").read_text() == "A"
        assert not (workspace / "a.txt").exists()

        message = await refused(client, "move_file", source="b.txt", destination="docs/a.md")
        assert "already exists" in message
        assert (workspace / "b.txt").read_text() == "B"
        assert (workspace / "docs" / "a.md").read_text() == "A"

        await ok(client, "move_file", source="b.txt", destination="docs/a.md", overwrite=True)
        assert (workspace / "docs" / "a.md").read_text() == "B"
        assert not (workspace / "b.txt").exists()

        await ok(client, "move_file", source="docs", destination="documentation")
        assert (workspace / "documentation" / "a.md").read_text() == "B"
        (workspace / "other").mkdir()
        assert "already exists" in await refused(
            client, "move_file", source="other", destination="documentation", overwrite=True
        )
        assert "not found" in await refused(client, "move_file", source="ghost", destination="x")
        assert "parent directory does not exist" in await refused(
            client, "move_file", source="other", destination="no/such/place"
        )
        assert "cannot move" in await refused(client, "move_file", source="other", destination="other/inside")
        assert sorted(p.name for p in workspace.iterdir()) == ["documentation", "other"]


async def test_accepts_absolute_paths_inside_the_workspace_even_through_a_linked_root(
    workspace: Path, tmp_path: Path
) -> None:
    # The root may itself be reached through a link (macOS: /tmp is /private/tmp); absolute paths written
    # either way are inside, and writing through the root's own link is not "writing through a link".
    linked_root = tmp_path / "linked-root"
    linked_root.symlink_to(workspace)
    async with connector(linked_root) as client:
        await ok(client, "write_file", path=str(workspace / "real.txt"), content="real")
        await ok(client, "write_file", path=str(linked_root / "via-link.txt"), content="link")
        assert await ok(client, "read_file", path=str(linked_root / "real.txt")) == "real"
        assert await ok(client, "list_files", path=str(workspace)) == "real.txt\nvia-link.txt"
    assert (workspace / "via-link.txt").read_text() == "link"


# -- confinement ----------------------------------------------------------------------------------


def _escape_attempts(outside: Path) -> list[tuple[str, dict[str, Any]]]:
    secret = outside / "secret.txt"
    return [
        ("read_file", {"path": "../outside/secret.txt"}),
        ("read_file", {"path": str(secret)}),
        ("read_file", {"path": "/etc/passwd"}),
        ("read_file", {"path": "sub/../../outside/secret.txt"}),
        ("read_file", {"path": "link_file"}),
        ("read_file", {"path": "link_dir/secret.txt"}),
        ("read_file", {"path": "sub/link_up/outside/secret.txt"}),
        ("read_file", {"path": "notes.txt\x00../../outside/secret.txt"}),
        ("list_files", {"path": ".."}),
        ("list_files", {"path": "link_dir"}),
        ("list_files", {"path": str(outside)}),
        ("list_files", {"path": "sub/../.."}),
        ("search_files", {"query": "SECRET", "path": ".."}),
        ("search_files", {"query": "SECRET", "path": "link_dir"}),
        ("search_files", {"query": "SECRET", "path": "link_file"}),
        ("write_file", {"path": "../escaped.txt", "content": "pwned"}),
        ("write_file", {"path": str(outside / "new.txt"), "content": "pwned"}),
        ("write_file", {"path": "sub/../../outside/new.txt", "content": "pwned"}),
        ("write_file", {"path": "link_dir/new.txt", "content": "pwned"}),
        ("write_file", {"path": "link_dir/sub/new.txt", "content": "pwned", "create_dirs": True}),
        ("write_file", {"path": "link_file", "content": "pwned"}),
        ("write_file", {"path": "dangling", "content": "pwned"}),
        ("write_file", {"path": "new\x00.txt", "content": "pwned"}),
        ("move_file", {"source": "notes.txt", "destination": "../moved.txt"}),
        ("move_file", {"source": "notes.txt", "destination": "link_dir/moved.txt"}),
        ("move_file", {"source": "notes.txt", "destination": str(outside / "moved.txt")}),
        ("move_file", {"source": "../outside/secret.txt", "destination": "stolen.txt"}),
        ("move_file", {"source": str(secret), "destination": "stolen.txt"}),
        ("move_file", {"source": "link_file", "destination": "stolen.txt"}),
        ("move_file", {"source": "link_dir", "destination": "stolen"}),
        ("move_file", {"source": "notes.txt", "destination": "link_file", "overwrite": True}),
    ]


async def test_every_escape_attempt_is_refused_and_nothing_outside_is_read_or_written(
    workspace: Path, outside: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (workspace / "notes.txt").write_text("inside\n")
    (workspace / "sub").mkdir()
    (workspace / "link_file").symlink_to(outside / "secret.txt")
    (workspace / "link_dir").symlink_to(outside)
    (workspace / "sub" / "link_up").symlink_to("../..")  # relative, climbing out
    (workspace / "dangling").symlink_to(outside / "not-yet.txt")
    before_outside = snapshot(tmp_path, skip=workspace)
    before_inside = snapshot(workspace, skip=tmp_path / "none")

    async with connector(workspace) as client:
        for tool, arguments in _escape_attempts(outside):
            result = await call(client, tool, **arguments)
            message = "\n".join(texts(result))
            assert result.is_error, (tool, arguments, message)
            assert SECRET not in message
            assert "Traceback" not in message
            assert str(outside) not in message or str(outside) in json.dumps(arguments), message
        # The server is still healthy after all that.
        assert await ok(client, "read_file", path="notes.txt") == "inside\n"

    assert snapshot(tmp_path, skip=workspace) == before_outside
    assert snapshot(workspace, skip=tmp_path / "none") == before_inside
    # What the subprocess would have written to its stderr (the daemon's log): no traceback.
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


async def test_walks_never_follow_links_out_of_the_workspace(workspace: Path, outside: Path) -> None:
    async with connector(workspace) as client:
        (workspace / "link_dir").symlink_to(outside)
        (workspace / "link_file").symlink_to(outside / "secret.txt")
        (workspace / "mine.txt").write_text("SECRET is not here\n")

        listing = await ok(client, "list_files", recursive=True)
        assert listing.splitlines() == ["link_dir@", "link_file@", "mine.txt"]
        found = await ok(client, "search_files", query="SECRET")
        assert found == "mine.txt:1:SECRET is not here"
        assert SECRET not in found


async def test_links_that_stay_inside_are_read_but_never_written_or_moved_through(workspace: Path) -> None:
    async with connector(workspace) as client:
        (workspace / "real").mkdir()
        (workspace / "real" / "file.txt").write_text("real content\n")
        (workspace / "alias_dir").symlink_to("real")
        (workspace / "alias_file").symlink_to("real/file.txt")

        assert await ok(client, "read_file", path="alias_file") == "real content\n"
        assert await ok(client, "read_file", path="alias_dir/file.txt") == "real content\n"
        assert await ok(client, "list_files", path="alias_dir") == "real/file.txt"  # reported by its real path

        for arguments in ({"path": "alias_file", "content": "x"}, {"path": "alias_dir/new.txt", "content": "x"}):
            assert "symbolic link" in await refused(client, "write_file", **arguments)
        assert "symbolic link" in await refused(client, "move_file", source="alias_file", destination="moved")
        assert "symbolic link" in await refused(client, "move_file", source="real/file.txt", destination="alias_dir/x")
        assert (workspace / "real" / "file.txt").read_text() == "real content\n"
        assert sorted(p.name for p in (workspace / "real").iterdir()) == ["file.txt"]
        assert (workspace / "alias_file").is_symlink()


# -- start-up and the package ---------------------------------------------------------------------


@pytest.mark.parametrize("case", ["unset", "missing", "a file", "placeholder"])
def test_refuses_to_start_without_a_project_directory(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "file"
    afile.write_text("")
    values = {"missing": str(tmp_path / "nope"), "a file": str(afile), "placeholder": "${SIDECAR_PROJECT_DIR}"}
    monkeypatch.delenv("SIDECAR_PROJECT_DIR", raising=False)
    if case in values:
        monkeypatch.setenv("SIDECAR_PROJECT_DIR", values[case])
    assert server.main() == 2
    out, err = capsys.readouterr()
    assert "SIDECAR_PROJECT_DIR" in err
    assert "Traceback" not in err
    assert out == ""


@pytest.mark.slow
def test_the_package_run_as_a_process_exits_2_without_a_project_directory(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SERVER)],
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=EXIT_TIMEOUT,
        check=False,
    )
    assert done.returncode == 2
    assert "SIDECAR_PROJECT_DIR" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_the_manifest_declares_the_package_format() -> None:
    manifest = json.loads((PACKAGE / "connector.json").read_text())
    assert manifest["id"] == "workspace" == PACKAGE.name
    assert manifest["type"] == "mcp"
    assert manifest["source"] == "builtin-package"
    assert manifest["tools"] == {
        "list_files": {"risk": "LOW"},
        "read_file": {"risk": "LOW"},
        "search_files": {"risk": "LOW"},
        "write_file": {"risk": "MEDIUM"},
        "move_file": {"risk": "MEDIUM"},
    }
    launch = json.loads((PACKAGE / "mcp.json").read_text())
    assert launch == {
        "mcpServers": {
            "workspace": {
                "command": "python3",
                "args": ["${SIDECAR_CONNECTOR_ROOT}/server.py"],
                "env": {"SIDECAR_PROJECT_DIR": "${SIDECAR_PROJECT_DIR}"},
            }
        }
    }


@pytest.mark.slow
async def test_the_package_launches_from_its_mcp_json_and_serves_exactly_the_declared_tools(
    workspace: Path,
) -> None:
    # Expand the launch config the way the daemon does: placeholders, and its own interpreter for python3.
    spec = json.loads((PACKAGE / "mcp.json").read_text())["mcpServers"]["workspace"]
    values = {"SIDECAR_CONNECTOR_ROOT": str(PACKAGE), "SIDECAR_PROJECT_DIR": str(workspace)}

    def expand(text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], text)

    assert spec["command"] == "python3"
    params = StdioServerParameters(
        command=sys.executable,
        args=[expand(a) for a in spec["args"]],
        env={k: expand(v) for k, v in spec["env"].items()},
    )
    declared = json.loads((PACKAGE / "connector.json").read_text())["tools"]
    with (workspace.parent / "server-stderr.log").open("a") as stderr:
        async with Client(stdio_client(params, errlog=stderr), mode="legacy", read_timeout_seconds=CALL_TIMEOUT) as c:
            listed = await c.list_tools()
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) == set(declared)
    for name, tool in tools.items():
        annotations = tool.annotations
        assert annotations is not None
        assert annotations.read_only_hint is (declared[name]["risk"] == "LOW"), name
        assert tool.description
