// Package controlplane holds our cases where Kubernetes' storage suite does not reach: several
// kube-apiservers sharing one cluster (GuaranteedUpdate on the same objects, the compactor
// race), a list+watch that lives through the kill of the leader, and the official Go client's
// concurrency recipes (Mutex, Election, STM). run.sh runs them against Concord and reference
// etcd alike, with the same expectations.
package controlplane

import (
	"sync"
	"testing"

	"concord.local/k8s-storage/testserver"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"k8s.io/apimachinery/pkg/api/apitesting"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	"k8s.io/utils/clock"
)

// codec encodes the example API's pods as kube-apiserver stores objects.
var codec runtime.Codec

func init() {
	scheme := runtime.NewScheme()
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
	codec = apitesting.TestCodec(serializer.NewCodecFactory(scheme), examplev1.SchemeGroupVersion)
}

// apiServer is the storage one kube-apiserver keeps for pods: its own client and etcd3 store.
type apiServer struct {
	client *kubernetes.Client
	store  storage.Interface
}

// newAPIServer connects a new kube-apiserver's pod storage to the cluster.
func newAPIServer(t *testing.T, cluster *testserver.Cluster) *apiServer {
	t.Helper()
	client := cluster.Client(t)
	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	store, err := etcd3.New(client, compactor, codec,
		func() runtime.Object { return &example.Pod{} },
		func() runtime.Object { return &example.PodList{} },
		"/registry", "/pods/", schema.GroupResource{Resource: "pods"},
		identity.NewEncryptCheckTransformer(), etcd3.NewDefaultLeaseManagerConfig(),
		etcd3.NewDefaultDecoder(codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	return &apiServer{client: client, store: store}
}

// concurrently runs work(0) … work(n-1) at once and fails the test with their errors.
func concurrently(t *testing.T, n int, work func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = work(i)
		}(i)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}
