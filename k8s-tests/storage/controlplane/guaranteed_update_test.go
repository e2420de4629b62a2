package controlplane

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"concord.local/k8s-storage/testserver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
)

// TestGuaranteedUpdateFromFourAPIServers has four kube-apiservers, each with its own client,
// increment a counter on the same ten pods through GuaranteedUpdate (a read, then a
// compare-and-swap on the mod revision, retried on conflict) at the same time. No update may be
// lost: every counter ends at the number of increments made.
func TestGuaranteedUpdateFromFourAPIServers(t *testing.T) {
	const servers, pods, increments = 4, 10, 25
	cluster := testserver.StartCluster(t, nil)
	apis := make([]*apiServer, servers)
	for i := range apis {
		apis[i] = newAPIServer(t, cluster)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for p := 0; p < pods; p++ {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(p), Namespace: "ns",
			Annotations: map[string]string{"count": "0"}}}
		if err := apis[0].store.Create(ctx, podKey(p), pod, &example.Pod{}, 0); err != nil {
			t.Fatal(err)
		}
	}

	concurrently(t, servers, func(i int) error {
		for n := 0; n < increments; n++ {
			for p := 0; p < pods; p++ {
				if err := increment(ctx, apis[i].store, podKey(p)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	for p := 0; p < pods; p++ {
		got := &example.Pod{}
		if err := apis[1].store.Get(ctx, podKey(p), storage.GetOptions{}, got); err != nil {
			t.Fatal(err)
		}
		if want := strconv.Itoa(servers * increments); got.Annotations["count"] != want {
			t.Errorf("%s: count %s, want %s (an update was lost)", podKey(p), got.Annotations["count"], want)
		}
	}
}

// increment adds one to a pod's count annotation with GuaranteedUpdate.
func increment(ctx context.Context, store storage.Interface, key string) error {
	return store.GuaranteedUpdate(ctx, key, &example.Pod{}, false, nil,
		func(input runtime.Object, _ storage.ResponseMeta) (runtime.Object, *uint64, error) {
			pod := input.(*example.Pod).DeepCopy()
			n, err := strconv.Atoi(pod.Annotations["count"])
			if err != nil {
				return nil, nil, err
			}
			pod.Annotations["count"] = strconv.Itoa(n + 1)
			return pod, nil, nil
		}, nil)
}

func podName(i int) string { return fmt.Sprintf("pod-%03d", i) }

func podKey(i int) string { return "/pods/ns/" + podName(i) }
