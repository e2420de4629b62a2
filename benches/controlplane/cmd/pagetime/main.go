// Command pagetime times a Kubernetes-style paginated list page by page against one running
// server: each page's round trip as the official Go client sees it, and, apart, how long the
// client takes to decode a page of that size. What is left of a page's time is the server's
// reading, encoding and sending. Used for benches/RESULTS.md ("A list page's time taken
// apart"); the server must already be running.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

func main() {
	endpoint := flag.String("endpoint", "127.0.0.1:2379", "the server's client URL (host:port)")
	load := flag.Int("load", 0, "objects of 2-8 KiB to load first, as cpbench lays them out (10 types x 50 namespaces)")
	prefix := flag.String("prefix", "/registry/type03/", "the prefix to list")
	page := flag.Int64("page", 500, "objects per page")
	rounds := flag.Int("rounds", 20, "whole lists to time")
	window := flag.Int("window", 0, "the client's HTTP/2 receive windows in bytes (0: grpc-go's default, sized by its BDP estimate)")
	flag.Parse()
	if err := run(*endpoint, *load, *prefix, *page, *rounds, int32(*window)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(endpoint string, load int, prefix string, page int64, rounds int, window int32) error {
	if rounds < 1 || page < 1 {
		return fmt.Errorf("--rounds and --page must be at least 1")
	}
	config := clientv3.Config{Endpoints: []string{endpoint}, Logger: zap.NewNop(), MaxCallRecvMsgSize: 64 << 20}
	if window > 0 {
		config.DialOptions = []grpc.DialOption{grpc.WithInitialWindowSize(window), grpc.WithInitialConnWindowSize(window)}
	}
	c, err := clientv3.New(config)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	ctx := context.Background()
	if err := loadObjects(ctx, c, load); err != nil {
		return err
	}
	var lists, pages, decodes []float64
	for r := 0; r < rounds; r++ {
		key, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
		var rev int64
		var decoding time.Duration
		listStart := time.Now()
		for {
			opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(page)}
			if rev != 0 {
				opts = append(opts, clientv3.WithRev(rev))
			}
			start := time.Now()
			resp, err := c.Get(ctx, key, opts...)
			if err != nil {
				return err
			}
			pages = append(pages, millis(time.Since(start)))
			decode, err := decodeTime((*etcdserverpb.RangeResponse)(resp))
			if err != nil {
				return err
			}
			decodes = append(decodes, millis(decode))
			decoding += decode
			rev = resp.Header.Revision
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
		// The decode timing above is not part of a list's time.
		lists = append(lists, millis(time.Since(listStart)-decoding))
	}
	fmt.Printf("list p50 %.1f ms (%d pages), page p50 %.2f / p99 %.2f ms, client decode p50 %.2f ms a page\n",
		quantile(lists, 0.5), len(pages)/rounds, quantile(pages, 0.5), quantile(pages, 0.99), quantile(decodes, 0.5))
	return nil
}

// decodeTime encodes a page again and times its decoding, as the client did on receipt.
func decodeTime(resp *etcdserverpb.RangeResponse) (time.Duration, error) {
	raw, err := resp.Marshal()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	var again etcdserverpb.RangeResponse
	err = again.Unmarshal(raw)
	return time.Since(start), err
}

func loadObjects(ctx context.Context, c *clientv3.Client, count int) error {
	const loaders = 16
	var wg sync.WaitGroup
	errs := make(chan error, loaders)
	for w := 0; w < loaders; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for i := w; i < count; i += loaders {
				value := make([]byte, 2048+rng.Intn(6144))
				rng.Read(value)
				key := fmt.Sprintf("/registry/type%02d/ns-%02d/obj-%06d", i%10, (i/10)%50, i)
				if _, err := c.Put(ctx, key, string(value)); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sorted := append([]float64(nil), xs...)
	sort.Float64s(sorted)
	return sorted[int(q*float64(len(sorted)-1))]
}
