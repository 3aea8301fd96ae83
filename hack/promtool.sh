#!/usr/bin/env bash
# Print the path of a cached promtool binary (the alert-rule unit tests run it).
# Taken from Debian's `prometheus` package WITHOUT installing it (installing would start a
# Prometheus server): `apt-get download` fetches the .deb into a temp dir, `dpkg-deb -x`
# unpacks it there, and only usr/bin/promtool is kept, keyed by the package version:
#   ${CD_E2E_CACHE:-$HOME/.cache/compute-domain-e2e}/promtool/<deb version>/promtool
# A cached binary is reused without touching apt (any version present; the newest first).
# `apt-get update` runs once, only if the first `apt-get download` fails.
# Usage: hack/promtool.sh        # last (only) stdout line = the promtool path; exit 1 on failure
set -euo pipefail
CACHE_ROOT="${CD_E2E_CACHE:-$HOME/.cache/compute-domain-e2e}/promtool"

cached=$(find "$CACHE_ROOT" -mindepth 2 -maxdepth 2 -name promtool -type f -perm -u+x \
  2>/dev/null | sort -V | tail -n1 || true)
if [[ -n "$cached" ]]; then
  echo "$cached"
  exit 0
fi

if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
  echo "promtool.sh: apt-get and dpkg-deb are needed to fetch Debian's prometheus package;" \
    "or put a promtool binary at $CACHE_ROOT/<version>/promtool" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
if ! apt-get download -qq prometheus >/dev/null 2>&1; then
  echo "promtool.sh: apt-get download failed; running apt-get update once" >&2
  if ! { apt-get update -qq && apt-get download -qq prometheus; } >&2; then
    echo "promtool.sh: could not download Debian's prometheus package" \
      "(is Debian's package mirror reachable? apt-get update needs root)" >&2
    exit 1
  fi
fi
deb=$(ls ./prometheus_*.deb)
version=$(dpkg-deb -f "$deb" Version)
dpkg-deb -x "$deb" root
if [[ ! -x root/usr/bin/promtool ]]; then
  echo "promtool.sh: $deb has no usr/bin/promtool" >&2
  exit 1
fi
dest="$CACHE_ROOT/$version"
mkdir -p "$dest"
cp root/usr/bin/promtool "$dest/promtool.tmp"
mv "$dest/promtool.tmp" "$dest/promtool"  # atomic: a concurrent run never sees half a file
echo "$dest/promtool"
