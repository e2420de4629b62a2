package main

import (
	"fmt"
	"strings"

	"concord.local/controlplane-bench/latency"
)

// result is what was measured on one server.
type result struct {
	name                   string
	loadSeconds            float64
	rssAfterLoad, rssAtEnd float64
	cpuCores               float64
	// generatorCores is this benchmark's own CPU over the same window (it shares the machine).
	generatorCores        float64
	update, list, event   latency.Recorder
	watch                 latency.Recorder
	delivered             int64
	conflicts, listErrors int64
	compactions           int
}

// render is the Markdown report: one row per server, then each other server against each etcd.
func render(o options, results []*result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d objects of %d-%d B in %d types x %d namespaces; for %s: %.0f GuaranteedUpdates/s, "+
		"%.1f paginated lists/s (limit %d), %.0f Events/s under a lease, %d prefix watches with prev_kv, "+
		"compaction every %s.\n\n",
		o.objects, o.minSize, o.maxSize, o.types, o.namespaces, o.duration, o.updateRate, o.listRate, o.page,
		o.eventRate, o.watches, o.compactEvery)
	b.WriteString("| server | load (s) | list p50 / p99 (ms) | update p50 / p99 (ms) | event create p99 (ms) | " +
		"watch delivery p50 / p99 (ms) | events delivered | RSS after load / at end (MiB) | server CPU (cores) | generator CPU (cores) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range results {
		r := results[i]
		fmt.Fprintf(&b, "| %s | %.1f | %.1f / %.1f | %.2f / %.2f | %.2f | %.2f / %.2f | %d | %.0f / %.0f | %.2f | %.2f |\n",
			r.name, r.loadSeconds, r.list.Percentile(50), r.list.Percentile(99),
			r.update.Percentile(50), r.update.Percentile(99), r.event.Percentile(99),
			r.watch.Percentile(50), r.watch.Percentile(99), r.delivered, r.rssAfterLoad, r.rssAtEnd, r.cpuCores,
			r.generatorCores)
	}
	for i := range results {
		for j := range results {
			if i == j || strings.HasPrefix(results[i].name, "etcd") || !strings.HasPrefix(results[j].name, "etcd") {
				continue
			}
			a, e := results[i], results[j]
			fmt.Fprintf(&b, "\n%s / %s: list p99 %.2fx, update p99 %.2fx, watch delivery p99 %.2fx, "+
				"RSS at end %.2fx, server CPU %.2fx (lower is better).\n", a.name, e.name,
				ratio(a.list.Percentile(99), e.list.Percentile(99)), ratio(a.update.Percentile(99), e.update.Percentile(99)),
				ratio(a.watch.Percentile(99), e.watch.Percentile(99)), ratio(a.rssAtEnd, e.rssAtEnd), ratio(a.cpuCores, e.cpuCores))
		}
	}
	b.WriteString("\nOperations completed: ")
	for i := range results {
		r := results[i]
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s %d updates (%d conflicts), %d lists, %d events, %d compactions",
			r.name, r.update.Count(), r.conflicts, r.list.Count(), r.event.Count(), r.compactions)
	}
	b.WriteString(".\n")
	return b.String()
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
