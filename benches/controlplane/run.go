package main

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"concord.local/controlplane-bench/latency"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// workers run the scheduled operations of one kind; a server that falls behind makes them
	// start late, and that lateness counts in the latencies.
	workers = 32
	// watchClients carry the watches (each client is one connection).
	watchClients = 4
	// leaseReuse is how long kube-apiserver attaches new Events to one lease.
	leaseReuse = time.Minute
	// eventTTL is kube-apiserver's default --event-ttl.
	eventTTL = 3600
)

// run offers the fixed load for o.duration and fills r.
func run(parent context.Context, srv *server, o options, keys []string, r *result) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	clients := make([]*clientv3.Client, 0, 8)
	newClient := func() (*clientv3.Client, error) {
		c, err := srv.client()
		if err == nil {
			clients = append(clients, c)
		}
		return c, err
	}
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	api, err := newClient()
	if err != nil {
		return err
	}
	start, err := api.Get(ctx, "health")
	if err != nil {
		return err
	}

	var delivered atomic.Int64
	watchWG, err := startWatches(ctx, o, start.Header.Revision+1, newClient, &r.watch, &delivered)
	if err != nil {
		return err
	}
	lease, err := api.Grant(ctx, eventTTL)
	if err != nil {
		return err
	}
	leaseAt := time.Now()
	var leaseMu sync.Mutex
	currentLease := func() clientv3.LeaseID {
		leaseMu.Lock()
		defer leaseMu.Unlock()
		if time.Since(leaseAt) > leaseReuse {
			if l, err := api.Grant(ctx, eventTTL); err == nil {
				lease, leaseAt = l, time.Now()
			}
		}
		return lease.ID
	}

	cpu0, own0, t0 := srv.cpuSeconds(), ownCPUSeconds(), time.Now()
	var wg sync.WaitGroup
	var conflicts, listErrors, eventNumber atomic.Int64
	perType := o.objects / o.types
	var listed atomic.Int64
	schedule(&wg, o.updateRate, o.duration, &r.update, func(rng *rand.Rand) error {
		n, err := guaranteedUpdate(ctx, api, keys[rng.Intn(len(keys))], object(rng, o))
		conflicts.Add(int64(n))
		return err
	})
	schedule(&wg, o.listRate, o.duration, &r.list, func(rng *rand.Rand) error {
		t := int(listed.Add(1)) % o.types
		n, err := listType(ctx, api, typeName(t), o.page)
		if err != nil {
			listErrors.Add(1)
			return err
		}
		if n < perType {
			return fmt.Errorf("listed %d objects of %s, want at least %d", n, typeName(t), perType)
		}
		return nil
	})
	schedule(&wg, o.eventRate, o.duration, &r.event, func(rng *rand.Rand) error {
		n := eventNumber.Add(1)
		key := fmt.Sprintf("/registry/events/ns-%02d/event-%07d", n%int64(o.namespaces), n)
		_, err := api.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(object(rng, o)), clientv3.WithLease(currentLease()))).Commit()
		return err
	})
	compactions := make(chan int, 1)
	go func() { compactions <- compactLoop(ctx, api, o.compactEvery, t0.Add(o.duration)) }()
	wg.Wait()
	elapsed := time.Since(t0).Seconds()
	r.cpuCores = (srv.cpuSeconds() - cpu0) / elapsed
	r.generatorCores = (ownCPUSeconds() - own0) / elapsed
	r.conflicts, r.listErrors, r.compactions = conflicts.Load(), listErrors.Load(), <-compactions

	// Let the watches deliver the last events, then stop them.
	time.Sleep(2 * time.Second)
	r.delivered = delivered.Load()
	cancel()
	watchWG.Wait()
	updates, firstUpdate := r.update.Errors()
	lists, firstList := r.list.Errors()
	events, firstEvent := r.event.Errors()
	if updates > 0 || lists > 0 || events > 0 {
		return fmt.Errorf("failed operations: %d updates (%v), %d lists (%v), %d events (%v)",
			updates, firstUpdate, lists, firstList, events, firstEvent)
	}
	return nil
}

