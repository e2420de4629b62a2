package wirecheck

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// preface is what an HTTP/2 client sends before its first frame.
const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// Proxy forwards TCP connections to a server and checks the HTTP/2 frames of each: plaintext
// HTTP/2 with prior knowledge, as gRPC over http:// speaks it, or (ListenTLS) HTTP/2 over TLS,
// which the proxy ends on both sides to read the frames.
type Proxy struct {
	listener net.Listener
	target   string
	// back is the TLS the proxy speaks to the server (nil: plain TCP).
	back *tls.Config

	mu    sync.Mutex
	conns []*checked
	wg    sync.WaitGroup
}

// checked is the check of one connection, shared by its two directions and the reports.
type checked struct {
	mu    sync.Mutex
	check *Conn
	peer  string
}

// Totals count what passed through a proxy's connections.
type Totals struct {
	Conns, DataFrames, DataBytes, ServerResets, ClientResets, GoAways int64
}

// Add counts o into t (the totals of several proxies).
func (t *Totals) Add(o Totals) {
	t.Conns += o.Conns
	t.DataFrames += o.DataFrames
	t.DataBytes += o.DataBytes
	t.ServerResets += o.ServerResets
	t.ClientResets += o.ClientResets
	t.GoAways += o.GoAways
}

// Listen starts a proxy on a free local port in front of target (host:port).
func Listen(target string) (*Proxy, error) { return listen(target, nil, nil) }

// ListenTLS starts a proxy that accepts TLS with front and reaches target over TLS with back
// (both should offer ALPN "h2"): the frames it checks are the server's as its TLS session
// carried them, so a server's TLS write path is checked as well as its HTTP/2.
func ListenTLS(target string, front, back *tls.Config) (*Proxy, error) {
	return listen(target, front, back)
}

// listen starts a proxy on a free local port, speaking TLS on its two sides when front and
// back are given.
func listen(target string, front, back *tls.Config) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	if front != nil {
		l = tls.NewListener(l, front)
	}
	p := &Proxy{listener: l, target: target, back: back}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.listener.Addr().String() }

// Close stops accepting; connections already open run until either side closes them.
func (p *Proxy) Close() error {
	err := p.listener.Close()
	p.wg.Wait()
	return err
}

// Violations are what the server did wrong so far, on every connection.
func (p *Proxy) Violations() []string {
	var found []string
	for _, c := range p.snapshot() {
		c.mu.Lock()
		for _, v := range c.check.Violations {
			found = append(found, fmt.Sprintf("connection from %s: %s", c.peer, v))
		}
		c.mu.Unlock()
	}
	return found
}

// Totals count what has passed so far, on every connection.
func (p *Proxy) Totals() Totals {
	conns := p.snapshot()
	t := Totals{Conns: int64(len(conns))}
	for _, c := range conns {
		c.mu.Lock()
		t.DataFrames += c.check.DataFrames
		t.DataBytes += c.check.DataBytes
		t.ServerResets += c.check.ServerResets
		t.ClientResets += c.check.ClientResets
		t.GoAways += c.check.GoAways
		c.mu.Unlock()
	}
	return t
}

func (p *Proxy) snapshot() []*checked {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*checked(nil), p.conns...)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return
		}
		go p.serve(client)
	}
}

// serve forwards one connection both ways, checking its frames, until either side closes.
func (p *Proxy) serve(client net.Conn) {
	defer client.Close()
	var server net.Conn
	var err error
	if p.back != nil {
		server, err = tls.Dial("tcp", p.target, p.back)
	} else {
		server, err = net.Dial("tcp", p.target)
	}
	if err != nil {
		return
	}
	defer server.Close()
	c := &checked{check: NewConn(), peer: client.RemoteAddr().String()}
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() {
		_ = relay(client, server, true, func(f Frame) { c.mu.Lock(); c.check.FromClient(f); c.mu.Unlock() })
		server.Close()
		client.Close()
		done <- struct{}{}
	}()
	go func() {
		_ = relay(server, client, false, func(f Frame) { c.mu.Lock(); c.check.FromServer(f); c.mu.Unlock() })
		server.Close()
		client.Close()
		done <- struct{}{}
	}()
	<-done
	<-done
}

// relay copies frames from src to dst (those read together written together), showing each
// to see first: a client's frame is accounted for before the server can receive it.
func relay(src, dst net.Conn, fromClient bool, see func(Frame)) error {
	r := bufio.NewReaderSize(src, 64<<10)
	w := bufio.NewWriterSize(dst, 64<<10)
	if fromClient {
		head := make([]byte, len(preface))
		if _, err := io.ReadFull(r, head); err != nil {
			return err
		}
		if string(head) != preface {
			return errors.New("not an HTTP/2 client")
		}
		if _, err := w.Write(head); err != nil {
			return err
		}
	}
	header := make([]byte, 9)
	for {
		if _, err := io.ReadFull(r, header); err != nil {
			return err
		}
		n := int(header[0])<<16 | int(header[1])<<8 | int(header[2])
		frame := make([]byte, 9+n)
		copy(frame, header)
		if _, err := io.ReadFull(r, frame[9:]); err != nil {
			return err
		}
		see(Frame{
			Type:    header[3],
			Flags:   header[4],
			Stream:  binary.BigEndian.Uint32(header[5:]) & 0x7fffffff,
			Payload: frame[9:],
		})
		if _, err := w.Write(frame); err != nil {
			return err
		}
		// Frames that arrived together leave together.
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return err
			}
		}
	}
}
