#!/usr/bin/env bash
# Runs Kubernetes' own storage tests -- k8s.io/apiserver's pkg/storage/etcd3 (the etcd3 store
# and watcher kube-apiserver uses, driven by the generic suite in pkg/storage/testing) and
# pkg/storage/cacher (the watch cache on top of it) -- against server processes instead of the
# embedded etcd the tests normally start: Concord and reference etcd, same tests, same run. Also
# runs ours, largeobjects/ and controlplane/.
#
#   k8s-tests/storage/run.sh [--work DIR] NAME=BINARY[:MEMBERS[:PACKAGE,...[:tls]]] ...
#
# e.g. concord-1=target/debug/concord concord-3=target/debug/concord:3:etcd3 etcd-3.6=PATH/etcd.
# PACKAGEs are etcd3, cacher, largeobjects and controlplane (default: all); `tls` serves clients
# and peers over TLS with client certificates, as kubeadm sets etcd up. Every test gets a fresh
# cluster of MEMBERS (default 1) processes of BINARY; see
# testserver/test_server.go, which is compiled over apiserver's test server (the Kubernetes
# tests themselves are unchanged); with STORAGE_SUITE_WIRECHECK=1 its clients reach the servers
# through wirecheck, which fails a test on an HTTP/2 flow-control overrun or a stream ended in
# the middle of a gRPC message. All servers run at once (the tests mostly wait); a test that
# fails runs once more alone. Fails if a test fails on any server (twice), except a reference
# etcd's failures for what its version lacks: see summarize.py, which prints the table.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$here/../../target/k8s-storage"
if [[ "${1:-}" == --work ]]; then work="$2"; shift 2; fi
mkdir -p "$work"
work=$(realpath "$work")
[[ $# -gt 0 ]] || { echo "usage: $0 [--work DIR] NAME=BINARY[:MEMBERS[:PACKAGE,...]] ..." >&2; exit 2; }
# Test packages: apiserver's two storage packages, and ours: large objects on a shared
# connection and on fresh ones with every HTTP/2 frame checked (the defect kube-apiserver once
# met), and several apiservers on one cluster, a leader kill under a list+watch, and the Go
# client's concurrency recipes (controlplane).
declare -A import=(
  [etcd3]=k8s.io/apiserver/pkg/storage/etcd3
  [cacher]=k8s.io/apiserver/pkg/storage/cacher
  [largeobjects]=./largeobjects
  [controlplane]=./controlplane
)
packages=(etcd3 cacher largeobjects controlplane)

# Server binaries as absolute paths, before leaving the caller's directory.
specs=()
for spec in "$@"; do
  name=${spec%%=*}
  IFS=: read -r binary members chosen tls <<<"${spec#*=}"
  specs+=("$name=$(realpath "$binary"):${members:-1}:${chosen:-$(IFS=,; echo "${packages[*]}")}:$tls")
done

# apiserver as pinned by go.mod, with our test server in place of the embedded etcd one.
cd "$here"
src=$(go mod download -json k8s.io/apiserver | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
rm -rf "$work/apiserver"
mkdir -p "$work/results"
cp -r "$src" "$work/apiserver"
chmod -R u+w "$work/apiserver"
cp testserver/*.go "$work/apiserver/pkg/storage/etcd3/testserver/"
cp go.mod go.sum "$work/"
go mod edit -modfile "$work/go.mod" -replace "k8s.io/apiserver=$work/apiserver"
for p in "${packages[@]}"; do
  go test -modfile "$work/go.mod" -c -o "$work/$p.test" "${import[$p]}"
done
# The frame checker that largeobjects' tests pass every connection through, checked itself.
go vet ./wirecheck && go test ./wirecheck

pids=()
for spec in "${specs[@]}"; do
  name=${spec%%=*}
  IFS=: read -r binary members chosen tls <<<"${spec#*=}"
  for p in ${chosen//,/ }; do
    (cd "$work" && STORAGE_SUITE_SERVER="$binary" STORAGE_SUITE_MEMBERS="$members" \
      STORAGE_SUITE_TLS="${tls:+1}" \
      go tool test2json -t "./$p.test" -test.v -test.timeout 25m \
      > "results/$name.$p.json" 2>&1 || true) &
    pids+=($!)
  done
done
wait "${pids[@]}"
# Tests that failed run once more, alone and one package at a time: some upstream tests allow
# the server 100 ms (TestCompact), which a machine running every suite at once can miss. A test
# binary that did not finish (an upstream test panicked) runs again all it had not passed.
python3 "$here/summarize.py" --to-rerun "$work/results" "${specs[@]}" | while read -r name p how regex; do
  for spec in "${specs[@]}"; do
    [[ ${spec%%=*} == "$name" ]] || continue
    IFS=: read -r binary members _ tls <<<"${spec#*=}"
    (cd "$work" && STORAGE_SUITE_SERVER="$binary" STORAGE_SUITE_MEMBERS="$members" \
      STORAGE_SUITE_TLS="${tls:+1}" \
      go tool test2json -t "./$p.test" -test.v "-test.$how" "$regex" -test.timeout 10m \
      > "results/$name.$p.rerun.json" 2>&1 || true)
  done
done
python3 "$here/summarize.py" "$work/results" "${specs[@]}"
