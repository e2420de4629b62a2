package main

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"

	"concord.local/controlplane-bench/latency"
)

// object is one loaded ConfigMap: where it is and the resourceVersion of its last acknowledged
// write. Its mutex keeps two updates of it from racing (a controller owns its objects).
type object struct {
	mu        sync.Mutex
	ns, name  string
	rv        string
	size      int
	namespace int
}

// blob is n printable random bytes.
func blob(rng *rand.Rand, n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rng.Intn(len(letters))]
	}
	return string(b)
}

// load creates the namespaces, then the objects with 16 writers.
func load(ctx context.Context, a *api, o options) ([]*object, error) {
	for i := 0; i < o.namespaces; i++ {
		ns := map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": namespace(i)}}
		if err := a.do(ctx, "POST", "/api/v1/namespaces", ns, nil); err != nil {
			return nil, fmt.Errorf("namespace %s: %w", namespace(i), err)
		}
	}
	objs := make([]*object, o.objects)
	rng := rand.New(rand.NewSource(1))
	for i := range objs {
		k := i % o.namespaces
		objs[i] = &object{ns: namespace(k), name: objectName(i), namespace: k,
			size: o.minSize + rng.Intn(o.maxSize-o.minSize+1)}
	}
	var next atomic.Int64
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(100 + w)))
			for {
				i := int(next.Add(1)) - 1
				if i >= len(objs) {
					return
				}
				obj := objs[i]
				rv, err := a.createConfigMap(ctx, obj.ns, obj.name, blob(rng, obj.size))
				if err != nil {
					errs <- fmt.Errorf("creating %s/%s: %w", obj.ns, obj.name, err)
					return
				}
				obj.rv = rv
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	return objs, <-errs
}

// objectsIn is how many objects namespace k holds (object i is in namespace i % namespaces).
func objectsIn(o options, k int) int {
	n := o.objects / o.namespaces
	if k < o.objects%o.namespaces {
		n++
	}
	return n
}

// offered is what the load measured.
type offered struct {
	update, list, event latency.Recorder
	conflicts           atomic.Int64
	incomplete          atomic.Int64
	// updatesIn counts the acknowledged updates per namespace (each one event per watch of it).
	updatesIn []atomic.Int64
}

// schedule runs op at `rate` per second for d on up to `workers` goroutines, each call given
// its scheduled start; a call that cannot start on time starts late and is charged for it.
func schedule(ctx context.Context, rate float64, d time.Duration, workers int, op func(time.Time)) *sync.WaitGroup {
	var wg sync.WaitGroup
	if rate <= 0 {
		return &wg
	}
	starts := make(chan time.Time, 4096)
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for at := range starts {
				op(at)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(starts)
		every := time.Duration(float64(time.Second) / rate)
		begin := time.Now()
		for at := begin; at.Before(begin.Add(d)); at = at.Add(every) {
			select {
			case <-time.After(time.Until(at)):
			case <-ctx.Done():
				return
			}
			starts <- at
		}
	}()
	return &wg
}

// offer runs the updates, lists and Events for o.duration.
func offer(ctx context.Context, a *api, o options, objs []*object) *offered {
	res := &offered{updatesIn: make([]atomic.Int64, o.namespaces)}
	var seq atomic.Int64
	update := func(at time.Time) {
		rng := rand.New(rand.NewSource(seq.Add(1)))
		obj := objs[rng.Intn(len(objs))]
		obj.mu.Lock()
		defer obj.mu.Unlock()
		data := blob(rng, obj.size)
		rv, err := a.updateConfigMap(ctx, obj.ns, obj.name, obj.rv, data)
		for tries := 0; isConflict(err) && tries < 5; tries++ {
			res.conflicts.Add(1)
			var cur *configMap
			if cur, err = a.getConfigMap(ctx, obj.ns, obj.name); err == nil {
				rv, err = a.updateConfigMap(ctx, obj.ns, obj.name, cur.Metadata.ResourceVersion, data)
			}
		}
		if err == nil {
			obj.rv = rv
			res.updatesIn[obj.namespace].Add(1)
		}
		res.update.Add(time.Since(at), err)
	}
	var lists atomic.Int64
	list := func(at time.Time) {
		k := int(lists.Add(1)-1) % o.namespaces
		got, _, err := a.listAll(ctx, namespace(k), o.page)
		if want := objectsIn(o, k); err == nil && len(got) != want {
			res.incomplete.Add(1)
			err = fmt.Errorf("a list of %s returned %d of %d objects", namespace(k), len(got), want)
		}
		res.list.Add(time.Since(at), err)
	}
	event := func(at time.Time) {
		n := seq.Add(1)
		obj := objs[int(n)%len(objs)]
		res.event.Add(time.Since(at), a.createEvent(ctx, obj.ns, fmt.Sprintf("%s.%d", obj.name, n), obj.name))
	}
	groups := []*sync.WaitGroup{
		schedule(ctx, o.updateRate, o.duration, 64, update),
		schedule(ctx, o.listRate, o.duration, 4, list),
		schedule(ctx, o.eventRate, o.duration, 16, event),
	}
	for _, g := range groups {
		g.Wait()
	}
	return res
}

// verify lists every object once more and counts those not at the resourceVersion of their
// last acknowledged write (missing ones included), and any listed object the load never wrote.
func verify(ctx context.Context, a *api, o options, objs []*object) (int, error) {
	listed, _, err := a.listAll(ctx, "", o.page)
	if err != nil {
		return 0, err
	}
	got := make(map[string]string, len(listed))
	for _, m := range listed {
		got[m.Namespace+"/"+m.Name] = m.ResourceVersion
	}
	lost := 0
	for _, obj := range objs {
		key := obj.ns + "/" + obj.name
		if rv, ok := got[key]; !ok || rv != obj.rv {
			lost++
		}
		delete(got, key)
	}
	return lost + len(got), nil
}
