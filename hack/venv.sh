#!/usr/bin/env bash
# Create or refresh .venv from pyproject.toml; a no-op when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
stamp="$VENV/.pyproject.sha256"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
echo "==> setting up $VENV (python: $($PYTHON --version))"
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 required"'
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[dev]'
echo "$want" > "$stamp"
