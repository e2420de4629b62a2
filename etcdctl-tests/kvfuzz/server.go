package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// member is one single-member server process on a fresh data directory, and a client of it.
type member struct {
	name   string
	cmd    *exec.Cmd
	dir    string
	client *clientv3.Client
	// exited is closed when the process has ended.
	exited chan struct{}
}

// startCluster runs binary as a cluster of n members with etcd's flags and defaults, each on a
// fresh data directory, and waits until every member answers a linearizable read.
func startCluster(name, binary, work string, n int) ([]*member, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var initial []string
	for i := 0; i < n; i++ {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[2*i+1]))
	}
	var members []*member
	stopAll := func() {
		for _, m := range members {
			m.stop()
		}
	}
	for i := 0; i < n; i++ {
		m, err := launch(fmt.Sprintf("%s-m%d", name, i), binary, work, fmt.Sprintf("m%d", i),
			ports[2*i], ports[2*i+1], strings.Join(initial, ","))
		if err != nil {
			stopAll()
			return nil, err
		}
		members = append(members, m)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, m := range members {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := m.client.Get(ctx, "health")
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				stopAll()
				return nil, fmt.Errorf("%s not serving after 30 s: %w", m.name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return members, nil
}

// launch starts one member's process and its client.
func launch(name, binary, work, memberName string, clientPort, peerPort int, initial string) (*member, error) {
	dir, err := os.MkdirTemp(work, "kvfuzz-"+name+"-")
	if err != nil {
		return nil, err
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	log, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	// The child has its own copy of the descriptor.
	defer func() { _ = log.Close() }()
	cmd := exec.Command(binary, "--name", memberName, "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", initial)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	m := &member{name: name, cmd: cmd, dir: dir, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(m.exited) }()
	m.client, err = clientv3.New(clientv3.Config{
		Endpoints:   []string{clientURL},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		m.stop()
		return nil, err
	}
	return m, nil
}

// stop ends the server and removes its data.
func (m *member) stop() {
	if m.client != nil {
		_ = m.client.Close()
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(15 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	_ = os.RemoveAll(m.dir)
}

// alive tells whether the process still runs (after a moment for one that is ending).
func (m *member) alive() bool {
	select {
	case <-m.exited:
		return false
	case <-time.After(50 * time.Millisecond):
		return true
	}
}

// logTail is the end of the server's log.
func (m *member) logTail() string {
	log, err := os.ReadFile(filepath.Join(m.dir, "server.log"))
	if err != nil {
		return err.Error()
	}
	return string(log[max(0, len(log)-3000):])
}

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