// schedule runs op at `rate` per second for `duration` on `workers` goroutines, each with its
// own random source, and records each one's latency from its scheduled start into rec.
func schedule(wg *sync.WaitGroup, rate float64, duration time.Duration, rec *latency.Recorder, op func(*rand.Rand) error) {
	if rate <= 0 {
		return
	}
	total := int(rate * duration.Seconds())
	starts := make(chan time.Time, total)
	begin := time.Now()
	go func() {
		defer close(starts)
		interval := time.Duration(float64(time.Second) / rate)
		for i := 0; i < total; i++ {
			at := begin.Add(time.Duration(i) * interval)
			time.Sleep(time.Until(at))
			starts <- at
		}
	}()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w) + begin.UnixNano()))
			for at := range starts {
				err := op(rng)
				rec.Add(time.Since(at), err)
			}
		}(w)
	}
}

// guaranteedUpdate replaces key's value the way kube-apiserver's GuaranteedUpdate does: read,
// then compare-and-swap on the mod revision, and on a conflict try again from the current
// object the failed transaction returned. It returns how many conflicts it met.
func guaranteedUpdate(ctx context.Context, c *clientv3.Client, key string, value []byte) (int, error) {
	got, err := c.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if len(got.Kvs) != 1 {
		return 0, fmt.Errorf("%s is missing", key)
	}
	rev := got.Kvs[0].ModRevision
	for conflicts := 0; ; conflicts++ {
		stamp(value)
		resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, string(value))).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return conflicts, err
		}
		if resp.Succeeded {
			return conflicts, nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) != 1 {
			return conflicts, fmt.Errorf("%s vanished", key)
		}
		rev = kvs[0].ModRevision
	}
}

// listType lists every object of a type in pages of `page`, pinned to the first page's
// revision as kube-apiserver's paginated lists are; it returns how many it listed.
func listType(ctx context.Context, c *clientv3.Client, typ string, page int64) (int, error) {
	prefix := "/registry/" + typ + "/"
	end := clientv3.GetPrefixRangeEnd(prefix)
	from, rev, n := prefix, int64(0), 0
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(page)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := c.Get(ctx, from, opts...)
		if err != nil {
			return n, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		n += len(resp.Kvs)
		if !resp.More || len(resp.Kvs) == 0 {
			return n, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// startWatches opens o.watches prefix watches with prev_kv over the types, from revision rev,
// spread over watchClients connections; each PUT delivered adds its delay since the write was
// sent to rec.
func startWatches(ctx context.Context, o options, rev int64, newClient func() (*clientv3.Client, error),
	rec *latency.Recorder, delivered *atomic.Int64) (*sync.WaitGroup, error) {
	var wg sync.WaitGroup
	var cs []*clientv3.Client
	for i := 0; i < watchClients; i++ {
		c, err := newClient()
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	for w := 0; w < o.watches; w++ {
		c := cs[w%len(cs)]
		prefix := "/registry/" + typeName(w%o.types) + "/"
		ch := c.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(rev))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for resp := range ch {
				if err := resp.Err(); err != nil && ctx.Err() == nil {
					rec.Add(0, fmt.Errorf("watch of %s: %w", prefix, err))
				}
				for _, ev := range resp.Events {
					if at, ok := stamped(ev.Kv.Value); ok && ev.Type == clientv3.EventTypePut {
						rec.Add(time.Since(at), nil)
						delivered.Add(1)
					}
				}
			}
		}()
	}
	return &wg, nil
}

// compactLoop compacts every `every` until `until` the way kube-apiserver's compactor does (a
// transaction on compact_rev_key's version, then Compact at the revision seen the interval
// before); it returns how many compactions it made.
func compactLoop(ctx context.Context, c *clientv3.Client, every time.Duration, until time.Time) int {
	const key = "compact_rev_key"
	var version, rev int64
	done := 0
	for time.Now().Add(every).Before(until) {
		select {
		case <-time.After(every):
		case <-ctx.Done():
			return done
		}
		resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", version)).
			Then(clientv3.OpPut(key, strconv.FormatInt(rev, 10))).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			continue
		}
		if !resp.Succeeded {
			version = resp.Responses[0].GetResponseRange().Kvs[0].Version
			rev = resp.Header.Revision
			continue
		}
		version++
		if rev != 0 {
			if _, err := c.Compact(ctx, rev); err == nil {
				done++
			}
		}
		rev = resp.Header.Revision
	}
	return done
}
