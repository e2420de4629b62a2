// Package testserver stands in for k8s.io/apiserver's embedded-etcd test server, so that
// Kubernetes' own storage tests (pkg/storage/etcd3, built on pkg/storage/testing) run against
// real server processes: Concord, or a reference etcd binary for comparison.
//
// run.sh compiles it in place of apiserver's pkg/storage/etcd3/testserver/test_server.go (in a
// copy of the apiserver module), so the Kubernetes tests themselves are unchanged. It keeps that
// file's API (NewTestConfig, RunEtcd) and, like it, gives every test a fresh server (here: fresh
// processes with their own data directories and ports), stopped when the test ends. Our own
// tests (largeobjects, controlplane) use it under its own import path, with StartCluster for a
// handle on the processes.
//
// The environment chooses the server:
//   - STORAGE_SUITE_SERVER: the server binary (Concord or etcd; both take etcd's flags).
//   - STORAGE_SUITE_MEMBERS: how many members to start (default 1).
//   - STORAGE_SUITE_WIRECHECK: when set, clients reach each member through a wirecheck proxy,
//     and a test fails if the server broke HTTP/2 flow control or gRPC framing on its
//     connections (a window overrun, a stream ended mid-message).
//   - STORAGE_SUITE_TLS: when set, members serve clients and peers over TLS and require client
//     certificates, as kubeadm sets etcd up (tls.go); clients present kube-apiserver's, and a
//     wirecheck proxy ends TLS on both of its sides to read the frames between them.
package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"concord.local/k8s-storage/wirecheck"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
)

// NewTestConfig returns the settings a test may adjust before RunEtcd. Of them, the server
// processes honour the watch progress-notify interval, the backend quota and the request size
// limit.
func NewTestConfig(t testing.TB) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	return cfg
}

// portLock keeps two tests from picking the same free ports before either server binds them.
var portLock sync.Mutex

// Cluster is a running cluster of server processes, stopped when its test ends.
type Cluster struct {
	// Endpoints are the members' client URLs, member i's at index i.
	Endpoints []string
	members   []*member
	// dial maps a member's URL to the one its clients dial (a wirecheck proxy's, if any).
	dial    map[string]string
	proxies []*wirecheck.Proxy
	// certs are the cluster's certificates when it serves TLS (nil otherwise).
	certs *Certs
}

// RunEtcd starts the server chosen by the environment (with cfg's settings, or the defaults
// when cfg is nil), waits until every member serves linearizable reads, and returns a client
// of all its members wrapped in the storage tests' call recorders. The processes are stopped
// when the test ends; their logs are shown if it failed.
func RunEtcd(t testing.TB, cfg *embed.Config) *kubernetes.Client {
	t.Helper()
	cluster := StartCluster(t, cfg)
	client := cluster.Client(t)
	recorder := storagetesting.NewKubernetesRecorder(client.Kubernetes)
	client.KV = storagetesting.NewKVRecorder(client.KV, recorder)
	client.Kubernetes = recorder
	return client
}

// StartCluster starts the server chosen by the environment, as RunEtcd does, and waits until
// every member serves linearizable reads. Ports are picked free but not held (the server binds
// them), so another process on the machine may take one first: a member that then fails to
// start is seen, and the cluster is started again on other ports (up to three times).
func StartCluster(t testing.TB, cfg *embed.Config) *Cluster {
	t.Helper()
	if cfg == nil {
		cfg = NewTestConfig(t)
	}
	binary := os.Getenv("STORAGE_SUITE_SERVER")
	if binary == "" {
		t.Fatal("STORAGE_SUITE_SERVER (the server binary to test) is not set")
	}
	members := Members(t)
	for attempt := 1; ; attempt++ {
		dir := cfg.Dir
		if attempt > 1 {
			dir = filepath.Join(cfg.Dir, fmt.Sprintf("attempt-%d", attempt))
		}
		cluster, err := tryStart(t, cfg, binary, members, dir)
		if err == nil {
			return cluster
		}
		if attempt == 3 || !errors.Is(err, errMemberExited) {
			t.Fatal(err)
		}
		t.Logf("starting again on other ports: %v", err)
	}
}

// errMemberExited is returned by tryStart when a member process ended during start-up.
var errMemberExited = errors.New("a member exited during start-up")

