package largeobjects

import (
	"strings"
	"testing"

	"concord.local/k8s-storage/testserver"
	"concord.local/k8s-storage/wirecheck"
)

// throughWireCheck puts a proxy that checks every HTTP/2 frame (wirecheck) in front of each
// member and returns the endpoints to dial instead of the members'. The function it returns,
// called once the traffic is over, fails the test on anything the server did wrong on the
// wire (a window overrun, a stream ended mid-message) or if no data passed, and returns the
// totals of the connections that have closed.
func throughWireCheck(t *testing.T, cluster *testserver.Cluster) ([]string, func() wirecheck.Totals) {
	t.Helper()
	var endpoints []string
	var proxies []*wirecheck.Proxy
	for _, e := range cluster.Endpoints {
		p, err := wirecheck.Listen(strings.TrimPrefix(e, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		proxies = append(proxies, p)
		endpoints = append(endpoints, "http://"+p.Addr())
	}
	return endpoints, func() wirecheck.Totals {
		t.Helper()
		var totals wirecheck.Totals
		for _, p := range proxies {
			for i, v := range p.Violations() {
				if i < 5 {
					t.Errorf("the server broke HTTP/2 flow control or gRPC framing: %s", v)
				}
			}
			got := p.Totals()
			totals.Conns += got.Conns
			totals.DataFrames += got.DataFrames
			totals.DataBytes += got.DataBytes
			totals.ServerResets += got.ServerResets
			totals.GoAways += got.GoAways
		}
		if totals.DataFrames == 0 {
			t.Error("no DATA frame passed through the wire check")
		}
		return totals
	}
}
