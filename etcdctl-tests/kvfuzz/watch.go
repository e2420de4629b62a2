package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// rawWatch is one raw watch stream and what it answered, as text, per watch ID.
type rawWatch struct {
	stream pb.Watch_WatchClient
	mu     sync.Mutex
	byID   map[int64][]string
	// last is when the stream last answered.
	last time.Time
	err  error
}

func openRawWatch(ctx context.Context, m *member) (*rawWatch, error) {
	s, err := pb.NewWatchClient(m.client.ActiveConnection()).Watch(ctx)
	if err != nil {
		return nil, err
	}
	w := &rawWatch{stream: s, byID: map[int64][]string{}, last: time.Now()}
	go func() {
		for {
			resp, err := s.Recv()
			w.mu.Lock()
			w.last = time.Now()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			w.record(resp)
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// record files one response under its watch ID: what kind of answer it is, and each event.
// How a server cuts a watch's events into responses is its own choice (etcd sends a history
// in batches), so events are filed one by one.
func (w *rawWatch) record(r *pb.WatchResponse) {
	id := r.WatchId
	if r.Created {
		w.byID[id] = append(w.byID[id], fmt.Sprintf("created at revision %d", r.GetHeader().GetRevision()))
	}
	for _, e := range r.Events {
		w.byID[id] = append(w.byID[id], eventText((*mvccpb.Event)(e)))
	}
	if r.Canceled {
		w.byID[id] = append(w.byID[id], fmt.Sprintf("canceled: compact revision %d, reason %q",
			r.CompactRevision, r.CancelReason))
	}
	if !r.Created && !r.Canceled && len(r.Events) == 0 {
		w.byID[id] = append(w.byID[id], fmt.Sprintf("progress at revision %d", r.GetHeader().GetRevision()))
	}
}

// idleFor tells whether the stream has answered nothing for d.
func (w *rawWatch) idleFor(d time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return time.Since(w.last) > d
}

// settle waits at least 150 ms (etcd replays a watch's history from a loop that runs every
// 100 ms), then until both streams have answered the same and then nothing for 30 ms, or 2 s
// have passed (a difference is given that long to close).
func settle(a, b *rawWatch) {
	start := time.Now()
	deadline := start.Add(2 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		if time.Since(start) >= 150*time.Millisecond && a.idleFor(30*time.Millisecond) &&
			b.idleFor(30*time.Millisecond) && firstDifference(a.snapshot(), b.snapshot()) < 0 {
			return
		}
	}
}

// snapshot is everything answered so far, one line per answer, grouped by watch ID.
func (w *rawWatch) snapshot() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ids []int64
	for id := range w.byID {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var out []string
	for _, id := range ids {
		for _, line := range w.byID[id] {
			out = append(out, fmt.Sprintf("watch %d: %s", id, line))
		}
	}
	if w.err != nil {
		out = append(out, "stream ended: "+w.err.Error())
	}
	return out
}

// watchCreate draws a watch: a key or range, a start revision (now, in the history, at or
// before the compaction, or ahead), filters, previous values, and sometimes a watch ID of the
// client's choosing (which may already be in use).
func (g *gen) watchCreate() *pb.WatchCreateRequest {
	k := g.key()
	c := &pb.WatchCreateRequest{Key: k, RangeEnd: g.rangeEnd(k), PrevKv: g.chance(50)}
	switch g.rng.IntN(6) {
	case 0, 1:
	case 2, 3:
		c.StartRevision = max(1, g.compacted) + g.rng.Int64N(max(1, g.rev-max(1, g.compacted)+1))
	case 4:
		c.StartRevision = max(1, g.compacted-g.rng.Int64N(2))
	default:
		c.StartRevision = g.rev + 1 + g.rng.Int64N(2)
	}
	if g.chance(20) {
		c.Filters = append(c.Filters, pb.WatchCreateRequest_NOPUT)
	}
	if g.chance(20) {
		c.Filters = append(c.Filters, pb.WatchCreateRequest_NODELETE)
	}
	if g.chance(15) {
		c.WatchId = 1 + g.rng.Int64N(4)
	}
	return c
}

// watchRound sends the same random watch creations and cancellations, and writes between
// them, to a raw watch stream on each server, waits after each step until both streams are
// quiet, and compares what each watch answered.
func watchRound(ctx context.Context, g *gen, ref, sut, writer *member, steps int) []string {
	refW, err := openRawWatch(ctx, ref)
	if err != nil {
		return []string{"watch stream on etcd: " + err.Error()}
	}
	sutW, err := openRawWatch(ctx, sut)
	if err != nil {
		return []string{"watch stream on Concord: " + err.Error()}
	}
	var diffs []string
	var sent []string // every step so far, for the report
	for i := 0; i < steps; i++ {
		var send *pb.WatchRequest
		switch n := g.rng.IntN(100); {
		case n < 50:
			c := g.watchCreate()
			send = &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}}
		case n < 65:
			cancel := &pb.WatchCancelRequest{WatchId: g.rng.Int64N(7)}
			send = &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: cancel}}
		default:
			req := request{Put: g.putReq()}
			if g.chance(30) {
				req = request{Delete: g.deleteReq()}
			}
			sent = append(sent, fmt.Sprintf("%d: %s", i, describe(req)))
			want, rev := call(ctx, ref, req)
			if got, _ := call(ctx, writer, req); want != got {
				diffs = append(diffs, fmt.Sprintf("write %s during the watch round\n  etcd:    %s\n  Concord: %s",
					describe(req), want, got))
			}
			g.rev = max(g.rev, rev)
		}
		if send != nil {
			// A member's answers to a create (its header, and where a watch from now starts)
			// follow what it has applied: it is given time to apply the last write.
			if sut != writer {
				if err := waitApplied(ctx, sut, g.rev); err != nil {
					return append(diffs, err.Error())
				}
			}
			sent = append(sent, fmt.Sprintf("%d: %s", i, send.String()))
			if err := refW.stream.Send(send); err != nil {
				return append(diffs, "send to etcd: "+err.Error())
			}
			if err := sutW.stream.Send(send); err != nil {
				return append(diffs, "send to Concord: "+err.Error())
			}
		}
		settle(refW, sutW)
		want, got := refW.snapshot(), sutW.snapshot()
		if first := firstDifference(want, got); first >= 0 {
			what := "a write"
			if send != nil {
				what = send.String()
			}
			return append(diffs, fmt.Sprintf("watch round, step %d (%s)\n  etcd:\n    %s\n  Concord:\n    %s\n  steps:\n    %s",
				i, what, strings.Join(tail(want, first), "\n    "), strings.Join(tail(got, first), "\n    "),
				strings.Join(sent, "\n    ")))
		}
	}
	_ = refW.stream.CloseSend()
	_ = sutW.stream.CloseSend()
	return diffs
}

// firstDifference is the first index where a and b differ, or -1.
func firstDifference(a, b []string) int {
	for i := 0; i < max(len(a), len(b)); i++ {
		if i >= len(a) || i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return -1
}

// tail is up to 12 lines of lines from index from.
func tail(lines []string, from int) []string {
	if from >= len(lines) {
		return []string{"(nothing more)"}
	}
	return lines[from:min(len(lines), from+12)]
}
