package main

import (
	"math/rand/v2"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// keys are the keys requests draw from: few, so that requests meet each other's keys, with
// prefixes of one another, bytes at both ends of the order, and ranges between them.
var keys = []string{"a", "a/1", "a/2", "a/3", "ab", "b", "b/1", "c", "\x00x", "\xff", "z\xff"}

// leaseIDs are the leases requests grant, revoke and attach: granted with these IDs on both
// servers, so that both hand out the same ones.
var leaseIDs = []int64{0x1001, 0x1002, 0x1003}

// gen draws random requests of every KV and lease kind, with the fields etcd's API offers.
type gen struct {
	rng *rand.Rand
	// rev is the newest revision the reference server reported; compacted the latest revision
	// a compaction was asked for (both only steer the draws towards interesting revisions).
	rev, compacted int64
}

// request is one drawn request: exactly one field is set.
type request struct {
	Range      *pb.RangeRequest
	Put        *pb.PutRequest
	Delete     *pb.DeleteRangeRequest
	Txn        *pb.TxnRequest
	Compact    *pb.CompactionRequest
	Grant      *pb.LeaseGrantRequest
	Revoke     *pb.LeaseRevokeRequest
	TimeToLive *pb.LeaseTimeToLiveRequest
	Leases     *pb.LeaseLeasesRequest
}

func (g *gen) chance(percent int) bool { return g.rng.IntN(100) < percent }

func (g *gen) key() []byte {
	if g.chance(2) {
		return nil // etcd: "key is not provided"
	}
	return []byte(keys[g.rng.IntN(len(keys))])
}

// rangeEnd is no end (one key), a prefix's end, "\x00" (every key from key), or another key
// (which may sort before key: an empty range).
func (g *gen) rangeEnd(key []byte) []byte {
	switch g.rng.IntN(6) {
	case 0, 1:
		return nil
	case 2:
		return prefixEnd(key)
	case 3:
		return []byte{0}
	default:
		return []byte(keys[g.rng.IntN(len(keys))])
	}
}

// prefixEnd is the end of the range of keys that start with key.
func prefixEnd(key []byte) []byte {
	end := append([]byte(nil), key...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}

func (g *gen) value() []byte {
	v := make([]byte, g.rng.IntN(12))
	for i := range v {
		v[i] = byte('a' + g.rng.IntN(26))
	}
	return v
}

// revision is the newest (0), one of the history, one at or before the last compaction, or
// one in the future.
func (g *gen) revision() int64 {
	switch g.rng.IntN(8) {
	case 0, 1, 2, 3:
		return 0
	case 4, 5:
		return 1 + g.rng.Int64N(g.rev+1)
	case 6:
		return g.compacted - g.rng.Int64N(2)
	default:
		return g.rev + 1 + g.rng.Int64N(3)
	}
}

func (g *gen) lease() int64 {
	switch {
	case g.chance(75):
		return 0
	case g.chance(90):
		return leaseIDs[g.rng.IntN(len(leaseIDs))]
	default:
		return 0x7777 // never granted: "requested lease not found"
	}
}

func (g *gen) rangeReq() *pb.RangeRequest {
	k := g.key()
	r := &pb.RangeRequest{Key: k, RangeEnd: g.rangeEnd(k), Revision: g.revision()}
	if g.chance(30) {
		r.Limit = []int64{1, 2, 3, -1}[g.rng.IntN(4)]
	}
	if g.chance(30) {
		r.SortOrder = pb.RangeRequest_SortOrder(g.rng.IntN(3))
		r.SortTarget = pb.RangeRequest_SortTarget(g.rng.IntN(5))
	}
	r.Serializable = g.chance(20)
	r.KeysOnly = g.chance(15)
	r.CountOnly = g.chance(10)
	if g.chance(15) {
		r.MinModRevision = g.rng.Int64N(g.rev + 2)
	}
	if g.chance(15) {
		r.MaxModRevision = g.rng.Int64N(g.rev + 2)
	}
	if g.chance(15) {
		r.MinCreateRevision = g.rng.Int64N(g.rev + 2)
	}
	if g.chance(15) {
		r.MaxCreateRevision = g.rng.Int64N(g.rev + 2)
	}
	if sortsByValueOrRevision(r) {
		// Which of several equal keys a limit keeps is Go's sort's choice in etcd (see
		// tieOrder): no limit then; nor keys alone by value, whose ties cannot be seen.
		r.Limit = 0
		if r.SortTarget == pb.RangeRequest_VALUE {
			r.KeysOnly = false
		}
	}
	return r
}

func (g *gen) putReq() *pb.PutRequest {
	p := &pb.PutRequest{Key: g.key(), Value: g.value(), Lease: g.lease(), PrevKv: g.chance(40)}
	if g.chance(8) {
		p.IgnoreValue = true
		if g.chance(70) {
			p.Value = nil
		}
	}
	if g.chance(8) {
		p.IgnoreLease = true
		if g.chance(70) {
			p.Lease = 0
		}
	}
	return p
}

func (g *gen) deleteReq() *pb.DeleteRangeRequest {
	k := g.key()
	return &pb.DeleteRangeRequest{Key: k, RangeEnd: g.rangeEnd(k), PrevKv: g.chance(50)}
}

func (g *gen) compare() *pb.Compare {
	k := g.key()
	c := &pb.Compare{Key: k, Result: pb.Compare_CompareResult(g.rng.IntN(4))}
	if g.chance(20) {
		c.RangeEnd = g.rangeEnd(k)
	}
	switch g.rng.IntN(5) {
	case 0:
		c.Target = pb.Compare_VERSION
		c.TargetUnion = &pb.Compare_Version{Version: g.rng.Int64N(4)}
	case 1:
		c.Target = pb.Compare_CREATE
		c.TargetUnion = &pb.Compare_CreateRevision{CreateRevision: g.rng.Int64N(g.rev + 2)}
	case 2:
		c.Target = pb.Compare_MOD
		c.TargetUnion = &pb.Compare_ModRevision{ModRevision: g.rng.Int64N(g.rev + 2)}
	case 3:
		c.Target = pb.Compare_VALUE
		c.TargetUnion = &pb.Compare_Value{Value: g.value()}
	default:
		c.Target = pb.Compare_LEASE
		c.TargetUnion = &pb.Compare_Lease{Lease: g.lease()}
	}
	return c
}

// requestOp is a range, put, delete or (above depth 0) a nested transaction.
func (g *gen) requestOp(depth int) *pb.RequestOp {
	n := 3
	if depth > 0 {
		n = 4
	}
	switch g.rng.IntN(n) {
	case 0:
		r := g.rangeReq()
		if r.Revision > g.rev {
			r.Revision = 0 // a future revision fails the whole transaction: keep it rare
		}
		return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}}
	case 1:
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: g.putReq()}}
	case 2:
		return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: g.deleteReq()}}
	default:
		return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: g.txnReq(depth - 1)}}
	}
}

