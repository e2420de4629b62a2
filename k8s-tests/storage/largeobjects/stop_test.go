package largeobjects

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestAStoppingMemberEndsNoResponseMidMessage stops a member (SIGTERM) while 100 KiB values
// are being read and watched with prev_kv on its connections. A server that goes away may end
// its connections, but it must not end or reset a response stream in the middle of a message:
// grpc-go before 1.72.1 reports a reset there as `Internal: unexpected EOF`, which is how
// kube-apiserver-style clients once saw a get fail. The wire check fails the test on such a
// frame; the calls in flight may fail (Unavailable, or their deadline), never with Internal.
func TestAStoppingMemberEndsNoResponseMidMessage(t *testing.T) {
	for round := 0; round < 3; round++ {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) { stopMidTransfer(t, int64(round)) })
	}
}

func stopMidTransfer(t *testing.T, seed int64) {
	cluster, client := checkedClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	rng := rand.New(rand.NewSource(seed))
	value := make([]byte, valueSize)
	for i := 0; i < keys; i++ {
		rng.Read(value)
		if _, err := client.Put(ctx, fmt.Sprintf("/registry/stop/%d", i), string(value)); err != nil {
			t.Fatal(err)
		}
	}
	for w := 0; w < 4; w++ {
		watch := client.Watch(ctx, "/registry/stop/", clientv3.WithPrefix(), clientv3.WithPrevKV())
		go func() {
			for range watch {
			}
		}()
	}

	// stopped: the stop has begun (a call's failure ends its worker); stoppedAt: when the
	// member had exited (a second later the workers end anyway).
	var stopped atomic.Bool
	var stoppedAt atomic.Int64
	var calls, failed atomic.Int64
	var wg sync.WaitGroup
	failures := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			v := make([]byte, valueSize)
			// Calls go on through the stop until one fails (the member's last moments), or
			// for a second after it where other members serve them.
			for i := 0; ; i++ {
				if at := stoppedAt.Load(); at != 0 && time.Since(time.Unix(0, at)) > time.Second {
					return
				}
				key := fmt.Sprintf("/registry/stop/%d", (w+i)%keys)
				// Its own deadline: the client retries a get while the member is gone.
				callCtx, cancelCall := context.WithTimeout(ctx, 2*time.Second)
				var err error
				if w%2 == 0 {
					_, err = client.Get(callCtx, key)
				} else {
					_, err = client.Put(callCtx, key, string(v))
				}
				cancelCall()
				calls.Add(1)
				if err == nil {
					continue
				}
				failed.Add(1)
				if status.Code(err) == codes.Internal || strings.Contains(err.Error(), "unexpected EOF") {
					// One per worker: the channel holds them all.
					failures <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				if stopped.Load() {
					return
				}
			}
		}(w)
	}
	time.Sleep(time.Duration(300+rng.Intn(400)) * time.Millisecond)
	stopped.Store(true)
	cluster.Stop(0)
	stoppedAt.Store(time.Now().UnixNano())
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("calls still running a minute after the member stopped")
	}
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	totals := cluster.WireTotals()
	t.Logf("%d calls, %d failed; %d DATA frames (%d MiB), %d server resets, %d GOAWAYs",
		calls.Load(), failed.Load(), totals.DataFrames, totals.DataBytes>>20, totals.ServerResets, totals.GoAways)
}
