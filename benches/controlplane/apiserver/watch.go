package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"concord.local/controlplane-bench/latency"
)

// watchEvent is one line of a watch stream.
type watchEvent struct {
	Type   string    `json:"type"`
	Object configMap `json:"object"`
}

// watches are the load's ConfigMap watches, each on one namespace from a resourceVersion, as
// an informer watches after its list; a stream the server ends is resumed from the last
// resourceVersion seen.
type watches struct {
	delivered atomic.Int64
	restarts  atomic.Int64
	latency   *latency.Recorder
	wg        sync.WaitGroup
}

// startWatches opens n watches over the namespaces from rv, spread over `conns` connections.
func startWatches(ctx context.Context, o options, rv string, rec *latency.Recorder) *watches {
	w := &watches{latency: rec}
	var apis []*api
	for i := 0; i < o.watchConns; i++ {
		apis = append(apis, newAPI(o.url, o.token))
	}
	for i := 0; i < o.watches; i++ {
		a, ns := apis[i%len(apis)], namespace(i%o.namespaces)
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.follow(ctx, a, ns, rv)
		}()
	}
	return w
}

// follow watches ns from rv until ctx ends.
func (w *watches) follow(ctx context.Context, a *api, ns, rv string) {
	for ctx.Err() == nil {
		next, err := w.stream(ctx, a, ns, rv)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.latency.Add(0, fmt.Errorf("watch of %s from %s: %w", ns, rv, err))
			time.Sleep(100 * time.Millisecond)
		}
		rv = next
		w.restarts.Add(1)
	}
}

// stream reads one watch stream and returns the last resourceVersion it delivered.
func (w *watches) stream(ctx context.Context, a *api, ns, rv string) (string, error) {
	path := "/api/v1/namespaces/" + ns + "/configmaps?watch=1&allowWatchBookmarks=true&resourceVersion=" + rv
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+path, nil)
	if err != nil {
		return rv, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.http.Do(req)
	if err != nil {
		return rv, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return rv, &statusError{code: resp.StatusCode}
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev watchEvent
		if err := dec.Decode(&ev); err != nil {
			return rv, nil // the server ended the stream (or ctx did)
		}
		switch ev.Type {
		case "ERROR":
			return rv, fmt.Errorf("watch error event (a 410 Gone is a resourceVersion compacted away)")
		case "MODIFIED":
			if at, ok := stamped(&ev.Object); ok {
				w.latency.Add(time.Since(at), nil)
				w.delivered.Add(1)
			}
		}
		if ev.Object.Metadata.ResourceVersion != "" {
			rv = ev.Object.Metadata.ResourceVersion
		}
	}
}
