package largeobjects

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// freshRounds is how many objects each fresh client writes and reads before it closes.
const freshRounds = 3

// TestFreshConnectionsPassTheWireCheck repeats TestLargeObjectsOnOneConnectionWithAWatch on new
// connections, over and over, through a proxy that checks every HTTP/2 frame the server sends
// (wirecheck): a new connection is where grpc-go's flow-control windows change (its BDP
// estimator raises them while the first large messages arrive), and the once-seen error came
// from a short-lived client. Half the clients read their watch slowly, so that the server meets
// a full stream window while the get's response and the watch's event share the connection.
// It fails on any client error, on any frame that overruns a window the client granted or
// ends a stream in the middle of a gRPC message, and on a client's flow-control reset: what
// grpc-go reports as `unexpected EOF`.
// WIRECHECK_DURATION (default 15s) sets how long it runs.
func TestFreshConnectionsPassTheWireCheck(t *testing.T) {
	duration := 15 * time.Second
	if d, err := time.ParseDuration(os.Getenv("WIRECHECK_DURATION")); err == nil {
		duration = d
	}
	cluster, endpoints := checkedCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), duration+2*time.Minute)
	defer cancel()
	go compactBehind(ctx, cluster.Client(t).Client)

	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	var mu sync.Mutex
	clients := 0
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for time.Now().Before(deadline) {
				if err := freshClient(ctx, cluster.ClientConfig(endpoints), w, rng, w%2 == 1); err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
				mu.Lock()
				clients++
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()

	totals := cluster.WireTotals()
	if totals.DataFrames == 0 {
		t.Error("no DATA frame passed through the wire check")
	}
	t.Logf("%d fresh clients; checked %d connections, %d DATA frames (%d MiB), %d server resets, %d client resets",
		clients, totals.Conns, totals.DataFrames, totals.DataBytes>>20, totals.ServerResets, totals.ClientResets)
}

// freshClient connects, watches its prefix with prev_kv, writes freshRounds objects and reads
// each back (at its revision and linearizably), waits for their events, and closes.
func freshClient(ctx context.Context, config clientv3.Config, w int, rng *rand.Rand, slow bool) error {
	config.Logger = zap.NewNop()
	client, err := clientv3.New(config)
	if err != nil {
		return err
	}
	defer client.Close()
	prefix := fmt.Sprintf("/registry/fresh/%d/", w)
	start, err := client.Get(ctx, prefix, clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("first get: %w", err)
	}
	watchCtx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer stop()
	watch := client.Watch(watchCtx, prefix, clientv3.WithPrefix(), clientv3.WithPrevKV(),
		clientv3.WithRev(start.Header.Revision+1))
	seen := make(chan error, 1)
	pause := time.Duration(0)
	if slow {
		// Events wait unread while the writes and reads go on.
		pause = time.Duration(1+rng.Intn(5)) * time.Millisecond
	}
	go func() { seen <- countEvents(watch, freshRounds, pause) }()
	value := make([]byte, valueSize)
	for i := 0; i < freshRounds; i++ {
		rng.Read(value)
		key := fmt.Sprintf("%s%d", prefix, rng.Intn(keys))
		put, err := client.Put(ctx, key, string(value))
		if err != nil {
			return fmt.Errorf("put %d: %w", i, err)
		}
		got, err := client.Get(ctx, key, clientv3.WithRev(put.Header.Revision))
		if err != nil {
			return fmt.Errorf("get %d at revision %d: %w", i, put.Header.Revision, err)
		}
		if len(got.Kvs) != 1 || !bytes.Equal(got.Kvs[0].Value, value) {
			return fmt.Errorf("get %d: not the value written", i)
		}
		if _, err := client.Get(ctx, prefix, clientv3.WithPrefix()); err != nil {
			return fmt.Errorf("linearizable get %d of the prefix: %w", i, err)
		}
	}
	select {
	case err := <-seen:
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("the watch did not deliver %d events within 30 s", freshRounds)
	}
}

// compactBehind compacts every 2 s to 2,000 revisions behind the newest, as kube-apiserver's
// compactor keeps a window of history, so that the test's disk use stays bounded.
func compactBehind(ctx context.Context, client *clientv3.Client) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		resp, err := client.Get(ctx, "/registry/fresh/", clientv3.WithCountOnly())
		if err != nil || resp.Header.Revision <= 2000 {
			continue
		}
		_, _ = client.Compact(ctx, resp.Header.Revision-2000)
	}
}
