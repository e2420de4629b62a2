#!/usr/bin/env bash
# Builds kube-apiserver and kubectl of Kubernetes 1.37.2 (k8s.io/kubernetes, pinned with its
# staging modules by go.mod and go.sum) from the Go module proxy into DEST (default:
# target/kube at the top of the checkout). The first build takes many minutes on 2 cores; Go's
# build cache makes the next ones quick.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${1:-$here/../../target/kube}"
mkdir -p "$dest"
cd "$here"
go build -trimpath -o "$dest/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
go build -trimpath -o "$dest/kubectl" k8s.io/kubernetes/cmd/kubectl
echo "$dest"
