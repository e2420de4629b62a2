package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/status"
)

// call sends req to m as it is (the raw gRPC API, no client-side checks) and returns the
// answer as text with what legitimately differs between servers taken out: the cluster and
// member IDs and the Raft term in headers, a lease's remaining seconds, the order of a lease
// list. rev is the answer's header revision (0 on an error).
func call(ctx context.Context, m *member, req request) (text string, rev int64) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn := m.client.ActiveConnection()
	kv, lease := pb.NewKVClient(conn), pb.NewLeaseClient(conn)
	var resp interface{ String() string }
	var err error
	switch {
	case req.Range != nil:
		var r *pb.RangeResponse
		if r, err = kv.Range(ctx, req.Range); err == nil {
			rev = scrub(r.Header)
			tieOrder(req.Range, r)
			resp = r
		}
	case req.Put != nil:
		var r *pb.PutResponse
		if r, err = kv.Put(ctx, req.Put); err == nil {
			rev = scrub(r.Header)
			resp = r
		}
	case req.Delete != nil:
		var r *pb.DeleteRangeResponse
		if r, err = kv.DeleteRange(ctx, req.Delete); err == nil {
			rev = scrub(r.Header)
			resp = r
		}
	case req.Txn != nil:
		var r *pb.TxnResponse
		if r, err = kv.Txn(ctx, req.Txn); err == nil {
			rev = scrub(r.Header) // the answers inside keep their headers as etcd sends them
			txnTieOrder(req.Txn, r)
			resp = r
		}
	case req.Compact != nil:
		var r *pb.CompactionResponse
		if r, err = kv.Compact(ctx, req.Compact); err == nil {
			rev = scrub(r.Header)
			resp = r
		}
	case req.Grant != nil:
		var r *pb.LeaseGrantResponse
		if r, err = lease.LeaseGrant(ctx, req.Grant); err == nil {
			rev = scrub(r.Header)
			resp = r
		}
	case req.Revoke != nil:
		var r *pb.LeaseRevokeResponse
		if r, err = lease.LeaseRevoke(ctx, req.Revoke); err == nil {
			rev = scrub(r.Header)
			resp = r
		}
	case req.TimeToLive != nil:
		var r *pb.LeaseTimeToLiveResponse
		if r, err = lease.LeaseTimeToLive(ctx, req.TimeToLive); err == nil {
			rev = scrub(r.Header)
			// Seconds left differ by when each server was asked; one granted for an hour
			// a moment ago has nearly all of it, and an expired or unknown one -1.
			if r.GrantedTTL > 0 && r.TTL > r.GrantedTTL-60 && r.TTL <= r.GrantedTTL {
				r.TTL = r.GrantedTTL
			}
			sort.Slice(r.Keys, func(i, j int) bool { return string(r.Keys[i]) < string(r.Keys[j]) })
			resp = r
		}
	case req.Leases != nil:
		var r *pb.LeaseLeasesResponse
		if r, err = lease.LeaseLeases(ctx, req.Leases); err == nil {
			rev = scrub(r.Header)
			sort.Slice(r.Leases, func(i, j int) bool { return r.Leases[i].ID < r.Leases[j].ID })
			resp = r
		}
	}
	if err != nil {
		s, _ := status.FromError(err)
		return fmt.Sprintf("error %s: %s", s.Code(), s.Message()), 0
	}
	return resp.String(), rev
}

// scrub takes out of h what differs between two servers in the same state, and returns its
// revision.
func scrub(h *pb.ResponseHeader) int64 {
	if h == nil {
		return 0
	}
	h.ClusterId, h.MemberId, h.RaftTerm = 0, 0, 0
	return h.Revision
}

// sortsByValueOrRevision tells whether r sorts by something other than the key, where keys can
// tie (etcd sorts ascending when such a target comes without an order).
func sortsByValueOrRevision(r *pb.RangeRequest) bool {
	return r.SortTarget != pb.RangeRequest_KEY
}

// tieOrder puts keys that tie in a range sorted by version, revision or value in key order,
// leaving the order between different values as the server gave it. etcd sorts with Go's
// sort.Sort, which does not keep the order of equal elements, and whose algorithm changed
// between the Go versions etcd releases were built with (etcd 3.5.1, Go 1.16, moves the last of
// seven equal keys first); Concord keeps equal keys in key order. Within ties the order is
// unspecified, so it is compared in key order.
func tieOrder(req *pb.RangeRequest, r *pb.RangeResponse) {
	if !sortsByValueOrRevision(req) {
		return
	}
	field := func(kv *mvccpb.KeyValue) string {
		switch req.SortTarget {
		case pb.RangeRequest_VERSION:
			return fmt.Sprint(kv.Version)
		case pb.RangeRequest_CREATE:
			return fmt.Sprint(kv.CreateRevision)
		case pb.RangeRequest_MOD:
			return fmt.Sprint(kv.ModRevision)
		default:
			return string(kv.Value)
		}
	}
	for start := 0; start < len(r.Kvs); {
		end := start + 1
		for end < len(r.Kvs) && field(r.Kvs[end]) == field(r.Kvs[start]) {
			end++
		}
		run := r.Kvs[start:end]
		sort.Slice(run, func(i, j int) bool { return string(run[i].Key) < string(run[j].Key) })
		start = end
	}
}

// txnTieOrder applies tieOrder to the ranges of the branch a transaction took.
func txnTieOrder(req *pb.TxnRequest, r *pb.TxnResponse) {
	ops := req.Failure
	if r.Succeeded {
		ops = req.Success
	}
	for i, op := range ops {
		if i >= len(r.Responses) {
			return
		}
		switch v := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			if rr := r.Responses[i].GetResponseRange(); rr != nil {
				tieOrder(v.RequestRange, rr)
			}
		case *pb.RequestOp_RequestTxn:
			if rt := r.Responses[i].GetResponseTxn(); rt != nil {
				txnTieOrder(v.RequestTxn, rt)
			}
		}
	}
}

// describe is a request as text, for a report.
func describe(req request) string {
	switch {
	case req.Range != nil:
		return "Range " + req.Range.String()
	case req.Put != nil:
		return "Put " + req.Put.String()
	case req.Delete != nil:
		return "DeleteRange " + req.Delete.String()
	case req.Txn != nil:
		return "Txn " + req.Txn.String()
	case req.Compact != nil:
		return "Compact " + req.Compact.String()
	case req.Grant != nil:
		return "LeaseGrant " + req.Grant.String()
	case req.Revoke != nil:
		return "LeaseRevoke " + req.Revoke.String()
	case req.TimeToLive != nil:
		return "LeaseTimeToLive " + req.TimeToLive.String()
	default:
		return "LeaseLeases"
	}
}

// eventText is a watch event as text.
func eventText(e *mvccpb.Event) string {
	return fmt.Sprintf("%s %s prev %s", e.Type, e.Kv.String(), e.PrevKv.String())
}
