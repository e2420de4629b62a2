//go:build tools

// Package tools pins kube-apiserver (k8s.io/kubernetes/cmd/kube-apiserver) in go.mod and
// go.sum: build.sh builds it from there.
package tools
