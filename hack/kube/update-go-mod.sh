#!/usr/bin/env bash
# Regenerate hack/kube/go.mod for a given Kubernetes release.
#
# k8s.io/kubernetes requires its staging modules at the fake version v0.0.0 and
# points them at ./staging via replace directives, which do not apply to
# consumers.  We therefore derive one `replace k8s.io/X => k8s.io/X v0.<minor>.<patch>`
# per staging module from the release's *own* go.mod (so a new staging repo
# cannot break us), and copy its `go` and `godebug` lines (only the main
# module's godebug settings apply at runtime).
#
# The default module is hack/kube (what `make test` builds). A second pinned
# version lives in hack/kube-<major.minor>/ (hack/build-control-plane.sh picks it
# with K8S_VERSION=v<major.minor>.<patch>); a second argument names that folder,
# which gets a copy of tools.go and the module path .../hack/kube-<major.minor>.
#
# Usage: hack/kube/update-go-mod.sh 1.37.2
#        hack/kube/update-go-mod.sh 1.32.9 hack/kube-1.32
set -euo pipefail
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
V="${1:?usage: $0 <k8s version, e.g. 1.37.2> [module dir]}"
V="${V#v}"
HERE="$(cd "$(dirname "$0")" && pwd)"
DIR="${2:-$HERE}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
[[ "$DIR" == "$HERE" ]] || cp "$HERE/tools.go" "$DIR/tools.go"
cd "$DIR"

UPSTREAM_MOD=$(go mod download -json "k8s.io/kubernetes@v$V" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')

# Start from a clean go.mod each time.
rm -f go.mod go.sum
go mod init "github.com/compute-domain/e2e/hack/$(basename "$DIR")" >/dev/null 2>&1

go mod edit -json "$UPSTREAM_MOD" | python3 -c '
import json, subprocess, sys
ver = sys.argv[1]
m = json.load(sys.stdin)
args = ["go", "mod", "edit", "-go=" + m["Go"]]
for g in m.get("GoDebug") or []:
    args.append("-godebug=%s=%s" % (g["Key"], g["Value"]))
n = 0
for r in m.get("Replace") or []:
    old, new = r["Old"]["Path"], r["New"]["Path"]
    if new.startswith("./staging/"):
        args.append("-replace=%s=%s@v0.%s" % (old, old, ver.split(".", 1)[1]))
        n += 1
args.append("-require=k8s.io/kubernetes@v" + ver)
subprocess.run(args, check=True)
print("derived %d staging replace directives" % n, file=sys.stderr)
' "$V"

go mod tidy
echo "hack/$(basename "$DIR")/go.mod now pins k8s.io/kubernetes v$V" >&2