func (g *gen) txnReq(depth int) *pb.TxnRequest {
	t := &pb.TxnRequest{}
	if depth > 0 && g.chance(2) {
		// Past etcd's default --max-txn-ops (128): "too many operations in txn request".
		for i := 0; i < 129; i++ {
			t.Success = append(t.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{
				RequestRange: &pb.RangeRequest{Key: []byte(keys[i%len(keys)])}}})
		}
		return t
	}
	for i := g.rng.IntN(3); i > 0; i-- {
		t.Compare = append(t.Compare, g.compare())
	}
	for i := g.rng.IntN(4); i > 0; i-- {
		t.Success = append(t.Success, g.requestOp(depth))
	}
	for i := g.rng.IntN(3); i > 0; i-- {
		t.Failure = append(t.Failure, g.requestOp(depth))
	}
	return t
}

// next draws one request: mostly puts, ranges, deletes and transactions.
func (g *gen) next() request {
	switch n := g.rng.IntN(100); {
	case n < 30:
		return request{Put: g.putReq()}
	case n < 55:
		return request{Range: g.rangeReq()}
	case n < 65:
		return request{Delete: g.deleteReq()}
	case n < 85:
		return request{Txn: g.txnReq(1 + g.rng.IntN(2))}
	case n < 88:
		rev := g.revision()
		if rev > 0 && rev <= g.rev {
			g.compacted = max(g.compacted, rev)
		}
		return request{Compact: &pb.CompactionRequest{Revision: rev, Physical: g.chance(50)}}
	case n < 93:
		ttl := int64(3600)
		if g.chance(10) {
			ttl = 9_000_000_001 // over etcd's maximum
		}
		id := leaseIDs[g.rng.IntN(len(leaseIDs))]
		return request{Grant: &pb.LeaseGrantRequest{ID: id, TTL: ttl}}
	case n < 96:
		return request{Revoke: &pb.LeaseRevokeRequest{ID: g.lease()}}
	case n < 99:
		return request{TimeToLive: &pb.LeaseTimeToLiveRequest{ID: g.lease(), Keys: g.chance(50)}}
	default:
		return request{Leases: &pb.LeaseLeasesRequest{}}
	}
}
