"""``sidecar audit``: the log printed one readable line per record, or as it is (``--json``), or followed.

A line is the record's time (UTC, to the second), its kind, then what says most about it first
(``session``, ``tool``, ``outcome``) and its other fields as ``name=value``; the chain's own fields
(``seq``, ``prev``, ``hash``) are left to ``--verify`` and ``--json``. Values are escaped and bounded
(``text.preview``): a record may carry text a connector chose.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from sidecar.text import preview

__all__ = ["human_line", "tail"]

_FIRST: Final = ("session", "tool", "outcome")
_SHOWN_APART: Final = frozenset({"seq", "ts", "event", "prev", "hash", *_FIRST})
_VALUE_LIMIT: Final = 80


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    return preview(text, _VALUE_LIMIT, quote=False)


def human_line(raw: str) -> str:
    """One record as a line a person reads; a line that is not a record is shown escaped, as it is."""
    try:
        record = json.loads(raw)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return preview(raw.rstrip("\n"), 200, quote=False)
    when = str(record.get("ts", ""))[:19].replace("T", " ")
    parts = [when, f"{_value(record.get('event', '?')):<22}"]
    parts += [f"{name}={_value(record[name])}" for name in _FIRST if name in record]
    parts += [f"{name}={_value(value)}" for name, value in sorted(record.items()) if name not in _SHOWN_APART]
    return "  ".join(parts).rstrip()


def tail(path: Path, *, follow: bool, render: Callable[[str], str]) -> int:
    """Print the log (each line through ``render``), and with ``follow`` go on printing what is appended."""
    try:
        handle = path.open("r", encoding="utf-8")
    except FileNotFoundError:
        if not follow:
            print("no audit records yet")
            return 0
        while not path.exists():
            time.sleep(0.2)
        handle = path.open("r", encoding="utf-8")
    with handle:
        while True:
            line = handle.readline()
            if line:
                sys.stdout.write(render(line) + "\n" if line.strip() else "")
                sys.stdout.flush()
            elif follow:
                time.sleep(0.2)
            else:
                return 0
