package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"concord.local/controlplane-bench/proc"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// server is one single-member server process with a fresh data directory.
type server struct {
	cmd      *exec.Cmd
	dir      string
	endpoint string
}

// startServer starts binary with etcd's flags and an 8 GiB quota, and waits until it serves.
func startServer(name, binary, work string) (*server, error) {
	dir, err := os.MkdirTemp(work, "controlplane-"+name+"-")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	log, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, "--name", "bench", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "bench="+peer, "--quota-backend-bytes", strconv.Itoa(8<<30),
		"--log-level", "warn")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, dir: dir, endpoint: client}
	c, err := s.client()
	if err != nil {
		s.stop()
		return nil, err
	}
	defer func() { _ = c.Close() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Get(ctx, "health")
		cancel()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("not serving after 30 s: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// client is a new client (one connection) of the server.
func (s *server) client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:          []string{s.endpoint},
		DialTimeout:        5 * time.Second,
		Logger:             zap.NewNop(),
		MaxCallRecvMsgSize: 64 << 20,
	})
}

// stop ends the server and removes its data.
func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	_ = os.RemoveAll(s.dir)
}

// rssMiB is the server's resident memory in MiB (0 if unknown).
func (s *server) rssMiB() float64 { return float64(proc.Read(s.cmd.Process.Pid).RSS) / (1 << 20) }

// cpuSeconds is the server's user and system CPU time so far.
func (s *server) cpuSeconds() float64 { return proc.Read(s.cmd.Process.Pid).CPU }

// ownCPUSeconds is this load generator's user and system CPU time so far: on a machine it
// shares with the server, what it spends decoding lists and watches is CPU the server lacks.
func ownCPUSeconds() float64 { return proc.Read(os.Getpid()).CPU }

// freePorts returns n TCP ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer func() { _ = l.Close() }()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
