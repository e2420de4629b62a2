#!/usr/bin/env bash
# Builds reference etcd 3.6.16 (the server, from main.go, etcdctl and etcdutl) from the Go module proxy
# into DEST (default: .etcd-ref/bin/etcd-3.6 at the top of the checkout), for benchmarks beside
# etcd 3.5.1 (../shared/tools/install-etcd-ref.sh). Versions are pinned by go.mod and go.sum.
# Needs Go; takes a few minutes once.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${1:-$here/../../.etcd-ref/bin/etcd-3.6}"
mkdir -p "$dest"
cd "$here"
go build -trimpath -o "$dest/etcd" .
go build -trimpath -o "$dest/etcdctl" go.etcd.io/etcd/etcdctl/v3
go build -trimpath -o "$dest/etcdutl" go.etcd.io/etcd/etcdutl/v3
# sed reads all of it: head would exit early, and pipefail would turn etcd's SIGPIPE into exit 141.
"$dest/etcd" --version | sed -n 1p
