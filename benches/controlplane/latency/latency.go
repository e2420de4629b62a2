// Package latency collects the latencies and failures of one kind of operation, for the
// control-plane benchmarks (etcd's API directly, and through kube-apiserver).
package latency

import (
	"sort"
	"sync"
	"time"
)

// Recorder collects the latencies (and failures) of one kind of operation; safe for
// concurrent use.
type Recorder struct {
	mu         sync.Mutex
	samples    []time.Duration
	errors     int
	firstError error
}

// Add records one operation: its latency, or its error.
func (l *Recorder) Add(d time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errors++
		if l.firstError == nil {
			l.firstError = err
		}
		return
	}
	l.samples = append(l.samples, d)
}

// Percentile is the p-th percentile in milliseconds (0 without samples).
func (l *Recorder) Percentile(p float64) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.samples) == 0 {
		return 0
	}
	sort.Slice(l.samples, func(i, j int) bool { return l.samples[i] < l.samples[j] })
	i := int(p / 100 * float64(len(l.samples)-1))
	return float64(l.samples[i]) / float64(time.Millisecond)
}

// Count is how many operations succeeded.
func (l *Recorder) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.samples)
}

// Errors is how many operations failed, and the first failure.
func (l *Recorder) Errors() (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errors, l.firstError
}

// Summary is the successes, failures (and the first), p50, p99 and maximum in milliseconds.
func (l *Recorder) Summary() map[string]any {
	n, first := l.Errors()
	text := ""
	if first != nil {
		text = first.Error()
	}
	return map[string]any{"ok": l.Count(), "errors": n, "first_error": text,
		"p50_ms": l.Percentile(50), "p99_ms": l.Percentile(99), "max_ms": l.Percentile(100)}
}
