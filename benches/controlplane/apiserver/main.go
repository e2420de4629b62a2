// Command apiserver-load offers a control plane's load to a running kube-apiserver through its
// REST API, as controllers and kubectl do, so that the etcd behind it (Concord or etcd) serves
// it the way it serves a cluster.
//
// It creates --namespaces namespaces and --objects ConfigMaps of --min-size to --max-size bytes
// spread over them (16 writers), opens --watches namespace watches from the resourceVersion
// after the load, then for --duration offers, each on a fixed schedule (latency counted from
// the scheduled start, so a server that falls behind is charged for it): updates with the
// object's resourceVersion as precondition (kube-apiserver's GuaranteedUpdate; a 409 is
// answered with a get and another try) at --update-rate, paginated lists of the ConfigMaps
// of one namespace after another (limit --page, continue tokens; a namespace's ConfigMaps are
// one key prefix, as a resource type's are) at --list-rate, and Events (stored under leases of the
// apiserver's --event-ttl) at --event-rate. kube-apiserver's own compactor runs at the interval
// it was started with. At the end every ConfigMap is listed once more and must be at the
// resourceVersion its last acknowledged update returned (no acknowledged write lost), and each
// list must have returned every object. Prints one JSON object; exits 1 if a check failed.
//
//	apiserver-load --url https://127.0.0.1:6443 --token TOKEN --server-pids 123,124 --apiserver-pid 125
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"concord.local/controlplane-bench/latency"
	"concord.local/controlplane-bench/proc"
)

// options are the command line.
type options struct {
	url, token                      string
	objects, namespaces             int
	minSize, maxSize                int
	watches, watchConns             int
	updateRate, listRate, eventRate float64
	page                            int64
	duration                        time.Duration
	serverPids, apiserverPids       []int
	// profile is where kube-apiserver's CPU profile of the load goes (none if empty).
	profile string
}

func main() {
	var o options
	var serverPids, apiserverPid string
	flag.StringVar(&o.url, "url", "https://127.0.0.1:6443", "kube-apiserver's URL")
	flag.StringVar(&o.token, "token", "", "a bearer token of a user in system:masters")
	flag.IntVar(&o.objects, "objects", 50000, "ConfigMaps created before the load")
	flag.IntVar(&o.namespaces, "namespaces", 10, "namespaces they are spread over (a namespace's list is a type's)")
	flag.IntVar(&o.minSize, "min-size", 2048, "smallest object's data in bytes")
	flag.IntVar(&o.maxSize, "max-size", 8192, "largest object's data in bytes")
	flag.IntVar(&o.watches, "watches", 200, "namespace watches, spread over the namespaces")
	flag.IntVar(&o.watchConns, "watch-conns", 4, "connections the watches share")
	flag.Float64Var(&o.updateRate, "update-rate", 300, "updates per second")
	flag.Float64Var(&o.listRate, "list-rate", 1, "paginated lists of a namespace's ConfigMaps per second")
	flag.Float64Var(&o.eventRate, "event-rate", 20, "Events created per second")
	flag.Int64Var(&o.page, "page", 500, "objects per list page")
	flag.DurationVar(&o.duration, "duration", 30*time.Second, "how long the load runs")
	flag.StringVar(&serverPids, "server-pids", "", "the storage members' process ids, comma-separated (CPU and memory)")
	flag.StringVar(&apiserverPid, "apiserver-pid", "", "kube-apiserver's process id (CPU and memory)")
	flag.StringVar(&o.profile, "profile", "", "write kube-apiserver's CPU profile of the measured window (pprof) to this file")
	flag.Parse()
	o.serverPids, o.apiserverPids = pids(serverPids), pids(apiserverPid)
	out, ok := run(o)
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	if !ok {
		os.Exit(1)
	}
}

func pids(list string) []int {
	var out []int
	for _, f := range strings.Split(list, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func namespace(i int) string { return fmt.Sprintf("load-%02d", i) }

// watchesOn is how many of the watches follow namespace k.
func watchesOn(o options, k int) int {
	n := o.watches / o.namespaces
	if k < o.watches%o.namespaces {
		n++
	}
	return n
}

func objectName(i int) string { return fmt.Sprintf("cm-%06d", i) }

// run loads the objects, runs the load and checks the outcome; returns the report and whether
// every check passed.
func run(o options) (map[string]any, bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newAPI(o.url, o.token)
	report := map[string]any{"objects": o.objects, "namespaces": o.namespaces, "watches": o.watches,
		"update_rate": o.updateRate, "list_rate": o.listRate, "event_rate": o.eventRate,
		"duration_s": o.duration.Seconds()}
	fail := func(what string, err error) (map[string]any, bool) {
		report["failed"] = fmt.Sprintf("%s: %v", what, err)
		return report, false
	}
	started := time.Now()
	objs, err := load(ctx, a, o)
	if err != nil {
		return fail("loading", err)
	}
	report["load_s"] = time.Since(started).Seconds()
	// The watches start where this list ends, as an informer's do.
	listed, rv, err := a.listAll(ctx, "", o.page)
	if err != nil || len(listed) != o.objects {
		return fail("the list after loading", fmt.Errorf("%d objects, %v", len(listed), err))
	}
	var watchLat latency.Recorder
	w := startWatches(ctx, o, rv, &watchLat)
	time.Sleep(time.Second) // the watches are established

	servers0, api0 := proc.Read(o.serverPids...), proc.Read(o.apiserverPids...)
	profiled := make(chan error, 1)
	if o.profile != "" {
		go func() { profiled <- a.cpuProfile(ctx, o.duration, o.profile) }()
	} else {
		profiled <- nil
	}
	res := offer(ctx, a, o, objs)
	servers1, api1 := proc.Read(o.serverPids...), proc.Read(o.apiserverPids...)
	time.Sleep(2 * time.Second) // the last events reach the watches
	if err := <-profiled; err != nil {
		report["profile_error"] = err.Error()
	}
	cancel()
	w.wg.Wait()

	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	lost, err := verify(ctx2, a, o, objs)
	if err != nil {
		return fail("the final list", err)
	}
	secs := o.duration.Seconds()
	report["update"] = res.update.Summary()
	report["update_conflicts"] = res.conflicts.Load()
	report["list"] = res.list.Summary()
	report["list_incomplete"] = res.incomplete.Load()
	report["event"] = res.event.Summary()
	report["watch"] = watchLat.Summary()
	// Each acknowledged update is one event on every watch of its namespace.
	expected := int64(0)
	for k := range res.updatesIn {
		expected += res.updatesIn[k].Load() * int64(watchesOn(o, k))
	}
	report["watch_delivered"] = w.delivered.Load()
	report["watch_expected"] = expected
	report["watch_restarts"] = w.restarts.Load()
	report["lost_updates"] = lost
	report["server_cpu_cores"] = (servers1.CPU - servers0.CPU) / secs
	report["server_rss_mib"] = float64(servers1.RSS) / (1 << 20)
	report["server_peak_rss_mib"] = float64(servers1.HWM) / (1 << 20)
	report["apiserver_cpu_cores"] = (api1.CPU - api0.CPU) / secs
	report["apiserver_rss_mib"] = float64(api1.RSS) / (1 << 20)
	ok := lost == 0 && res.incomplete.Load() == 0 && w.delivered.Load() == expected &&
		failures(&res.update, &res.list, &res.event, &watchLat) == 0
	return report, ok
}

// failures is how many operations failed among the recorders.
func failures(recs ...*latency.Recorder) int {
	n := 0
	for _, r := range recs {
		failed, _ := r.Errors()
		n += failed
	}
	return n
}
