#!/usr/bin/env bash
# Generate the Python gRPC stubs of the kubelet plugin from pkg/draplugin/proto/*.proto into
# pkg/draplugin/proto/gen/ (committed).  `--check` regenerates into a temp dir and fails if
# the committed stubs differ, so a .proto edit without regeneration cannot land.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
PROTO_DIR=pkg/draplugin/proto
GEN_PKG=pkg.draplugin.proto.gen
PATH="$(cd "$(dirname "$PY")" && pwd):$PATH"  # protoc-gen-mypy{,_grpc} live in the venv

generate() { # <out dir>
  local out=$1
  mkdir -p "$out"
  local log
  # protoc-gen-mypy chats on stderr ("Writing mypy to ..."); show output only on failure.
  if ! log=$("$PY" -m grpc_tools.protoc -I "$PROTO_DIR" \
    --python_out="$out" --grpc_python_out="$out" --mypy_out="$out" --mypy_grpc_out="$out" \
    "$PROTO_DIR"/*.proto 2>&1); then
    echo "$log" >&2
    return 1
  fi
  # protoc emits top-level imports ("import x_pb2"); make them absolute package imports.
  local f
  for f in "$out"/*.py "$out"/*.pyi; do
    sed -i -E "s/^import ([a-z0-9_]+_pb2)( as |$)/from ${GEN_PKG} import \1\2/" "$f"
  done
  printf '"""Generated gRPC stubs (hack/gen-proto.sh); do not edit."""\n' >"$out/__init__.py"
}

if [[ "${1:-}" == "--check" ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  generate "$tmp"
  if ! diff -r -x __pycache__ "$tmp" "$PROTO_DIR/gen" >/dev/null; then
    diff -r -x __pycache__ "$tmp" "$PROTO_DIR/gen" | head -40 >&2 || true
    echo "generated stubs in $PROTO_DIR/gen are stale: run hack/gen-proto.sh" >&2
    exit 1
  fi
  exit 0
fi
rm -rf "$PROTO_DIR/gen"
generate "$PROTO_DIR/gen"
echo "generated $(ls "$PROTO_DIR/gen" | wc -l) files in $PROTO_DIR/gen"
