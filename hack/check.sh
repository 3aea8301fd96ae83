#!/usr/bin/env bash
# Static gates: formatting, lint, strict typing, import layers, complexity, generated code current.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
echo "==> ruff format --check"; "$PY" -m ruff format --check --quiet pkg cmd hack test
echo "==> ruff check";          "$PY" -m ruff check --quiet pkg cmd hack test
echo "==> mypy --strict"
# One run: the driver, its entry points, every harness of hack/ (testsupport included) and the
# tests (module names from their paths; mypy_path in pyproject.toml).
mapfile -t sources < <(find hack test -name '*.py' -not -path '*/gen/*' | sort)
"$PY" -m mypy --no-error-summary pkg cmd/*/*.py "${sources[@]}"
echo "==> import layers";       "$(dirname "$PY")/lint-imports" --no-cache
echo "==> import contracts of hack/"
lint_imports="$(cd "$(dirname "$PY")" && pwd)/lint-imports"
(cd hack && "$lint_imports" --no-cache .importlinter)
echo "==> cyclomatic complexity"; "$PY" hack/complexity.py
if [[ -x hack/gen-proto.sh ]]; then echo "==> generated gRPC stubs current"; hack/gen-proto.sh --check; fi
echo "==> generated CRDs current"; "$PY" hack/gen-crds.py --check
echo "==> generated chart templates current"; "$PY" hack/gen-chart.py --check
echo "==> generated flag tables in docs current"; "$PY" hack/gen-flag-docs.py --check
echo "==> image lock matches the venv"; VENV=$(dirname "$(dirname "$PY")") hack/build-images.sh --check-lock
