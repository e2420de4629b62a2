package controlplane

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"concord.local/k8s-storage/testserver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
)

// TestListAndWatchThroughALeaderKill lists pods, watches from the list's resource version, and
// kills the leader with SIGKILL while another apiserver keeps creating pods. Whenever the watch
// ends, it is restarted from the last resource version seen, as a reflector does. Every pod
// created after the list must arrive exactly once, in resource-version order: no gap, no repeat.
func TestListAndWatchThroughALeaderKill(t *testing.T) {
	if testserver.Members(t) < 3 {
		t.Skip("needs three members (STORAGE_SUITE_MEMBERS=3)")
	}
	cluster := testserver.StartCluster(t, nil)
	watcher, writer := newAPIServer(t, cluster), newAPIServer(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for p := 0; p < 20; p++ {
		create(ctx, t, writer.store, p)
	}
	list := &example.PodList{}
	if err := watcher.store.GetList(ctx, "/pods/", storage.ListOptions{Predicate: storage.Everything, Recursive: true}, list); err != nil {
		t.Fatal(err)
	}

	seen := make(chan *example.Pod, 10000)
	watchDone := make(chan error, 1)
	go func() { watchDone <- watchFrom(ctx, t, watcher.store, list.ResourceVersion, seen) }()

	created := map[string]bool{}
	var mu sync.Mutex
	writes := make(chan struct{})
	go func() {
		defer close(writes)
		for p := 100; ctx.Err() == nil && p < 100+300; p++ {
			create(ctx, t, writer.store, p)
			mu.Lock()
			created[podName(p)] = true
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	time.Sleep(time.Second)
	leader := leaderIndex(ctx, t, cluster)
	t.Logf("killing member %d, the leader", leader)
	cluster.Kill(leader)
	<-writes

	// Everything created must arrive; then nothing more may.
	got := map[string]int64{}
	last := int64(0)
	deadline := time.After(time.Minute)
	for len(got) < len(created) {
		select {
		case pod := <-seen:
			rv, err := strconv.ParseInt(pod.ResourceVersion, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			if rv <= last {
				t.Fatalf("%s at resource version %d after %d: repeated or out of order", pod.Name, rv, last)
			}
			last = rv
			if _, dup := got[pod.Name]; dup {
				t.Fatalf("%s arrived twice", pod.Name)
			}
			got[pod.Name] = rv
		case err := <-watchDone:
			t.Fatalf("the watch gave up: %v", err)
		case <-deadline:
			t.Fatalf("%d of %d created pods arrived within a minute", len(got), len(created))
		}
	}
	for name := range created {
		if _, ok := got[name]; !ok {
			t.Errorf("%s was created but never arrived (a gap)", name)
		}
	}
	for name := range got {
		if !created[name] {
			t.Errorf("%s arrived but was not created after the list", name)
		}
	}
}

// create creates pod p, retrying while the cluster has no leader. A retry that finds the pod
// already there means an earlier attempt went through.
func create(ctx context.Context, t *testing.T, store storage.Interface, p int) {
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(p), Namespace: "ns"}}
	for {
		err := store.Create(ctx, podKey(p), pod, &example.Pod{}, 0)
		if err == nil || apierrors.IsAlreadyExists(err) || storage.IsExist(err) {
			return
		}
		if ctx.Err() != nil {
			t.Errorf("creating %s: %v", podKey(p), err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// watchFrom watches every pod from resource version rv and sends each added pod to seen. When
// the watch ends or reports an error, it starts again from the last resource version seen.
func watchFrom(ctx context.Context, t *testing.T, store storage.Interface, rv string, seen chan<- *example.Pod) error {
	for ctx.Err() == nil {
		w, err := store.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: rv, Predicate: storage.Everything, Recursive: true})
		if err != nil {
			t.Logf("watch from %s: %v (retrying)", rv, err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added:
				pod := ev.Object.(*example.Pod)
				rv = pod.ResourceVersion
				seen <- pod
			case watch.Error:
				status, _ := ev.Object.(*metav1.Status)
				if status != nil && status.Code == 410 {
					w.Stop()
					return fmt.Errorf("resource version %s is gone: %s", rv, status.Message)
				}
				t.Logf("watch error at %s: %v (restarting)", rv, ev.Object)
			default:
				w.Stop()
				return fmt.Errorf("unexpected %s event", ev.Type)
			}
		}
		w.Stop()
	}
	return ctx.Err()
}

// leaderIndex is the index of the member that leads.
func leaderIndex(ctx context.Context, t *testing.T, cluster *testserver.Cluster) int {
	client := cluster.Client(t)
	for i, ep := range cluster.Endpoints {
		status, err := client.Status(ctx, ep)
		if err != nil {
			t.Fatal(err)
		}
		if status.Header.MemberId == status.Leader {
			return i
		}
	}
	t.Fatal("no member leads")
	return -1
}