// tryStart starts the members on fresh ports with their data under dir and waits until they
// serve; on failure it stops every member it started.
func tryStart(t testing.TB, cfg *embed.Config, binary string, members int, dir string) (*Cluster, error) {
	t.Helper()
	portLock.Lock()
	defer portLock.Unlock()
	ports := freePorts(t, 2*members)
	var peers, peerURLs []string
	cluster := &Cluster{}
	if TLSWanted() {
		cluster.certs = mustCerts(t)
	}
	s := scheme(cluster.certs != nil)
	for i := 0; i < members; i++ {
		cluster.Endpoints = append(cluster.Endpoints, fmt.Sprintf("%s://127.0.0.1:%d", s, ports[2*i]))
		peerURLs = append(peerURLs, fmt.Sprintf("%s://127.0.0.1:%d", s, ports[2*i+1]))
		peers = append(peers, fmt.Sprintf("m%d=%s", i, peerURLs[i]))
	}
	for i := 0; i < members; i++ {
		m := startMember(t, binary, cfg, dir, i, cluster.Endpoints[i], strings.Join(peers, ","), cluster.certs)
		cluster.members = append(cluster.members, m)
	}
	ready := cluster.Client(t)
	err := cluster.waitServing(ready.Client, peerURLs)
	_ = ready.Close() // its connections are of no more use; the test makes its own clients
	if err != nil {
		for _, m := range cluster.members {
			m.stop()
		}
		return nil, err
	}
	if os.Getenv("STORAGE_SUITE_WIRECHECK") != "" {
		cluster.CheckWire(t)
	}
	return cluster, nil
}

// Members is the member count the environment asks for (STORAGE_SUITE_MEMBERS, default 1).
func Members(t testing.TB) int {
	n := os.Getenv("STORAGE_SUITE_MEMBERS")
	if n == "" {
		return 1
	}
	members, err := strconv.Atoi(n)
	if err != nil || members < 1 {
		t.Fatalf("STORAGE_SUITE_MEMBERS=%q is not a member count", n)
	}
	return members
}

// Client returns a new client of every member (closed when the test ends), as kube-apiserver
// makes one.
func (c *Cluster) Client(t testing.TB) *kubernetes.Client {
	t.Helper()
	return c.clientOf(t, c.Endpoints)
}

// MemberClient returns a new client of member i alone (closed when the test ends).
func (c *Cluster) MemberClient(t testing.TB, i int) *kubernetes.Client {
	t.Helper()
	return c.clientOf(t, c.Endpoints[i:i+1])
}

// CheckWire puts a wirecheck proxy in front of each member (once) for the clients made from
// now on, and fails the test at its end if a member broke HTTP/2 flow control or gRPC framing.
// It returns the URLs those clients dial, member i's at index i.
func (c *Cluster) CheckWire(t testing.TB) []string {
	if c.dial == nil {
		c.dial = map[string]string{}
		for _, e := range c.Endpoints {
			target := e[strings.Index(e, "://")+3:]
			var p *wirecheck.Proxy
			var err error
			if c.certs != nil {
				p, err = wirecheck.ListenTLS(target, c.certs.ProxyFront(), c.certs.ProxyBack())
			} else {
				p, err = wirecheck.Listen(target)
			}
			if err != nil {
				t.Fatal(err)
			}
			c.dial[e] = scheme(c.certs != nil) + "://" + p.Addr()
			c.proxies = append(c.proxies, p)
			t.Cleanup(func() {
				got := p.Totals()
				t.Logf("wirecheck %s: %d connections, %d DATA frames checked", e, got.Conns, got.DataFrames)
				for i, v := range p.Violations() {
					if i < 3 {
						t.Errorf("the server broke HTTP/2 flow control or gRPC framing: %s", v)
					}
				}
				_ = p.Close()
			})
		}
	}
	var urls []string
	for _, e := range c.Endpoints {
		urls = append(urls, c.dial[e])
	}
	return urls
}

// WireTotals counts what has passed through the proxies of CheckWire so far.
func (c *Cluster) WireTotals() wirecheck.Totals {
	var sum wirecheck.Totals
	for _, p := range c.proxies {
		sum.Add(p.Totals())
	}
	return sum
}

// ClientConfig is a client's configuration for endpoints (URLs from Endpoints or CheckWire):
// the URLs it dials, and the TLS it presents when the cluster serves TLS.
func (c *Cluster) ClientConfig(endpoints []string) clientv3.Config {
	var dialed []string
	for _, e := range endpoints {
		if d, ok := c.dial[e]; ok {
			e = d
		}
		dialed = append(dialed, e)
	}
	cfg := clientv3.Config{Endpoints: dialed, DialTimeout: 10 * time.Second}
	if c.certs != nil {
		cfg.TLS = c.certs.ClientTLS()
	}
	return cfg
}

