package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"concord.local/k8s-storage/testserver"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apiserver/pkg/storage/etcd3"
)

// TestCompactorRaceBetweenAPIServers runs kube-apiserver's compaction step (etcd3.Compact: a
// transaction on compact_rev_key's version, then Compact at the revision the winner saw last
// time) from four apiservers at once, round after round, with writes in between. Each round
// exactly one of them must win; from the second round on the winner compacts, and reads below
// the compacted revision must then fail as etcd's do, while reads at it still work.
func TestCompactorRaceBetweenAPIServers(t *testing.T) {
	const servers, rounds = 4, 6
	cluster := testserver.StartCluster(t, nil)
	clients := make([]*clientv3.Client, servers)
	for i := range clients {
		clients[i] = cluster.Client(t).Client
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// What each compactor remembers between rounds, as its loop does.
	versions, revs := make([]int64, servers), make([]int64, servers)
	var compacted int64
	for round := 1; round <= rounds; round++ {
		for i := 0; i < 5; i++ {
			if _, err := clients[0].Put(ctx, fmt.Sprintf("/registry/pods/ns/r%d-%d", round, i), "v"); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, servers)
		start := make(chan struct{})
		for i := range clients {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				versions[i], revs[i], _, errs[i] = etcd3.Compact(ctx, clients[i], versions[i], revs[i])
			}(i)
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, apiserver %d: %v", round, i, err)
			}
		}
		// The key's version counts the winning transactions: exactly one more each round.
		resp, err := clients[1].Get(ctx, "compact_rev_key")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].Version != int64(round) {
			t.Fatalf("round %d: compact_rev_key is %v, want version %d (one winner a round)", round, resp.Kvs, round)
		}
		// The winner wrote the revision it compacted at (0 in the first round: no compaction).
		if compacted, err = strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64); err != nil {
			t.Fatal(err)
		}
		if (round == 1) != (compacted == 0) {
			t.Fatalf("round %d: the winner compacted at %d", round, compacted)
		}
	}

	_, err := clients[2].Get(ctx, "/registry/pods/ns/r1-0", clientv3.WithRev(compacted-1))
	if !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("a read below the compacted revision %d: %v, want %v", compacted, err, rpctypes.ErrCompacted)
	}
	if _, err := clients[2].Get(ctx, "/registry/pods/ns/r1-0", clientv3.WithRev(compacted)); err != nil {
		t.Fatalf("a read at the compacted revision %d: %v", compacted, err)
	}
}
