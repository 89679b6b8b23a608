"""The ``bwrap`` command line a connector runs under (issue 22 item 1), checked without running it: what is
shown, read-only or read-write, in which order, what is masked, and what is refused. The sandbox itself is
tried from inside by ``tests/security/test_sandbox.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sidecar.cli.common import sandbox_text
from sidecar.connectors.manifest.spec import Confinement
from sidecar.connectors.stdio.sandbox import Sandbox, SandboxRefused, Support, sandbox_argv

BWRAP = "/usr/bin/bwrap"
HERE = Support(True, "bubblewrap 0.8.0", BWRAP)
DEFAULT = Confinement()
NONE_HERE = Support(False, "bubblewrap (bwrap) is not installed: connectors run unconfined")


class World:
    """A user's home, sidecar's three directories inside it, a workspace, and a script outside it."""

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.sidecar = self.home / ".sidecar"
        self.dirs = [self.sidecar / "config", self.sidecar / "state", self.sidecar / "data"]
        self.workspace = root / "projects" / "app"
        self.tools = root / "tools"
        for directory in (*self.dirs, self.workspace, self.tools):
            directory.mkdir(parents=True)
        self.script = self.tools / "server.py"
        self.script.write_text("")

    def sandbox(self, support: Support = HERE) -> Sandbox:
        return Sandbox(support, hidden=self.dirs, homes=self.dirs[2] / "homes", home=str(self.home))

    def confine(
        self,
        confinement: Confinement = DEFAULT,
        *,
        network: bool = True,
        argv: tuple[str, ...] | None = None,
        cwd: str | None = "",
        support: Support = HERE,
    ) -> tuple[tuple[str, ...], dict[str, str], str | None]:
        return self.sandbox(support).confine(
            "tool",
            confinement,
            argv or (sys.executable, str(self.script)),
            {"HOME": str(self.home), "PATH": "/usr/bin", "TMPDIR": "/var/tmp/x"},
            cwd=str(self.workspace) if cwd == "" else cwd,
            workspace=str(self.workspace),
            roots=[],
            network=network,
        )


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _mounts(argv: tuple[str, ...] | list[str]) -> list[tuple[str, ...]]:
    """(flag, source, target) or (flag, target) for every mount option, in order."""
    found, i = [], 0
    while i < len(argv):
        if argv[i] in ("--bind", "--ro-bind", "--symlink"):
            found.append(tuple(argv[i : i + 3]))
            i += 3
        elif argv[i] in ("--tmpfs", "--dev", "--proc"):
            found.append(tuple(argv[i : i + 2]))
            i += 2
        else:
            i += 1
    return found


def test_the_command_runs_after_the_options_with_every_namespace(world: World) -> None:
    argv, env, cwd = world.confine()
    assert argv[0] == BWRAP and argv[-2:] == (sys.executable, str(world.script)) and argv[-3] == "--"
    for flag in ("--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--cap-drop"):
        assert flag in argv
    assert "--unshare-net" not in argv  # it needs the network: it keeps the host's
    assert cwd is None and env["HOME"] == str(world.home) and env["TMPDIR"] == "/tmp"
    assert argv[argv.index("--chdir") + 1] == str(world.home)  # no workspace shown: it starts in its home


def test_an_offline_connector_gets_a_network_of_its_own(world: World) -> None:
    argv, _, _ = world.confine(network=False)
    assert "--unshare-net" in argv


def test_its_home_is_private_and_persistent_and_nothing_of_sidecars_or_the_users_is_shown(world: World) -> None:
    argv, _, _ = world.confine()
    mounts = _mounts(argv)
    private = world.dirs[2] / "homes" / "tool"
    assert ("--bind", str(private), str(world.home)) in mounts and private.is_dir()
    assert oct(private.stat().st_mode & 0o777) == "0o700"
    shown = {m[1] for m in mounts if m[0] in ("--bind", "--ro-bind")}
    assert not any(str(d) == s or str(d).startswith(s + "/") for d in world.dirs for s in shown if s != str(private))
    assert str(world.workspace) not in shown  # it declared none
    assert ("--tmpfs", "/tmp") in mounts and ("--proc", "/proc") in mounts
    assert not any(m[-1].startswith("/run") for m in mounts)  # no D-Bus, no display, no agent sockets


def test_the_workspace_is_shown_as_declared(world: World) -> None:
    ws = str(world.workspace)
    argv, _, _ = world.confine(Confinement(workspace="read"))
    assert ("--ro-bind", ws, ws) in _mounts(argv) and argv[argv.index("--chdir") + 1] == ws
    argv, _, _ = world.confine(Confinement(workspace="read-write"))
    assert ("--bind", ws, ws) in _mounts(argv)


def test_a_script_on_the_command_line_is_shown_read_only_and_never_its_home(world: World) -> None:
    argv, _, _ = world.confine()
    assert ("--ro-bind", str(world.tools), str(world.tools)) in _mounts(argv)
    in_home = world.home / "server.py"
    in_home.write_text("")
    argv, _, _ = world.confine(argv=(sys.executable, str(in_home)))
    shown = _mounts(argv)
    assert ("--ro-bind", str(in_home), str(in_home)) in shown  # the file alone
    assert not any(m[0] == "--ro-bind" and m[-1] == str(world.home) for m in shown)


def test_a_declared_path_holding_sidecars_directories_shows_them_empty(tmp_path: Path) -> None:
    world = World(tmp_path)
    outside = tmp_path / "shared"
    (outside / "sidecar" / "data").mkdir(parents=True)
    sandbox = Sandbox(HERE, hidden=[outside / "sidecar" / "data"], homes=tmp_path / "homes", home=str(world.home))
    argv, _, _ = sandbox.confine(
        "tool", Confinement(write_paths=(str(outside),)), ("true",), {}, cwd=None, workspace="", roots=[], network=True
    )
    mounts = _mounts(argv)
    bind = mounts.index(("--bind", str(outside), str(outside)))
    mask = mounts.index(("--tmpfs", str(outside / "sidecar" / "data")))
    assert mask > bind


@pytest.mark.parametrize("what", ["home", "root", "parent of home", "sidecar's data"])
def test_a_declared_path_that_would_show_the_home_or_sidecars_files_is_refused(world: World, what: str) -> None:
    path = {
        "home": world.home,
        "root": Path("/"),
        "parent of home": world.home.parent,
        "sidecar's data": world.dirs[2] / "keys",
    }[what]
    with pytest.raises(SandboxRefused, match="declares"):
        world.confine(Confinement(read_paths=(str(path),)))


def test_opted_out_or_no_sandbox_here_runs_it_as_it_is_and_required_refuses(world: World) -> None:
    plain = (sys.executable, str(world.script))
    argv, _, cwd = world.confine(Confinement(enabled=False))
    assert argv == plain and cwd == str(world.workspace)
    argv, _, _ = world.confine(support=NONE_HERE)
    assert argv == plain
    with pytest.raises(SandboxRefused, match="requires a sandbox, and there is none here: bubblewrap"):
        world.confine(Confinement(required=True), support=NONE_HERE)


def test_mounts_go_parents_first_whatever_order_they_are_given() -> None:
    argv = sandbox_argv(
        BWRAP,
        ["true"],
        mounts=[("--ro-bind", "/a/b/c", "/a/b/c"), ("--bind", "/a", "/a"), ("--ro-bind", "/a/b", "/a/b")],
        masked=["/a/b/secret"],
        cwd="/a",
        network=False,
    )
    targets = [m[-1] for m in _mounts(argv) if m[-1].startswith("/a")]
    assert targets == ["/a", "/a/b", "/a/b/c", "/a/b/secret"]


def test_a_directory_both_shown_and_declared_writable_is_bound_once_and_writable(world: World) -> None:
    """Its own ``cwd`` is shown read-only on its own; declared writable too, it must stay writable (a
    later read-only bind of the same target would silently take the writes away)."""
    own = world.tools
    argv, _, _ = world.confine(Confinement(write_paths=(str(own),)), cwd=str(own))
    binds = [m for m in _mounts(argv) if m[-1] == str(own)]
    assert binds == [("--bind", str(own), str(own))]


def test_one_mount_per_target_and_a_writable_one_wins_in_any_order() -> None:
    for mounts in (
        [("--bind", "/a", "/a"), ("--ro-bind", "/a", "/a")],
        [("--ro-bind", "/a", "/a"), ("--bind", "/a", "/a")],
    ):
        argv = sandbox_argv(BWRAP, ["true"], mounts=mounts, masked=[], cwd="/a", network=True)
        assert [m for m in _mounts(argv) if m[-1] == "/a"] == [("--bind", "/a", "/a")]


def test_what_the_sandbox_shows_is_said_exactly_and_an_unconfined_connector_says_so(world: World) -> None:
    declared = Confinement(workspace="read", read_paths=("/opt/models",))
    on = world.sandbox().describe("tool", declared, network=False)
    assert on == {
        "mode": "on",
        "workspace": "read",
        "read_paths": ["/opt/models"],
        "write_paths": [],
        "network": False,
        "abstract_sockets": "none",
        "home": str(world.dirs[2] / "homes" / "tool"),
    }
    assert sandbox_text(on).endswith("workspace read; reads /opt/models; no network")
    off = world.sandbox().describe("tool", Confinement(enabled=False), network=True)
    assert off["mode"] == "off" and sandbox_text(off).startswith("OFF: it runs unsandboxed")
    none = world.sandbox(NONE_HERE).describe("tool", DEFAULT, network=True)
    assert none == {"mode": "none", "why": NONE_HERE.reason}
    refused = world.sandbox(NONE_HERE).describe("tool", Confinement(required=True), network=True)
    assert sandbox_text(refused).startswith("REQUIRED, and there is none here, so it does not start")


def test_where_landlock_scopes_abstract_sockets_bwrap_runs_under_the_launcher_and_is_shown_so(world: World) -> None:
    launcher = ("/venv/bin/python", "-I", "-S", "/sidecar/launcher.py", "--scope", "--keyrings", "--")
    scoped = Support(True, "bubblewrap 0.8.0; abstract sockets scoped (Landlock ABI 7)", BWRAP, launcher)
    assert (scoped.scoped, scoped.keyrings_refused) == (True, True)
    assert scoped.as_json()["abstract_sockets_scoped"] is True
    argv, _, _ = world.confine(support=scoped)
    assert argv[: len(launcher) + 1] == (*launcher, BWRAP)
    online = world.sandbox(scoped).describe("tool", DEFAULT, network=True)
    assert online["abstract_sockets"] == "none"
    assert sandbox_text(online).endswith("; the network")


def test_where_the_kernel_cannot_scope_them_a_connector_with_the_network_is_shown_reaching_them(world: World) -> None:
    argv, _, _ = world.confine(support=HERE)
    assert argv[0] == BWRAP  # no launcher
    assert HERE.as_json() == {
        "available": True,
        "reason": HERE.reason,
        "abstract_sockets_scoped": False,
        "keyrings_refused": False,
    }
    online = world.sandbox(HERE).describe("tool", DEFAULT, network=True)
    assert online["abstract_sockets"] == "reachable"
    assert "the host's abstract sockets (an X11 display, a D-Bus bus)" in sandbox_text(online)
    offline = world.sandbox(HERE).describe("tool", DEFAULT, network=False)
    assert offline["abstract_sockets"] == "none"  # its own network namespace has none of the host's


def test_a_script_shows_its_project_so_its_imports_resolve(world: World) -> None:
    project = world.tools.parent / "my-server"
    (project / "dist").mkdir(parents=True)
    (project / "package.json").write_text("{}")
    script = project / "dist" / "index.js"
    script.write_text("")
    argv, _, _ = world.confine(argv=("node", str(script)))
    assert ("--ro-bind", str(project), str(project)) in _mounts(argv)  # its node_modules beside package.json


def test_a_script_inside_node_modules_shows_the_outermost_node_modules_where_npm_hoists(world: World) -> None:
    tree = world.tools / "node_modules"
    package = tree / "@scope" / "server" / "node_modules" / "inner"
    (package / "dist").mkdir(parents=True)
    (package / "package.json").write_text("{}")
    script = package / "dist" / "index.js"
    script.write_text("")
    argv, _, _ = world.confine(argv=("node", str(script)))
    shown = [m for m in _mounts(argv) if m[0] == "--ro-bind"]
    assert ("--ro-bind", str(tree), str(tree)) in shown
    assert not any(m[-1] == str(package) for m in shown)


def test_a_project_that_is_your_home_is_not_shown_but_the_scripts_directory_is(world: World) -> None:
    (world.home / "package.json").write_text("{}")  # `npm install` once run in the home
    scripts = world.home / "bin"
    scripts.mkdir()
    (scripts / "server.js").write_text("")
    argv, _, _ = world.confine(argv=("node", str(scripts / "server.js")))
    shown = [m for m in _mounts(argv) if m[0] == "--ro-bind"]
    assert not any(m[-1] == str(world.home) for m in shown)
    assert ("--ro-bind", str(scripts), str(scripts)) in shown


def test_a_script_in_its_package_adds_nothing_beyond_the_package(world: World) -> None:
    checkout = world.tools.parent / "checkout"  # a connector package inside a project, as sidecar's own
    package = checkout / "connectors" / "tool"
    package.mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("")
    (package / "server.py").write_text("")

    def shown(roots: list[Path]) -> list[str]:
        argv, _, _ = world.sandbox().confine(
            "tool",
            DEFAULT,
            (sys.executable, str(package / "server.py")),
            {"HOME": str(world.home), "PATH": "/usr/bin"},
            cwd=None,
            workspace=str(world.workspace),
            roots=roots,
            network=True,
        )
        return [m[-1] for m in _mounts(argv) if m[0] == "--ro-bind"]

    assert str(checkout) in shown([])  # a user's script: its project
    assert str(package) in shown([package]) and str(checkout) not in shown([package])  # a package: itself


def test_a_project_holding_the_workspace_shows_it_empty_unless_declared(world: World) -> None:
    (world.workspace.parent / "package.json").write_text("{}")  # the workspace is a folder of the project
    script = world.workspace.parent / "server.js"
    script.write_text("")
    project, ws = str(world.workspace.parent), str(world.workspace)
    argv, _, _ = world.confine(argv=("node", str(script)))
    mounts = _mounts(argv)
    assert ("--ro-bind", project, project) in mounts
    assert mounts.index(("--tmpfs", ws)) > mounts.index(("--ro-bind", project, project))  # masked
    argv, _, _ = world.confine(Confinement(workspace="read"), argv=("node", str(script)))
    mounts = _mounts(argv)
    assert ("--ro-bind", ws, ws) in mounts and ("--tmpfs", ws) not in mounts
