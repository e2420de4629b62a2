package controlplane

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"testing"
	"time"

	"concord.local/k8s-storage/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// TestMutexRecipe has eight sessions, each on its own client, take the official client's Mutex
// in turn and increment a counter kept in a plain key, read and written without a
// transaction. Under a correct lock no increment is lost, and every holder's lock key has a
// create revision (its fencing token) above the previous holder's.
func TestMutexRecipe(t *testing.T) {
	const sessions, rounds = 8, 10
	cluster := testserver.StartCluster(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var mu sync.Mutex
	var tokens []int64
	clients := make([]*clientv3.Client, sessions)
	for i := range clients {
		clients[i] = cluster.Client(t).Client
	}
	concurrently(t, sessions, func(i int) error {
		client := clients[i]
		session, err := concurrency.NewSession(client, concurrency.WithTTL(10))
		if err != nil {
			return err
		}
		defer func() { _ = session.Close() }()
		m := concurrency.NewMutex(session, "/locks/counter")
		for r := 0; r < rounds; r++ {
			if err := m.Lock(ctx); err != nil {
				return err
			}
			held, err := client.Get(ctx, m.Key())
			if err != nil || len(held.Kvs) != 1 {
				return fmt.Errorf("the held lock key %s: %v %v", m.Key(), held, err)
			}
			mu.Lock()
			tokens = append(tokens, held.Kvs[0].CreateRevision)
			mu.Unlock()
			if err := addOne(ctx, client, "/counter"); err != nil {
				return err
			}
			if err := m.Unlock(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	client := cluster.Client(t).Client
	resp, err := client.Get(ctx, "/counter")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(resp.Kvs[0].Value); got != strconv.Itoa(sessions*rounds) {
		t.Fatalf("counter %s, want %d: two sessions held the lock at once", got, sessions*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("lock %d acquired at revision %d, not after the previous holder's %d", i, tokens[i], tokens[i-1])
		}
	}
}

// addOne reads a decimal counter and writes it back plus one, with no transaction: only the
// lock around it keeps increments from being lost.
func addOne(ctx context.Context, client *clientv3.Client, key string) error {
	resp, err := client.Get(ctx, key)
	if err != nil {
		return err
	}
	n := 0
	if len(resp.Kvs) == 1 {
		if n, err = strconv.Atoi(string(resp.Kvs[0].Value)); err != nil {
			return err
		}
	}
	_, err = client.Put(ctx, key, strconv.Itoa(n+1))
	return err
}

// TestElectionRecipe has three candidates campaign with the official client's Election: one
// leads at a time, an observer sees each new leader's value, and when the leader resigns the
// next candidate leads.
func TestElectionRecipe(t *testing.T) {
	cluster := testserver.StartCluster(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	observer, err := concurrency.NewSession(cluster.Client(t).Client)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = observer.Close() }()
	leaders := concurrency.NewElection(observer, "/election/controller").Observe(ctx)

	type candidate struct {
		name     string
		election *concurrency.Election
		elected  chan error
	}
	var candidates []*candidate
	for i := 0; i < 3; i++ {
		session, err := concurrency.NewSession(cluster.Client(t).Client, concurrency.WithTTL(10))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = session.Close() }()
		c := &candidate{name: fmt.Sprintf("controller-%d", i),
			election: concurrency.NewElection(session, "/election/controller"), elected: make(chan error, 1)}
		candidates = append(candidates, c)
		go func() { c.elected <- c.election.Campaign(ctx, c.name) }()
		time.Sleep(200 * time.Millisecond) // campaigns in order: controller-0 first
	}

	for round, c := range candidates {
		select {
		case err := <-c.elected:
			if err != nil {
				t.Fatalf("%s's campaign: %v", c.name, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: %s was not elected", round, c.name)
		}
		for _, other := range candidates[round+1:] {
			select {
			case err := <-other.elected:
				t.Fatalf("%s elected (%v) while %s leads", other.name, err, c.name)
			default:
			}
		}
		if err := waitObserved(leaders, c.name); err != nil {
			t.Fatal(err)
		}
		if err := c.election.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// waitObserved waits until the observer reports `name` as the leader's value.
func waitObserved(leaders <-chan *clientv3.GetResponse, name string) error {
	timeout := time.After(30 * time.Second)
	for {
		select {
		case resp, ok := <-leaders:
			if !ok {
				return fmt.Errorf("the observer stopped before %s led", name)
			}
			if len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == name {
				return nil
			}
		case <-timeout:
			return fmt.Errorf("the observer never saw %s lead", name)
		}
	}
}

// TestSTMRecipe moves money between ten accounts from eight clients at once with the official
// client's software transactional memory (serializable isolation): the total never changes.
// Each client talks to one member, as the recipe needs: its reads after the first are
// serializable reads at the first one's revision, which another member that has not applied
// that revision yet refuses ("required revision is a future revision", etcd and Concord alike).
func TestSTMRecipe(t *testing.T) {
	const accounts, movers, moves, total = 10, 8, 30, 1000
	cluster := testserver.StartCluster(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	setup := cluster.Client(t).Client
	for a := 0; a < accounts; a++ {
		if _, err := setup.Put(ctx, account(a), strconv.Itoa(total/accounts)); err != nil {
			t.Fatal(err)
		}
	}

	clients := make([]*clientv3.Client, movers)
	for m := range clients {
		clients[m] = cluster.MemberClient(t, m%len(cluster.Endpoints)).Client
	}
	concurrently(t, movers, func(m int) error {
		rng := rand.New(rand.NewSource(int64(m)))
		for i := 0; i < moves; i++ {
			from, to := rng.Intn(accounts), rng.Intn(accounts)
			_, err := concurrency.NewSTM(clients[m], func(stm concurrency.STM) error {
				a, errA := strconv.Atoi(stm.Get(account(from)))
				b, errB := strconv.Atoi(stm.Get(account(to)))
				if errA != nil || errB != nil {
					return fmt.Errorf("unreadable balance: %v %v", errA, errB)
				}
				if from == to || a == 0 {
					return nil
				}
				amount := 1 + rng.Intn(a)
				stm.Put(account(from), strconv.Itoa(a-amount))
				stm.Put(account(to), strconv.Itoa(b+amount))
				return nil
			}, concurrency.WithIsolation(concurrency.Serializable), concurrency.WithAbortContext(ctx))
			if err != nil {
				return err
			}
		}
		return nil
	})
	resp, err := setup.Get(ctx, "/accounts/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	sum := 0
	for _, kv := range resp.Kvs {
		n, err := strconv.Atoi(string(kv.Value))
		if err != nil {
			t.Fatal(err)
		}
		sum += n
	}
	if len(resp.Kvs) != accounts || sum != total {
		t.Fatalf("%d accounts holding %d, want %d holding %d", len(resp.Kvs), sum, accounts, total)
	}
}

func account(i int) string { return fmt.Sprintf("/accounts/%02d", i) }
