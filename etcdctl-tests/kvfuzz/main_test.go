package main

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

func TestPrefixEnd(t *testing.T) {
	for key, want := range map[string]string{"a": "b", "a/": "a0", "a\xff": "b", "\xff": "\x00"} {
		if got := prefixEnd([]byte(key)); !bytes.Equal(got, []byte(want)) {
			t.Errorf("prefixEnd(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestSeedRange(t *testing.T) {
	if from, to, err := seedRange("3-7"); err != nil || from != 3 || to != 7 {
		t.Errorf("3-7: %d %d %v", from, to, err)
	}
	if from, to, err := seedRange("5"); err != nil || from != 5 || to != 5 {
		t.Errorf("5: %d %d %v", from, to, err)
	}
	for _, bad := range []string{"", "x", "7-3", "1-"} {
		if _, _, err := seedRange(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The same seed draws the same requests: a difference found once is found again.
func TestASeedDrawsTheSameRequests(t *testing.T) {
	draw := func() string {
		g := &gen{rng: rand.New(rand.NewPCG(9, 0x6b76667a7a)), rev: 20, compacted: 5}
		var out string
		for i := 0; i < 200; i++ {
			out += describe(g.next()) + "\n"
		}
		return out
	}
	if a, b := draw(), draw(); a != b || a == "" {
		t.Error("one seed drew two different sequences")
	}
}

// Ties are put in key order; the order between different values stays the server's, so a
// server that sorted wrongly is still seen.
func TestTieOrderReordersOnlyTies(t *testing.T) {
	kv := func(key string, version int64) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(key), Version: version}
	}
	req := &pb.RangeRequest{SortTarget: pb.RangeRequest_VERSION}
	r := &pb.RangeResponse{Kvs: []*mvccpb.KeyValue{kv("z", 1), kv("a", 1), kv("c", 3), kv("b", 2)}}
	tieOrder(req, r)
	var got []string
	for _, kv := range r.Kvs {
		got = append(got, string(kv.Key))
	}
	if want := "a z c b"; strings.Join(got, " ") != want {
		t.Errorf("got %v, want %s", got, want)
	}
}
