"""What every command of the ``sidecar`` CLI shares: its client, its output, its parser pieces."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from sidecar.paths import Paths

__all__ = ["Handler", "ago", "command", "control_client", "group", "sandbox_text", "show"]

Handler = Callable[[argparse.Namespace, Paths], int]


def show(args: argparse.Namespace, data: Any, text: str | None = None) -> None:
    """``text`` for a person; ``data`` as JSON with ``--json`` (or when there is no text)."""
    if getattr(args, "json", False) or text is None:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(text)


def control_client(paths: Paths) -> Any:
    from sidecar.cli.client import ControlClient

    return ControlClient(paths)


def command(parent: Any, name: str, handler: Handler, help_text: str, *, json: bool = False) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = parent.add_parser(name, help=help_text, description=help_text)
    p.set_defaults(handler=handler)
    if json:
        p.add_argument("--json", action="store_true", help="print JSON")
    return p


def group(sub: Any, name: str, help_text: str) -> Any:
    return sub.add_parser(name, help=help_text).add_subparsers(dest=f"{name}_command", required=True, metavar="ACTION")


def ago(at: float | None, now: float) -> str:
    """``12s ago``, ``5m ago``, ``3h ago``, ``2d ago``; ``-`` for never."""
    if at is None:
        return "-"
    seconds = max(0, int(now - at))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def sandbox_text(sandbox: dict[str, Any]) -> str:
    """A connector's sandbox (``connectors show``'s ``sandbox``) in one line: exactly what it may see."""
    mode, why = sandbox["mode"], sandbox.get("why", "")
    if mode == "off":
        return "OFF: it runs unsandboxed, as you, with your files (your mcp.json says sidecarSandbox: false)"
    if mode == "none":
        return f"NONE here, so it runs as you, with your files: {why}"
    if mode == "refused":
        return f"REQUIRED, and there is none here, so it does not start: {why}"
    shown = [f"workspace {sandbox['workspace']}"]
    shown += [f"reads {', '.join(sandbox['read_paths'])}"] if sandbox["read_paths"] else []
    shown += [f"writes {', '.join(sandbox['write_paths'])}"] if sandbox["write_paths"] else []
    shown.append("the network" if sandbox["network"] else "no network")
    if sandbox.get("abstract_sockets") == "reachable":
        shown.append("and the host's abstract sockets (an X11 display, a D-Bus bus): this kernel cannot scope them")
    return f"on: the system read-only, its own files, /tmp and its home ({sandbox['home']}); " + "; ".join(shown)
