package main

import (
	"context"
	"fmt"
	"math/rand"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// loaders is how many clients create the objects at once.
const loaders = 32

// typeName is resource type t's name in keys.
func typeName(t int) string { return fmt.Sprintf("type%02d", t) }

// load creates o.objects objects, spread evenly over the types and their namespaces, with
// kube-apiserver's create (put only if the key does not exist). It returns their keys.
func load(ctx context.Context, srv *server, o options) ([]string, error) {
	keys := make([]string, o.objects)
	for i := range keys {
		t := i % o.types
		ns := (i / o.types) % o.namespaces
		keys[i] = fmt.Sprintf("/registry/%s/ns-%02d/obj-%06d", typeName(t), ns, i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, loaders)
	for w := 0; w < loaders; w++ {
		c, err := srv.client()
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func(w int, c *clientv3.Client) {
			defer wg.Done()
			defer func() { _ = c.Close() }()
			rng := rand.New(rand.NewSource(int64(w)))
			for i := w; i < len(keys); i += loaders {
				resp, err := c.Txn(ctx).
					If(clientv3.Compare(clientv3.ModRevision(keys[i]), "=", 0)).
					Then(clientv3.OpPut(keys[i], string(object(rng, o)))).Commit()
				if err != nil {
					errs <- err
					return
				}
				if !resp.Succeeded {
					errs <- fmt.Errorf("%s already existed", keys[i])
					return
				}
			}
		}(w, c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return nil, err
	}
	return keys, nil
}
