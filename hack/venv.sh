#!/usr/bin/env bash
# Create or refresh .venv from pyproject.toml, its runtime dependencies constrained to the versions
# of hack/image-requirements.txt (the images' lock), so the tests run what the images ship; a
# no-op when neither changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
stamp="$VENV/.pyproject.sha256"
LOCK=hack/image-requirements.txt
want=$(cat pyproject.toml "$LOCK" | sha256sum | cut -d' ' -f1)
if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
echo "==> setting up $VENV (python: $($PYTHON --version))"
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 required"'
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
constraints=$(mktemp --suffix=.txt)
trap 'rm -f "$constraints"' EXIT
sed -n 's/^\([A-Za-z0-9._-]*==[^ ]*\).*/\1/p' "$LOCK" > "$constraints"
"$VENV/bin/python" -m pip install -q --constraint "$constraints" -e '.[dev]'
echo "$want" > "$stamp"