func (c *Cluster) clientOf(t testing.TB, endpoints []string) *kubernetes.Client {
	t.Helper()
	cfg := c.ClientConfig(endpoints)
	cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zapcore.ErrorLevel)).Named("etcd-client")
	client, err := kubernetes.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// Stop ends member i as a service manager or a kubelet does (SIGTERM, SIGKILL after 10 s) and
// waits for it to exit.
func (c *Cluster) Stop(i int) { c.members[i].stop() }

// Kill ends member i with SIGKILL and waits for it to exit.
func (c *Cluster) Kill(i int) {
	m := c.members[i]
	_ = m.cmd.Process.Kill()
	<-m.exited
}

// member is one server process of a cluster.
type member struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	// exited is closed when the process has ended.
	exited chan struct{}
}

// startMember starts member i of the cluster `peers` with its data directory and log file
// under dir, serving TLS with certs when they are given.
func startMember(t testing.TB, binary string, cfg *embed.Config, dir string, i int, clientURL, peers string, certs *Certs) *member {
	t.Helper()
	name := fmt.Sprintf("m%d", i)
	peerURL := strings.TrimPrefix(strings.Split(peers, ",")[i], name+"=")
	args := []string{
		"--name", name,
		"--data-dir", filepath.Join(dir, name),
		"--listen-client-urls", clientURL,
		"--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", peers,
		"--initial-cluster-state", "new",
		"--initial-cluster-token", "storage-suite",
		"--log-level", "warn",
	}
	if d := cfg.WatchProgressNotifyInterval; d > 0 {
		args = append(args, "--experimental-watch-progress-notify-interval", d.String())
	}
	if q := cfg.QuotaBackendBytes; q > 0 {
		args = append(args, "--quota-backend-bytes", strconv.FormatInt(q, 10))
	}
	if m := cfg.MaxRequestBytes; m > 0 && m != embed.DefaultMaxRequestBytes {
		args = append(args, "--max-request-bytes", strconv.FormatUint(uint64(m), 10))
	}
	if certs != nil {
		args = append(args, certs.memberFlags()...)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", binary, err)
	}
	m := &member{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(m.exited)
	}()
	t.Cleanup(func() {
		m.stop()
		_ = logFile.Close()
		if t.Failed() {
			showLogTail(t, name, logPath)
		}
	})
	return m
}

// stop ends the member with SIGTERM, and with SIGKILL if it is still running after 10 s.
func (m *member) stop() {
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
}

// waitServing waits (up to 60 s) until each member answers a linearizable read, so that a
// leader exists and every member has joined it. It fails at once when a member process ends
// (errMemberExited; its port may have been taken), and checks that the members answering are
// ours: the cluster's peer URLs must be peerURLs.
func (c *Cluster) waitServing(client *clientv3.Client, peerURLs []string) error {
	deadline := time.Now().Add(60 * time.Second)
	want := append([]string(nil), peerURLs...)
	sort.Strings(want)
	for i, ep := range c.Endpoints {
		for {
			for _, m := range c.members {
				select {
				case <-m.exited:
					return fmt.Errorf("%w: %s (%s)", errMemberExited, m.name,
						strings.Join(logTail(m.logPath, 1), ""))
				default:
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := client.Status(ctx, ep)
			if err == nil {
				_, err = client.Get(ctx, "storage-suite-ready")
			}
			var list *clientv3.MemberListResponse
			if err == nil {
				list, err = client.MemberList(ctx)
			}
			cancel()
			if err == nil {
				var got []string
				for _, m := range list.Members {
					got = append(got, m.PeerURLs...)
				}
				sort.Strings(got)
				if strings.Join(got, ",") != strings.Join(want, ",") {
					return fmt.Errorf("member %d's port answers for another cluster (peers %v, ours %v)", i, got, want)
				}
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s did not serve within 60 s: %v", ep, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// freePorts returns n TCP ports that were free a moment ago.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("no free port: %v", err)
		}
		defer func() { _ = l.Close() }()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// logTail is the last n lines of a member's log (none if it cannot be read or is empty).
func logTail(path string, n int) []string {
	data, err := os.ReadFile(path)
	text := strings.TrimSpace(string(data))
	if err != nil || text == "" {
		return nil
	}
	lines := strings.Split(text, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

// showLogTail logs the last 40 lines of a member's log.
func showLogTail(t testing.TB, name, path string) {
	if lines := logTail(path, 40); lines != nil {
		t.Logf("last lines of %s's log:\n%s", name, strings.Join(lines, "\n"))
	}
}
