#!/usr/bin/env bash
# Runs apiserver_test.py -- a real kube-apiserver 1.37 on three members of SERVER over TLS,
# driven with kubectl -- and then a short control-plane load through it
# (benches/controlplane/apiserver/run.py: updates, paginated lists, watches and Events, checking
# that no acknowledged update is lost, every list is whole and every watch sees every update), if
# kube-apiserver and kubectl were built from this go.sum (build.sh, into ~/.cache/concord-kube or
# $CONCORD_KUBE_DIR). Otherwise it says how to build them and passes: their first build takes
# about 7 minutes, more than a fresh machine's CI run can spare; with --build it builds them
# first.
#
#   k8s-tests/apiserver/run.sh SERVER [--build]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
server=$(realpath "$1")
kube="${CONCORD_KUBE_DIR:-$HOME/.cache/concord-kube}"
want=$(sha256sum "$here/go.sum" | cut -d' ' -f1)
if [[ "$(cat "$kube/go.sum.sha256" 2>/dev/null)" != "$want" ]]; then
  if [[ "${2:-}" != --build ]]; then
    echo "kube-apiserver test skipped: kube-apiserver is not built for this go.sum" \
      "(k8s-tests/apiserver/build.sh builds it once, ~7 min)"
    exit 0
  fi
  "$here/build.sh" "$kube"
fi
python3 "$here/apiserver_test.py" --server "$server" --kube-dir "$kube"
python3 "$here/../../benches/controlplane/apiserver/run.py" --server "concord=$server:3" --kube-dir "$kube" -- \
  --objects 2000 --namespaces 10 --watches 40 --update-rate 50 --list-rate 1 --event-rate 10 \
  --duration 10s
