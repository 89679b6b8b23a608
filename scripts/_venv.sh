# Sourced by scripts/run and scripts/test: make .venv with the project and its extras installed.
# Re-installs only when pyproject.toml changed since the last install. Says what it does on stderr
# (a first install takes a minute or two); pip's own output is shown only when it fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SIDECAR_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
EXTRAS="${1:-}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "sidecar: creating the virtual environment $VENV (first run only)" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.sidecar-installed${EXTRAS:+-$EXTRAS}"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
  echo "sidecar: installing sidecar${EXTRAS:+ with its $EXTRAS extras} and what it needs into $VENV (a minute or two; only when pyproject.toml changed)" >&2
  LOG="$(mktemp)"
  # setuptools warns about every editable install ("be careful"): expected here, so kept out of sight.
  if ! { "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip \
      && "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT${EXTRAS:+[$EXTRAS]}"; } \
      >"$LOG" 2>&1; then
    cat "$LOG" >&2
    rm -f "$LOG"
    echo "sidecar: the install failed (pip's output above)" >&2
    exit 1
  fi
  rm -f "$LOG"
  touch "$STAMP"
  echo "sidecar: installed" >&2
fi
