#!/usr/bin/env bash
# Builds kube-apiserver and kubectl of Kubernetes 1.37.2 (k8s.io/kubernetes, pinned with its
# staging modules by go.mod and go.sum) from the Go module proxy into DEST (default:
# ~/.cache/concord-kube, outside any checkout so that every clone finds it), and stamps DEST with
# the go.sum it was built from. The first build takes about 7 minutes on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${1:-${CONCORD_KUBE_DIR:-$HOME/.cache/concord-kube}}"
mkdir -p "$dest"
cd "$here"
# The version Kubernetes' release builds stamp in (a plain build says v0.0.0-master).
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$version" | cut -d. -f2)
stamp="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1"
stamp+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
go build -trimpath -ldflags "$stamp" -o "$dest/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
go build -trimpath -ldflags "$stamp" -o "$dest/kubectl" k8s.io/kubernetes/cmd/kubectl
sha256sum go.sum | cut -d' ' -f1 > "$dest/go.sum.sha256"
echo "$dest"
