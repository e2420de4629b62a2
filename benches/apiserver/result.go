package main

import (
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// latencies collects the latencies (and failures) of one kind of operation.
type latencies struct {
	mu         sync.Mutex
	samples    []time.Duration
	errors     int
	firstError string
}

// add records one operation: its latency, or its error.
func (l *latencies) add(d time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errors++
		if l.firstError == "" {
			l.firstError = err.Error()
		}
		return
	}
	l.samples = append(l.samples, d)
}

// summary is count, errors, p50 and p99 in milliseconds.
func (l *latencies) summary() map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	sort.Slice(l.samples, func(i, j int) bool { return l.samples[i] < l.samples[j] })
	at := func(p float64) float64 {
		if len(l.samples) == 0 {
			return 0
		}
		return float64(l.samples[int(p/100*float64(len(l.samples)-1))]) / float64(time.Millisecond)
	}
	return map[string]any{"ok": len(l.samples), "errors": l.errors, "first_error": l.firstError,
		"p50_ms": at(50), "p99_ms": at(99), "max_ms": at(100)}
}

// procStats are CPU seconds (user + system) and resident memory of processes, from /proc.
type procStats struct {
	cpu      float64
	rss, hwm int64
}

// readProcs sums the stats of pids (a process that is gone counts zero).
func readProcs(pids []int) procStats {
	var s procStats
	for _, pid := range pids {
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			// Fields after the command (which may contain spaces): utime is 14th, stime 15th.
			if i := strings.LastIndexByte(string(stat), ')'); i >= 0 {
				f := strings.Fields(string(stat[i+1:]))
				if len(f) > 12 {
					u, _ := strconv.ParseFloat(f[11], 64)
					k, _ := strconv.ParseFloat(f[12], 64)
					s.cpu += (u + k) / 100
				}
			}
		}
		if status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status"); err == nil {
			for _, line := range strings.Split(string(status), "\n") {
				f := strings.Fields(line)
				if len(f) < 2 {
					continue
				}
				kib, _ := strconv.ParseInt(f[1], 10, 64)
				switch f[0] {
				case "VmRSS:":
					s.rss += kib << 10
				case "VmHWM:":
					s.hwm += kib << 10
				}
			}
		}
	}
	return s
}
