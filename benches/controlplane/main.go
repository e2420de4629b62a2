// Command controlplane measures the storage load of a Kubernetes control plane on Concord and
// on reference etcd, one fresh single-member server at a time, same machine, same run.
//
// For each server it loads objects of 2–8 KiB under /registry/<type>/<namespace>/<name> the way
// kube-apiserver creates them (a transaction on mod revision 0), then for --duration offers a
// fixed load: GuaranteedUpdates (a linearizable get, then a compare-and-swap on the mod
// revision) at --update-rate, paginated lists of a whole type (limit 500, pinned to the first
// page's revision) at --list-rate, Events created under a shared lease (kube-apiserver's lease
// reuse) at --event-rate, kube-apiserver's compaction every --compact-every, and --watches prefix
// watches on the types with prev_kv. It reports list, update and watch-delivery latencies
// (measured from each operation's scheduled start, so a server that falls behind is charged for
// it), server resident memory, and server CPU while the load runs, with its own CPU beside it
// (on a shared machine the generator's list decoding competes with the server for the cores).
//
//	go run . --server concord=../../target/release/concord --server etcd-3.6=PATH/etcd
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// options are the command line.
type options struct {
	servers      []string
	objects      int
	types        int
	namespaces   int
	minSize      int
	maxSize      int
	watches      int
	updateRate   float64
	listRate     float64
	eventRate    float64
	page         int64
	duration     time.Duration
	compactEvery time.Duration
	work         string
	markdown     string
}

type serverList []string

func (s *serverList) String() string     { return strings.Join(*s, ",") }
func (s *serverList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	var o options
	var servers serverList
	flag.Var(&servers, "server", "NAME=BINARY of a server to measure (repeat; Concord or etcd, both take etcd's flags)")
	flag.IntVar(&o.objects, "objects", 50000, "objects loaded before the load starts")
	flag.IntVar(&o.types, "types", 10, "resource types (key prefixes)")
	flag.IntVar(&o.namespaces, "namespaces", 50, "namespaces per type")
	flag.IntVar(&o.minSize, "min-size", 2048, "smallest object in bytes")
	flag.IntVar(&o.maxSize, "max-size", 8192, "largest object in bytes")
	flag.IntVar(&o.watches, "watches", 200, "prefix watches with prev_kv, spread over the types")
	flag.Float64Var(&o.updateRate, "update-rate", 300, "GuaranteedUpdates per second")
	flag.Float64Var(&o.listRate, "list-rate", 1, "paginated full lists of a type per second")
	flag.Float64Var(&o.eventRate, "event-rate", 20, "Events created per second, under a lease")
	flag.Int64Var(&o.page, "page", 500, "objects per list page")
	flag.DurationVar(&o.duration, "duration", 30*time.Second, "how long the load runs on each server")
	flag.DurationVar(&o.compactEvery, "compact-every", 10*time.Second, "kube-apiserver's compaction interval")
	flag.StringVar(&o.work, "work", "/var/tmp", "where the servers' data directories go")
	flag.StringVar(&o.markdown, "markdown", "", "also write the table to this file")
	flag.Parse()
	o.servers = servers
	if len(o.servers) == 0 {
		fmt.Fprintln(os.Stderr, "give at least one --server NAME=BINARY")
		os.Exit(2)
	}
	var results []*result
	for _, spec := range o.servers {
		name, binary, ok := strings.Cut(spec, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "--server %q is not NAME=BINARY\n", spec)
			os.Exit(2)
		}
		binary, err := filepath.Abs(binary)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		r, err := measure(context.Background(), o, name, binary)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(1)
		}
		results = append(results, r)
	}
	table := render(o, results)
	fmt.Print(table)
	if o.markdown != "" {
		if err := os.WriteFile(o.markdown, []byte(table), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

// measure starts one server, loads it, runs the load and returns what was measured.
func measure(ctx context.Context, o options, name, binary string) (*result, error) {
	r := &result{name: name}
	srv, err := startServer(name, binary, o.work)
	if err != nil {
		return r, err
	}
	defer srv.stop()
	fmt.Fprintf(os.Stderr, "%s: loading %d objects\n", name, o.objects)
	began := time.Now()
	keys, err := load(ctx, srv, o)
	if err != nil {
		return r, err
	}
	r.loadSeconds = time.Since(began).Seconds()
	r.rssAfterLoad = srv.rssMiB()
	fmt.Fprintf(os.Stderr, "%s: loaded in %.1f s; running the load for %s\n", name, r.loadSeconds, o.duration)
	if err := run(ctx, srv, o, keys, r); err != nil {
		return r, err
	}
	r.rssAtEnd = srv.rssMiB()
	return r, nil
}

// object is a random object of o's sizes whose first 8 bytes carry the time it was sent.
func object(rng *rand.Rand, o options) []byte {
	v := make([]byte, o.minSize+rng.Intn(o.maxSize-o.minSize+1))
	rng.Read(v)
	stamp(v)
	return v
}

// stamp writes the current time into the first 8 bytes of v.
func stamp(v []byte) {
	now := time.Now().UnixNano()
	for i := 0; i < 8 && i < len(v); i++ {
		v[i] = byte(now >> (8 * i))
	}
}

// stamped reads the time stamp writes.
func stamped(v []byte) (time.Time, bool) {
	if len(v) < 8 {
		return time.Time{}, false
	}
	var n int64
	for i := 0; i < 8; i++ {
		n |= int64(v[i]) << (8 * i)
	}
	return time.Unix(0, n), true
}
