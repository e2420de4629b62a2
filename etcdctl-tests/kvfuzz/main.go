// Command kvfuzz sends the same random KV and lease requests, raw (every field of etcd's API,
// no client-side checks), to reference etcd and to Concord, each one fresh member, and
// compares every answer (errors by gRPC code and message), the events two watches saw, every
// revision's whole state still kept, and the servers' HashKV; then the same random watch
// creations (ranges, start revisions, filters, chosen IDs) and cancellations on a raw watch
// stream of each, with writes between them, and what each watch answered. Seeded: a seed that
// finds a difference finds it again.
//
//	go run . --etcd ../../.etcd-ref/bin/etcd-ref/etcd --concord ../../target/debug/concord \
//	  --seeds 1-4 --steps 400 [--members 3]
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	etcd := flag.String("etcd", "", "the reference etcd server binary")
	concord := flag.String("concord", "", "the Concord server binary")
	seeds := flag.String("seeds", "1-4", "seeds to run: N, or FROM-TO")
	steps := flag.Int("steps", 400, "requests per seed")
	members := flag.Int("members", 1, "Concord's members (etcd runs one)")
	work := flag.String("work", os.TempDir(), "where the servers' data directories go")
	flag.Parse()
	if *etcd == "" || *concord == "" {
		fmt.Fprintln(os.Stderr, "kvfuzz: --etcd and --concord are needed")
		os.Exit(2)
	}
	from, to, err := seedRange(*seeds)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvfuzz:", err)
		os.Exit(2)
	}
	failed := 0
	for seed := from; seed <= to; seed++ {
		diffs, err := runSeed(seed, *steps, *members, *etcd, *concord, *work)
		if err != nil {
			fmt.Fprintf(os.Stderr, "seed %d: %v\n", seed, err)
			os.Exit(1)
		}
		for _, d := range diffs {
			fmt.Printf("seed %d: %s\n", seed, d)
		}
		if len(diffs) > 0 {
			failed++
		}
		fmt.Printf("seed %d: %d differences\n", seed, len(diffs))
	}
	if failed > 0 {
		fmt.Printf("kvfuzz: %d of %d seeds differ from etcd\n", failed, to-from+1)
		os.Exit(1)
	}
	fmt.Printf("kvfuzz: %d seeds, no difference from etcd\n", to-from+1)
}

// seedRange parses "N" or "FROM-TO".
func seedRange(s string) (uint64, uint64, error) {
	a, b, found := strings.Cut(s, "-")
	from, err := strconv.ParseUint(a, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("seeds %q: %w", s, err)
	}
	if !found {
		return from, from, nil
	}
	to, err := strconv.ParseUint(b, 10, 64)
	if err != nil || to < from {
		return 0, 0, fmt.Errorf("seeds %q: want N or FROM-TO", s)
	}
	return from, to, nil
}

// maxDiffs ends a seed's run after this many differences (one usually causes the next ones).
const maxDiffs = 10

