// Command etcd is reference etcd 3.6 (the version Kubernetes ships) for Concord's benchmarks:
// etcd's own server entry point, built from the Go module proxy by build.sh.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
