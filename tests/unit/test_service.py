"""`sidecar service install|uninstall`: exact unit files, and the service-manager commands they trigger."""

from __future__ import annotations

import plistlib
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.errors import ConfigError
from sidecar.service import (
    LAUNCHD_LABEL,
    ServiceResult,
    install,
    render_launchd_plist,
    render_systemd_unit,
    uninstall,
)

AWKWARD_ARGV = [
    "/opt/side car/bin/python",
    "-m",
    "sidecar",
    "serve",
    "--label",
    "100% done",
    "$HOME",
    'say "hi"',
    "back\\slash",
    ";",
    "",
]


class Recorder:
    """A fake ``run``: records each argv and answers with scripted exit statuses (default 0)."""

    def __init__(self, statuses: dict[str, int] | None = None, *, missing: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.statuses = statuses or {}
        self.missing = missing

    def __call__(self, argv: list[str]) -> int:
        self.calls.append(argv)
        if self.missing:
            raise FileNotFoundError(argv[0])
        return self.statuses.get(" ".join(argv), 0)


def _service_lines(unit: str) -> list[str]:
    section = unit.split("[Service]\n", 1)[1].split("\n\n", 1)[0]
    return section.splitlines()


def test_systemd_unit_quotes_execstart_by_systemd_rules() -> None:
    unit = render_systemd_unit(exec_argv=AWKWARD_ARGV, env={})

    exec_start = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start == [
        'ExecStart="/opt/side car/bin/python" -m sidecar serve --label "100%% done" "$$HOME" '
        '"say \\"hi\\"" "back\\\\slash" ";" ""'
    ]


def test_systemd_unit_has_the_service_and_install_settings() -> None:
    unit = render_systemd_unit(
        exec_argv=["/usr/bin/python3", "-m", "sidecar", "serve"],
        env={"SIDECAR_HOME": "/home/u/my sidecar", "PCT": "50%"},
    )

    assert _service_lines(unit) == [
        "Type=simple",
        "ExecStart=/usr/bin/python3 -m sidecar serve",
        "Restart=on-failure",
        "RestartSec=2",
        'Environment="PCT=50%%"',
        'Environment="SIDECAR_HOME=/home/u/my sidecar"',
        "UMask=0077",
        "NoNewPrivileges=yes",
    ]
    assert unit.startswith("[Unit]\nDescription=")
    assert unit.endswith("[Install]\nWantedBy=default.target\n")
    assert "PrivateTmp" not in unit


def test_systemd_unit_escapes_control_characters_and_quotes_in_environment() -> None:
    unit = render_systemd_unit(exec_argv=["/bin/true", "a\nb"], env={"X": 'q"\\\t$'})

    assert 'ExecStart=/bin/true "a\\nb"' in unit
    assert 'Environment="X=q\\"\\\\\\t$"' in unit  # no `$` expansion in Environment=


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "empty"),
        (["python", "-m", "sidecar"], {}, "absolute"),
        (["/bin/true", "a\0b"], {}, "NUL"),
        (["/bin/true"], {"BAD NAME": "x"}, "not valid"),
        (["/bin/true"], {"X": "a\0"}, "NUL"),
    ],
)
def test_bad_commands_and_environments_are_refused(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        render_systemd_unit(exec_argv=argv, env=env)


_NO_ANALYZE = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")


def _analyze(unit_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", str(unit_file)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.slow
@_NO_ANALYZE
def test_systemd_accepts_the_rendered_unit(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "sidecar", "serve", *AWKWARD_ARGV[4:]]
    unit_file = tmp_path / "sidecar.service"
    unit_file.write_text(render_systemd_unit(exec_argv=argv, env={"SIDECAR_HOME": str(tmp_path / "a b")}))

    completed = _analyze(unit_file)

    assert completed.returncode == 0, completed.stderr
    assert "sidecar.service" not in completed.stderr, completed.stderr


@pytest.mark.slow
@_NO_ANALYZE
def test_systemd_reads_a_quoted_executable_path_as_one_word(tmp_path: Path) -> None:
    unit_file = tmp_path / "sidecar.service"
    unit_file.write_text(render_systemd_unit(exec_argv=AWKWARD_ARGV, env={}))

    completed = _analyze(unit_file)

    # The path does not exist, so systemd names it — whole, spaces included, unquoted.
    assert "Command /opt/side car/bin/python is not executable" in completed.stderr, completed.stderr


def test_launchd_plist_round_trips_with_the_right_keys(tmp_path: Path) -> None:
    log = tmp_path / "Logs" / "daemon.log"
    text = render_launchd_plist(label=LAUNCHD_LABEL, exec_argv=AWKWARD_ARGV, env={"SIDECAR_HOME": "/x y"}, log_path=log)

    plist = plistlib.loads(text.encode())

    assert plist["Label"] == "dev.sidecar.daemon"
    assert plist["ProgramArguments"] == AWKWARD_ARGV  # launchd takes argv as is: no quoting layer
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["EnvironmentVariables"] == {"SIDECAR_HOME": "/x y"}
    assert plist["StandardOutPath"] == plist["StandardErrorPath"] == str(log)
    assert plist["Umask"] == 0o077


def test_install_on_linux_writes_the_unit_and_enables_it(tmp_path: Path) -> None:
    run = Recorder()

    result = install(
        platform="linux",
        home=tmp_path,
        exec_argv=["/usr/bin/python3", "-m", "sidecar"],
        env={"SIDECAR_HOME": "/h"},
        run=run,
    )

    unit = tmp_path / ".config" / "systemd" / "user" / "sidecar.service"
    assert result == ServiceResult(path=unit, ran=run.calls, warnings=[])
    assert run.calls == [
        ["systemctl", "--user", "daemon-reload"],
        ["systemctl", "--user", "enable", "--now", "sidecar.service"],
    ]
    assert unit.read_text() == render_systemd_unit(
        exec_argv=["/usr/bin/python3", "-m", "sidecar"], env={"SIDECAR_HOME": "/h"}
    )
    assert not stat.S_IMODE(unit.stat().st_mode) & 0o022


def test_reinstalling_on_linux_restarts_a_running_service(tmp_path: Path) -> None:
    install(platform="linux", home=tmp_path, exec_argv=["/bin/old"], env={}, run=Recorder())
    run = Recorder()

    result = install(platform="linux", home=tmp_path, exec_argv=["/bin/new"], env={}, run=run)

    assert ["systemctl", "--user", "try-restart", "sidecar.service"] in run.calls
    assert "ExecStart=/bin/new\n" in result.path.read_text()


def test_install_defaults_to_this_python_and_sidecar_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_HOME", str(tmp_path / "sc"))

    result = install(platform="linux", home=tmp_path, run=Recorder())

    assert result.path.read_text() == render_systemd_unit(
        exec_argv=[sys.executable, "-OO", "-m", "sidecar", "serve"], env={"SIDECAR_HOME": str(tmp_path / "sc")}
    )


def test_a_missing_systemctl_is_a_warning_with_the_commands_to_run(tmp_path: Path) -> None:
    run = Recorder(missing=True)

    result = install(platform="linux", home=tmp_path, exec_argv=["/bin/true"], env={}, run=run)

    assert result.path.exists()
    assert run.calls == [["systemctl", "--user", "daemon-reload"]]
    assert result.warnings == [
        "systemctl not found; run by hand: systemctl --user daemon-reload; "
        "systemctl --user enable --now sidecar.service"
    ]


def test_a_failing_systemctl_is_a_warning_and_stops_the_sequence(tmp_path: Path) -> None:
    run = Recorder({"systemctl --user daemon-reload": 1})

    result = install(platform="linux", home=tmp_path, exec_argv=["/bin/true"], env={}, run=run)

    assert run.calls == [["systemctl", "--user", "daemon-reload"]]
    assert result.warnings == [
        "`systemctl --user daemon-reload` exited with status 1",
        "not run: systemctl --user enable --now sidecar.service",
    ]


def test_a_timed_out_command_is_a_warning(tmp_path: Path) -> None:
    def run(argv: list[str]) -> int:
        raise subprocess.TimeoutExpired(argv, 30)

    result = install(platform="linux", home=tmp_path, exec_argv=["/bin/true"], env={}, run=run)

    assert result.warnings[0].startswith("`systemctl --user daemon-reload` failed (TimeoutExpired")


def test_uninstall_on_linux_disables_and_removes_the_unit(tmp_path: Path) -> None:
    installed = install(platform="linux", home=tmp_path, exec_argv=["/bin/true"], env={}, run=Recorder())
    run = Recorder()

    result = uninstall(platform="linux", home=tmp_path, run=run)

    assert result.path == installed.path
    assert not installed.path.exists()
    assert run.calls == [
        ["systemctl", "--user", "disable", "--now", "sidecar.service"],
        ["systemctl", "--user", "daemon-reload"],
    ]
    assert result.warnings == []


def test_uninstall_removes_the_unit_even_when_systemctl_fails(tmp_path: Path) -> None:
    install(platform="linux", home=tmp_path, exec_argv=["/bin/true"], env={}, run=Recorder())

    result = uninstall(platform="linux", home=tmp_path, run=Recorder(missing=True))

    assert not result.path.exists()
    assert result.warnings == ["systemctl not found; run by hand: systemctl --user disable --now sidecar.service"]


@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_uninstalling_nothing_says_so_and_runs_nothing(tmp_path: Path, platform: str) -> None:
    run = Recorder()

    result = uninstall(platform=platform, home=tmp_path, run=run)

    assert run.calls == []
    assert result.warnings == [f"{result.path} does not exist; nothing to uninstall"]


def test_install_on_macos_writes_the_agent_and_loads_it(tmp_path: Path) -> None:
    run = Recorder()

    result = install(platform="darwin", home=tmp_path, exec_argv=["/usr/bin/python3"], env={}, run=run)

    plist_path = tmp_path / "Library" / "LaunchAgents" / "dev.sidecar.daemon.plist"
    assert result.path == plist_path
    assert run.calls == [["launchctl", "load", "-w", str(plist_path)]]
    plist = plistlib.loads(plist_path.read_bytes())
    assert plist["ProgramArguments"] == ["/usr/bin/python3"]
    assert Path(plist["StandardOutPath"]).parent.is_dir()
    assert result.warnings == []


def test_reinstalling_on_macos_unloads_first_and_tolerates_not_loaded(tmp_path: Path) -> None:
    install(platform="darwin", home=tmp_path, exec_argv=["/bin/true"], env={}, run=Recorder())
    plist_path = tmp_path / "Library" / "LaunchAgents" / "dev.sidecar.daemon.plist"
    run = Recorder({f"launchctl unload {plist_path}": 113})

    result = install(platform="darwin", home=tmp_path, exec_argv=["/bin/true"], env={}, run=run)

    assert run.calls == [
        ["launchctl", "unload", str(plist_path)],
        ["launchctl", "load", "-w", str(plist_path)],
    ]
    assert result.warnings == []


def test_uninstall_on_macos_unloads_and_removes_the_agent(tmp_path: Path) -> None:
    installed = install(platform="darwin", home=tmp_path, exec_argv=["/bin/true"], env={}, run=Recorder())
    run = Recorder()

    result = uninstall(platform="darwin", home=tmp_path, run=run)

    assert not installed.path.exists()
    assert run.calls == [["launchctl", "unload", "-w", str(installed.path)]]
    assert result.warnings == []


@pytest.mark.parametrize("platform", ["win32", "cygwin", "freebsd14"])
def test_an_unsupported_platform_is_a_config_error(tmp_path: Path, platform: str) -> None:
    with pytest.raises(ConfigError, match=r"supports Linux .* and macOS"):
        install(platform=platform, home=tmp_path, run=Recorder())
    with pytest.raises(ConfigError, match=platform):
        uninstall(platform=platform, home=tmp_path, run=Recorder())
    assert list(tmp_path.iterdir()) == []


def test_every_way_of_running_the_daemon_uses_the_same_interpreter_flags() -> None:
    from sidecar.service import serve_argv
    from sidecar.tuning import PYTHON_FLAGS as DAEMON_PYTHON_FLAGS

    assert serve_argv("/py") == ["/py", *DAEMON_PYTHON_FLAGS, "-m", "sidecar", "serve"]
    run = (Path(__file__).resolve().parents[2] / "scripts" / "run").read_text()
    assert f'"$VENV/bin/python" {" ".join(DAEMON_PYTHON_FLAGS)} -m sidecar serve' in run


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the systemd unit is Linux's")
def test_install_exits_non_zero_and_says_what_to_do_when_the_service_manager_fails(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"  # a user manager that refuses, as in a container or an SSH login
    systemctl.write_text("#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n")
    systemctl.chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": f"{bin_dir}:/usr/bin:/bin", "SIDECAR_HOME": str(tmp_path / "sc")}
    completed = subprocess.run(
        [sys.executable, "-m", "sidecar", "service", "install"], env=env, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 1, (completed.stdout, completed.stderr)
    assert "installed" not in completed.stdout
    assert "service manager did not take it" in completed.stderr
    assert "exited with status 1" in completed.stderr
    assert (tmp_path / ".config" / "systemd" / "user" / "sidecar.service").exists()  # the file is written

    bin_dir.joinpath("systemctl").write_text("#!/bin/sh\nexit 0\n")
    completed = subprocess.run(
        [sys.executable, "-m", "sidecar", "service", "install"], env=env, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert "installed and started" in completed.stdout
