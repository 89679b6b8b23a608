"""The session options ``session new`` and ``exec`` share, and the control-API body they make."""

from __future__ import annotations

import argparse
import re
from typing import Any, Final

__all__ = ["add_session_options", "duration", "session_body"]

_DURATION: Final = re.compile(r"([0-9]{1,9})([smhd]?)")
_UNITS: Final = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> int:
    """``--ttl`` as people write it: ``3600``, ``90m``, ``12h``, ``30d`` → seconds (argparse type)."""
    found = _DURATION.fullmatch(text.strip().lower())
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use seconds, or a number with s, m, h or d")
    return int(found[1]) * _UNITS[found[2]]


def add_session_options(parser: argparse.ArgumentParser, *, label_default: str) -> None:
    """``--label``, ``--mode``, ``--allow``, ``--network``, ``--ttl`` and ``--connector``."""
    parser.add_argument(
        "--label",
        help="what you will know the session by in session list, the console and status, up to 80 characters "
        f"(default: {label_default})",
    )
    parser.add_argument("--mode", choices=["default", "read-only", "bypass"], default="default")
    parser.add_argument(
        "--allow",
        action="append",
        metavar="PATTERN",
        help=(
            "grant a tool name, builtin:* (every built-in), mcp__<id>__* (every tool of connector <id>) or * "
            "(everything, connectors trusted later too); repeatable. Without --allow: the built-ins the "
            "mode allows and no connector tool ([sessions] default_allow in sidecar.toml changes that)"
        ),
    )
    parser.add_argument(
        "--network",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="whether the session may use tools that need the network: every connector tool, unless its "
        "connector declares it works offline (default: --network)",
    )
    parser.add_argument(
        "--ttl",
        type=duration,
        metavar="DURATION",
        help="lifetime: seconds, or 90m, 12h, 30d (default 12h; at most [sessions] max_ttl, 30d unless changed). "
        "The session survives daemon restarts until then",
    )
    parser.add_argument(
        "--connector",
        metavar="ID",
        help="configure one connector's own route instead of /mcp; without --allow, grants mcp__<ID>__*",
    )


def session_body(args: argparse.Namespace, *, workspace: str, project: str) -> dict[str, Any]:
    """The ``POST /control/sessions`` body for these options."""
    body: dict[str, Any] = {"project": project, "workspace": workspace, "mode": args.mode, "network": args.network}
    if args.allow is not None:
        body["allow"] = args.allow  # else the daemon's [sessions] default_allow: no connector tool
    if args.ttl is not None:
        body["ttl"] = args.ttl
    if args.connector is not None:
        body["connector"] = args.connector
    if args.label is not None:
        body["label"] = args.label
    return body