// runSeed runs one seed's requests against fresh servers (Concord with `members` members,
// each request to one of them at random) and lists the differences.
func runSeed(seed uint64, steps, members int, etcdBin, concordBin, work string) ([]string, error) {
	refs, err := startCluster("etcd", etcdBin, work, 1)
	if err != nil {
		return nil, err
	}
	ref := refs[0]
	defer ref.stop()
	suts, err := startCluster("concord", concordBin, work, members)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, m := range suts {
			m.stop()
		}
	}()
	limit := 60*time.Second + time.Duration(steps*members)*100*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()

	// The watches are on the last member (a follower, most often, in a cluster).
	watched := suts[len(suts)-1]
	watches := []*watchLog{}
	for _, m := range []*member{ref, watched} {
		all := watchAll(ctx, m.client)
		deletesOfA := watchDeletesOfA(ctx, m.client)
		watches = append(watches, all, deletesOfA)
	}

	var diffs []string
	g := &gen{rng: rand.New(rand.NewPCG(seed, 0x6b76667a7a))}
	pick := rand.New(rand.NewPCG(seed, 0x6d656d62))
	for i := 0; i < steps && len(diffs) < maxDiffs; i++ {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("the seed's requests took longer than %v (at request %d)", limit, i)
		}
		req := g.next()
		if members > 1 {
			// A serializable read on a member that has not applied the last write yet may
			// rightly miss it: on a cluster every read is linearizable.
			linearizable(req)
		}
		sut := suts[pick.IntN(len(suts))]
		if members > 1 && localRead(req) {
			// etcd answers these from the member's own state (on a cluster: txns without
			// ops, since every range was made linearizable above, and lease lookups), which
			// may not have applied the last write yet: the member is given time to
			// (linearizable requests are not).
			if err := waitApplied(ctx, sut, g.rev); err != nil {
				diffs = append(diffs, err.Error())
			}
		}
		want, rev := call(ctx, ref, req)
		got, _ := call(ctx, sut, req)
		if strings.Contains(want+got, "Unavailable") || strings.Contains(want+got, "DeadlineExceeded") {
			for _, m := range suts {
				if !m.alive() {
					return nil, fmt.Errorf("%s ended at request %d %s\n%s", m.name, i,
						describe(req), m.logTail())
				}
			}
			if !ref.alive() {
				// etcd has its own bugs (3.5.1 panics on a txn whose put needs a key an
				// earlier delete of the txn removed): nothing is left to compare with.
				fmt.Printf("seed %d: reference etcd ended at request %d %s (Concord answered %s); "+
					"the seed's remaining requests are skipped\n", seed, i, describe(req), got)
				return diffs, nil
			}
		}
		if want != got {
			diffs = append(diffs, fmt.Sprintf("request %d to %s %s\n  etcd:    %s\n  Concord: %s",
				i, sut.name, describe(req), want, got))
		}
		g.rev = max(g.rev, rev)
	}
	// Every watch ends with a put and a delete of one key, so each has seen all before them.
	for _, m := range []*member{ref, suts[0]} {
		if _, err := m.client.Put(ctx, "a/end", "x"); err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", m.name, err, m.logTail())
		}
		if _, err := m.client.Delete(ctx, "a/end"); err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", m.name, err, m.logTail())
		}
	}
	for i := 0; i < 2; i++ {
		want, got := watches[i].until(ctx, "a/end"), watches[i+2].until(ctx, "a/end")
		diffs = append(diffs, compareEvents(watches[i].name, want, got)...)
	}
	// Watches started now from past revisions replay the history: from revisions still kept,
	// and from one already compacted (etcd cancels it, telling the compacted revision).
	from := []int64{g.compacted - 1, g.compacted, g.compacted + 1 + g.rng.Int64N(g.rev-g.compacted+1)}
	for _, rev := range from {
		if rev < 1 {
			continue
		}
		want := watchFrom(ctx, ref.client, rev).until(ctx, "a/end")
		got := watchFrom(ctx, watched.client, rev).until(ctx, "a/end")
		diffs = append(diffs, compareEvents(fmt.Sprintf("from revision %d", rev), want, got)...)
	}
	diffs = append(diffs, compareHistory(ctx, ref, suts, g.compacted)...)
	if len(diffs) == 0 {
		diffs = append(diffs, watchRound(ctx, g, ref, watched, suts[0], 40)...)
	}
	return diffs, nil
}

// localRead tells whether etcd answers req from the member's own state without a read index:
// a txn whose ops are all serializable ranges (one without ops too) and lease lookups.
func localRead(req request) bool {
	if req.TimeToLive != nil || req.Leases != nil {
		return true
	}
	if req.Txn == nil {
		return false
	}
	for _, op := range append(append([]*pb.RequestOp{}, req.Txn.Success...), req.Txn.Failure...) {
		if r := op.GetRequestRange(); r == nil || !r.Serializable {
			return false
		}
	}
	return true
}

// waitApplied waits until m has applied revision rev (serializable reads of it).
func waitApplied(ctx context.Context, m *member, rev int64) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := m.client.Get(ctx, "health", clientv3.WithSerializable())
		if err == nil && r.Header.Revision >= rev {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s had not applied revision %d after 5 s (%v)", m.name, rev, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// linearizable makes every range of req (inside transactions too) linearizable.
func linearizable(req request) {
	if req.Range != nil {
		req.Range.Serializable = false
	}
	var txn func(t *pb.TxnRequest)
	txn = func(t *pb.TxnRequest) {
		for _, op := range append(append([]*pb.RequestOp{}, t.Success...), t.Failure...) {
			switch v := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
				v.RequestRange.Serializable = false
			case *pb.RequestOp_RequestTxn:
				txn(v.RequestTxn)
			}
		}
	}
	if req.Txn != nil {
		txn(req.Txn)
	}
}

