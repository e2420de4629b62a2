// Package largeobjects checks that large objects travel whole on a connection that a watch
// shares: kube-apiserver reads, writes and watches its objects over one client connection, and
// once saw a linearizable get of a 100 KiB value fail with `Internal: unexpected EOF` while a
// prev_kv watch on that connection was receiving the same object's event.
//
// Run by run.sh against each server (STORAGE_SUITE_SERVER, STORAGE_SUITE_MEMBERS), with
// `--max-request-bytes=1048576` as in the report.
package largeobjects

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"concord.local/k8s-storage/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

const (
	valueSize = 100 << 10
	keys      = 8
	writers   = 4
	rounds    = 150
)

// TestLargeObjectsOnOneConnectionWithAWatch has writers put 100 KiB objects (overwrites, so
// every event carries 200 KiB with its prev_kv) and read each back with a linearizable get, all
// over the one connection of one client on which a prev_kv watch of the prefix receives every
// event. Every get must return exactly the value written, and the watch every event; every
// frame the server sends must pass the wire check (see TestFreshConnectionsPassTheWireCheck).
func TestLargeObjectsOnOneConnectionWithAWatch(t *testing.T) {
	cluster, client := checkedClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	start, err := client.Get(ctx, "/registry/large/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	watch := client.Watch(clientv3.WithRequireLeader(ctx), "/registry/large/",
		clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(start.Header.Revision+1))
	want := writers * rounds
	seen := make(chan error, 1)
	go func() { seen <- countEvents(watch, want, 0) }()

	var wg sync.WaitGroup
	failures := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			if err := writeAndRead(ctx, client, w); err != nil {
				failures <- err
			}
		}(w)
	}
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	select {
	case err := <-seen:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(time.Minute):
		t.Errorf("the watch did not deliver %d events within a minute of the last write", want)
	}
	totals := cluster.WireTotals()
	if totals.DataFrames == 0 {
		t.Error("no DATA frame passed through the wire check")
	}
	t.Logf("checked %d DATA frames (%d MiB)", totals.DataFrames, totals.DataBytes>>20)
}

// checkedCluster starts a cluster with the request limit of the report
// (`--max-request-bytes=1048576`) and the wire check in front of its members; it returns the
// cluster and the URLs its clients dial.
func checkedCluster(t *testing.T) (*testserver.Cluster, []string) {
	cfg := testserver.NewTestConfig(t)
	cfg.MaxRequestBytes = 1 << 20
	cluster := testserver.StartCluster(t, cfg)
	return cluster, cluster.CheckWire(t)
}

// checkedClient starts a checked cluster and returns it with one client of all its members,
// closed when the test ends.
func checkedClient(t *testing.T) (*testserver.Cluster, *clientv3.Client) {
	cluster, endpoints := checkedCluster(t)
	config := cluster.ClientConfig(endpoints)
	config.Logger = zap.NewNop()
	client, err := clientv3.New(config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return cluster, client
}

// writeAndRead puts `rounds` values of its own over the shared keys and gets each back.
func writeAndRead(ctx context.Context, client *clientv3.Client, w int) error {
	rng := rand.New(rand.NewSource(int64(w)))
	value := make([]byte, valueSize)
	for i := 0; i < rounds; i++ {
		rng.Read(value)
		key := fmt.Sprintf("/registry/large/%d", rng.Intn(keys))
		put, err := client.Put(ctx, key, string(value))
		if err != nil {
			return fmt.Errorf("writer %d, put %d: %w", w, i, err)
		}
		got, err := client.Get(ctx, key, clientv3.WithRev(put.Header.Revision))
		if err != nil {
			return fmt.Errorf("writer %d, get %d at revision %d: %w", w, i, put.Header.Revision, err)
		}
		if len(got.Kvs) != 1 || !bytes.Equal(got.Kvs[0].Value, value) {
			return fmt.Errorf("writer %d, get %d: not the value written", w, i)
		}
		if _, err := client.Get(ctx, key); err != nil {
			return fmt.Errorf("writer %d, linearizable get %d: %w", w, i, err)
		}
	}
	return nil
}

// countEvents reads the watch until it has delivered `want` events, each a whole 100 KiB value,
// pausing before each response it takes.
func countEvents(watch clientv3.WatchChan, want int, pause time.Duration) error {
	n := 0
	for resp := range watch {
		time.Sleep(pause)
		if err := resp.Err(); err != nil {
			return fmt.Errorf("watch ended after %d events: %w", n, err)
		}
		for _, ev := range resp.Events {
			if len(ev.Kv.Value) != valueSize {
				return fmt.Errorf("event %d carries %d bytes, not %d", n, len(ev.Kv.Value), valueSize)
			}
			n++
		}
		if n >= want {
			return nil
		}
	}
	return fmt.Errorf("watch closed after %d of %d events", n, want)
}
