package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// listServer answers ConfigMap lists with items, two per page, following continue tokens.
func listServer(t *testing.T, items []meta) *httptest.Server {
	return httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("labelSelector") != loadLabel {
			t.Errorf("a list without the load's label selector: %s", r.URL)
		}
		start := 0
		if c := r.URL.Query().Get("continue"); c != "" {
			start = int(c[0] - '0')
		}
		var page listPage
		page.Metadata.ResourceVersion = "10"
		for i := start; i < len(items) && i < start+2; i++ {
			page.Items = append(page.Items, struct {
				Metadata meta `json:"metadata"`
			}{items[i]})
		}
		if start+2 < len(items) {
			page.Metadata.Continue = string(rune('0' + start + 2))
		}
		_ = json.NewEncoder(w).Encode(page)
	}))
}

func TestVerifyCountsObjectsNotAtTheirLastAcknowledgedVersion(t *testing.T) {
	objs := []*object{{ns: "a", name: "x", rv: "5"}, {ns: "a", name: "y", rv: "7"}, {ns: "b", name: "z", rv: "9"}}
	cases := []struct {
		name   string
		listed []meta
		lost   int
	}{
		{"all at their last write", []meta{{Namespace: "a", Name: "x", ResourceVersion: "5"},
			{Namespace: "a", Name: "y", ResourceVersion: "7"}, {Namespace: "b", Name: "z", ResourceVersion: "9"}}, 0},
		{"one at an older version", []meta{{Namespace: "a", Name: "x", ResourceVersion: "4"},
			{Namespace: "a", Name: "y", ResourceVersion: "7"}, {Namespace: "b", Name: "z", ResourceVersion: "9"}}, 1},
		{"one missing", []meta{{Namespace: "a", Name: "x", ResourceVersion: "5"},
			{Namespace: "b", Name: "z", ResourceVersion: "9"}}, 1},
		{"one unknown in place of one", []meta{{Namespace: "a", Name: "x", ResourceVersion: "5"},
			{Namespace: "a", Name: "w", ResourceVersion: "7"}, {Namespace: "b", Name: "z", ResourceVersion: "9"}}, 2},
	}
	for _, c := range cases {
		srv := listServer(t, c.listed)
		lost, err := verify(context.Background(), newAPI(srv.URL, "t"), options{page: 2}, objs)
		srv.Close()
		if err != nil || lost != c.lost {
			t.Errorf("%s: lost %d (%v), want %d", c.name, lost, err, c.lost)
		}
	}
}

func TestWatchesAndObjectsSpreadOverNamespaces(t *testing.T) {
	o := options{objects: 10, watches: 7, namespaces: 3}
	objects, watches := 0, 0
	for k := 0; k < o.namespaces; k++ {
		objects += objectsIn(o, k)
		watches += watchesOn(o, k)
	}
	if objects != o.objects || watches != o.watches {
		t.Fatalf("%d objects and %d watches over the namespaces, want %d and %d", objects, watches, o.objects, o.watches)
	}
	// object i is in namespace i % namespaces, watch i follows namespace i % namespaces
	if objectsIn(o, 0) != 4 || objectsIn(o, 2) != 3 || watchesOn(o, 0) != 3 || watchesOn(o, 1) != 2 {
		t.Fatal("the counts per namespace do not follow i % namespaces")
	}
}

func TestListAllFollowsContinueTokensAndReturnsTheListsVersion(t *testing.T) {
	items := []meta{{Namespace: "a", Name: "x"}, {Namespace: "a", Name: "y"}, {Namespace: "b", Name: "z"}}
	srv := listServer(t, items)
	defer srv.Close()
	got, rv, err := newAPI(srv.URL, "t").listAll(context.Background(), "", 2)
	if err != nil || len(got) != len(items) || got[2].Name != "z" || rv != "10" {
		t.Fatalf("listAll: %d items (%v), resourceVersion %q, %v", len(got), got, rv, err)
	}
}
