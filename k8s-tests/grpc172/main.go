// Command grpc172 is a fresh-connection stress with grpc-go 1.72.0 and the etcd client 3.6.5:
// a client of that grpc-go reports an RST_STREAM received in the middle of a message as
// `Internal: unexpected EOF` (grpc/grpc-go#8281, fixed in 1.72.1), as kube-apiserver's storage
// layer once did against Concord. Four workers each connect over and over (TLS with a client
// certificate), watch their prefix with prev_kv (half of them reading slowly), put three
// 100 KiB objects and read each back, then close. Prints the clients made and every error by
// its text; exits 1 on any error.
//
//	go run . --endpoints https://127.0.0.1:2379 --certs DIR --duration 3m
//
// DIR holds ca.crt, client.crt and client.key. Keep the server compacted meanwhile (the values
// add up to about 1 GB a minute).
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

func main() {
	ep := flag.String("endpoints", "https://127.0.0.1:2379", "the members' client URLs, comma-separated")
	dir := flag.String("certs", ".", "the directory of ca.crt, client.crt and client.key")
	dur := flag.Duration("duration", time.Minute, "how long new clients are made")
	flag.Parse()
	ca, err := os.ReadFile(*dir + "/ca.crt")
	if err != nil {
		panic(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		panic("no certificate in ca.crt")
	}
	cert, err := tls.LoadX509KeyPair(*dir+"/client.crt", *dir+"/client.key")
	if err != nil {
		panic(err)
	}
	cfg := clientv3.Config{Endpoints: strings.Split(*ep, ","), DialTimeout: 10 * time.Second,
		TLS: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}, Logger: zap.NewNop()}
	fmt.Println("grpc", grpc.Version)
	end := time.Now().Add(*dur)
	var mu sync.Mutex
	errs := map[string]int{}
	clients := 0
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for time.Now().Before(end) {
				err := fresh(cfg, w, rng, w%2 == 1)
				mu.Lock()
				clients++
				if err != nil {
					errs[err.Error()]++
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	fmt.Printf("%d fresh clients, %d distinct errors\n", clients, len(errs))
	for e, n := range errs {
		fmt.Printf("%6d  %s\n", n, e)
	}
	if len(errs) > 0 {
		os.Exit(1)
	}
}

// fresh is one client's life: connect, watch, three objects written and read, close.
func fresh(cfg clientv3.Config, w int, rng *rand.Rand, slow bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	prefix := fmt.Sprintf("/registry/old/%d/", w)
	start, err := c.Get(ctx, prefix, clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("first get: %w", err)
	}
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer stop()
	watch := c.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(start.Header.Revision+1))
	seen := make(chan error, 1)
	pause := time.Duration(0)
	if slow {
		// Drawn here: the goroutine may outlive this call, and rng is the worker's.
		pause = time.Duration(1+rng.Intn(5)) * time.Millisecond
	}
	go func() {
		n := 0
		for resp := range watch {
			time.Sleep(pause)
			if resp.Err() != nil {
				seen <- fmt.Errorf("watch: %w", resp.Err())
				return
			}
			n += len(resp.Events)
			if n >= 3 {
				seen <- nil
				return
			}
		}
		seen <- fmt.Errorf("watch closed after %d", n)
	}()
	value := make([]byte, 100<<10)
	for i := 0; i < 3; i++ {
		rand.Read(value)
		key := fmt.Sprintf("%s%d", prefix, rand.Intn(8))
		put, err := c.Put(ctx, key, string(value))
		if err != nil {
			return fmt.Errorf("put: %w", err)
		}
		got, err := c.Get(ctx, key, clientv3.WithRev(put.Header.Revision))
		if err != nil {
			return fmt.Errorf("get at revision: %w", err)
		}
		if len(got.Kvs) != 1 || !bytes.Equal(got.Kvs[0].Value, value) {
			return fmt.Errorf("get: not the value written")
		}
		if _, err := c.Get(ctx, prefix, clientv3.WithPrefix()); err != nil {
			return fmt.Errorf("linearizable prefix get: %w", err)
		}
	}
	select {
	case err := <-seen:
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("watch: no events in 30 s")
	}
}