// compareHistory compares the whole state at every revision both still keep (read from the
// first member), and every member's HashKV with etcd's once it has applied etcd's revision.
func compareHistory(ctx context.Context, ref *member, suts []*member, compacted int64) []string {
	var diffs []string
	last, err := ref.client.Get(ctx, "health")
	if err != nil {
		return []string{"final read: " + err.Error()}
	}
	for rev := max(compacted, 1); rev <= last.Header.Revision && len(diffs) < maxDiffs; rev++ {
		req := request{Range: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev}}
		want, _ := call(ctx, ref, req)
		got, _ := call(ctx, suts[0], req)
		if want != got {
			diffs = append(diffs, fmt.Sprintf("whole state at revision %d\n  etcd:    %s\n  Concord: %s",
				rev, want, got))
		}
	}
	want := hashKV(ctx, ref, 0)
	for _, m := range suts {
		if got := hashKV(ctx, m, last.Header.Revision); got != want {
			diffs = append(diffs, fmt.Sprintf("HashKV of %s\n  etcd:    %s\n  Concord: %s",
				m.name, want, got))
		}
	}
	return diffs
}

// hashKV is m's HashKV as text, asked again for up to 5 s until m has applied revision rev.
func hashKV(ctx context.Context, m *member, rev int64) string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, err := pb.NewMaintenanceClient(m.client.ActiveConnection()).HashKV(ctx, &pb.HashKVRequest{})
		if err != nil {
			return "error " + err.Error()
		}
		if h.Header.Revision >= rev || time.Now().After(deadline) {
			return fmt.Sprintf("hash %d compact_revision %d revision %d", h.Hash,
				h.CompactRevision, h.Header.Revision)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// compareEvents lists where two watches' events differ.
func compareEvents(name string, want, got []string) []string {
	var diffs []string
	for i := 0; i < max(len(want), len(got)) && len(diffs) < maxDiffs; i++ {
		w, g := "(none)", "(none)"
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			diffs = append(diffs, fmt.Sprintf("watch %s, event %d\n  etcd:    %s\n  Concord: %s",
				name, i, w, g))
		}
	}
	return diffs
}

// watchLog is what one watch received, as text, in order.
type watchLog struct {
	name   string
	events chan string
}

// watchAll watches every key, with previous values.
func watchAll(ctx context.Context, c *clientv3.Client) *watchLog {
	return follow(ctx, "every key, prev_kv", c.Watch(ctx, "\x00", clientv3.WithFromKey(),
		clientv3.WithPrevKV(), clientv3.WithCreatedNotify()))
}

// watchFrom watches every key from revision rev, with previous values.
func watchFrom(ctx context.Context, c *clientv3.Client, rev int64) *watchLog {
	return follow(ctx, "every key from a revision", c.Watch(ctx, "\x00", clientv3.WithFromKey(),
		clientv3.WithPrevKV(), clientv3.WithRev(rev), clientv3.WithCreatedNotify()))
}

// watchDeletesOfA watches the prefix "a" with puts filtered out.
func watchDeletesOfA(ctx context.Context, c *clientv3.Client) *watchLog {
	return follow(ctx, "prefix a, no puts", c.Watch(ctx, "a", clientv3.WithPrefix(),
		clientv3.WithFilterPut(), clientv3.WithCreatedNotify()))
}

// follow collects what ch delivers, once the watch is created (asked with WithCreatedNotify).
func follow(ctx context.Context, name string, ch clientv3.WatchChan) *watchLog {
	w := &watchLog{name: name, events: make(chan string, 1<<16)}
	select {
	case <-ch:
	case <-ctx.Done():
	}
	go func() {
		defer close(w.events)
		for resp := range ch {
			if err := resp.Err(); err != nil {
				w.events <- fmt.Sprintf("watch error: %v (compact revision %d)", err, resp.CompactRevision)
				return
			}
			for _, e := range resp.Events {
				w.events <- eventText((*mvccpb.Event)(e))
			}
		}
	}()
	return w
}

// until collects the events up to and including the delete of key (or what came before the
// watch ended or ctx did).
func (w *watchLog) until(ctx context.Context, key string) []string {
	var out []string
	end := fmt.Sprintf("DELETE key:%q", key)
	deadline := time.After(20 * time.Second)
	for {
		select {
		case e, ok := <-w.events:
			if !ok {
				return out
			}
			out = append(out, e)
			if strings.HasPrefix(e, end) {
				return out
			}
		case <-deadline:
			return append(out, "(no more events within 20 s)")
		case <-ctx.Done():
			return out
		}
	}
}
