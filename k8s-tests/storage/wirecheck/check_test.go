package wirecheck

import (
	"encoding/binary"
	"strings"
	"testing"
)

func windowUpdate(stream, inc uint32) Frame {
	p := make([]byte, 4)
	binary.BigEndian.PutUint32(p, inc)
	return Frame{Type: frameWindowUpdate, Stream: stream, Payload: p}
}

func initialWindow(v uint32) Frame {
	p := make([]byte, 6)
	binary.BigEndian.PutUint16(p, settingInitialWindowSize)
	binary.BigEndian.PutUint32(p[2:], v)
	return Frame{Type: frameSettings, Payload: p}
}

func data(stream uint32, n int, end bool) Frame {
	f := Frame{Type: frameData, Stream: stream, Payload: make([]byte, n)}
	if end {
		f.Flags = flagEndStream
	}
	return f
}

// message is a gRPC message of n body bytes, as DATA payload.
func message(n int) []byte {
	b := make([]byte, 5+n)
	binary.BigEndian.PutUint32(b[1:], uint32(n))
	return b
}

func open(c *Conn, stream uint32) { c.FromClient(Frame{Type: frameHeaders, Stream: stream}) }

func trailers(stream uint32) Frame {
	return Frame{Type: frameHeaders, Flags: flagEndStream, Stream: stream}
}

func expect(t *testing.T, c *Conn, want ...string) {
	t.Helper()
	if len(c.Violations) != len(want) {
		t.Fatalf("violations %q, want %d", c.Violations, len(want))
	}
	for i, w := range want {
		if !strings.Contains(c.Violations[i], w) {
			t.Errorf("violation %d is %q, want %q", i, c.Violations[i], w)
		}
	}
}

func TestDataWithinTheWindowsPasses(t *testing.T) {
	c := NewConn()
	open(c, 1)
	c.FromServer(data(1, defaultWindow, false))
	expect(t, c)
}

func TestDataBeyondTheWindowsIsReported(t *testing.T) {
	c := NewConn()
	open(c, 1)
	c.FromServer(data(1, defaultWindow, false))
	c.FromServer(data(1, 1, false))
	expect(t, c, "connection window by 1", "stream window by 1")
}

func TestUpdatesAndInitialWindowRaisesCount(t *testing.T) {
	c := NewConn()
	open(c, 1)
	c.FromClient(windowUpdate(0, 1<<20))
	c.FromClient(initialWindow(200_000))
	open(c, 3)
	c.FromServer(data(1, 200_000, false))
	c.FromServer(data(3, 200_000, false))
	expect(t, c)
	c.FromClient(windowUpdate(1, 10))
	c.FromServer(data(1, 11, false))
	expect(t, c, "stream window by 1")
}

func TestAStreamEndedMidMessageIsReported(t *testing.T) {
	for _, end := range []Frame{trailers(1), data(1, 0, true), {Type: frameRSTStream, Stream: 1}} {
		c := NewConn()
		open(c, 1)
		half := message(100)[:50]
		c.FromServer(Frame{Type: frameData, Stream: 1, Payload: half})
		c.FromServer(end)
		expect(t, c, "in the middle of a gRPC message (55 bytes of it missing)")
	}
}

func TestWholeMessagesThenTheEndPass(t *testing.T) {
	c := NewConn()
	open(c, 1)
	open(c, 3)
	m := append(message(3), message(7)...)
	c.FromServer(Frame{Type: frameData, Stream: 1, Payload: m[:4]})
	c.FromServer(Frame{Type: frameData, Stream: 1, Payload: m[4:]})
	c.FromServer(trailers(1))
	c.FromServer(Frame{Type: frameData, Stream: 3, Flags: flagEndStream, Payload: message(0)})
	expect(t, c)
	c.FromServer(data(1, 1, false))
	expect(t, c, "after the server ended it")
}

func TestAStreamTheClientResetIsNotChecked(t *testing.T) {
	c := NewConn()
	open(c, 1)
	c.FromServer(Frame{Type: frameData, Stream: 1, Payload: message(100)[:50]})
	c.FromClient(Frame{Type: frameRSTStream, Stream: 1})
	c.FromServer(trailers(1))
	expect(t, c)
}

func TestAResetAfterTheEndPasses(t *testing.T) {
	c := NewConn()
	open(c, 1)
	c.FromServer(Frame{Type: frameData, Stream: 1, Payload: message(10)})
	c.FromServer(trailers(1))
	c.FromServer(Frame{Type: frameRSTStream, Stream: 1})
	expect(t, c)
}

func reset(stream, code uint32) Frame {
	p := make([]byte, 4)
	binary.BigEndian.PutUint32(p, code)
	return Frame{Type: frameRSTStream, Stream: stream, Payload: p}
}

func TestAClientsFlowControlResetIsReported(t *testing.T) {
	c := NewConn()
	open(c, 1)
	open(c, 3)
	c.FromServer(Frame{Type: frameData, Stream: 1, Payload: message(100)[:50]})
	c.FromClient(reset(1, 0x8)) // CANCEL: the client gave up; nothing to report
	expect(t, c)
	c.FromServer(Frame{Type: frameData, Stream: 3, Payload: message(100)[:50]})
	c.FromClient(reset(3, errFlowControl))
	expect(t, c, "reset stream 3 with FLOW_CONTROL_ERROR")
	if c.ClientResets != 2 {
		t.Errorf("client resets counted %d, want 2", c.ClientResets)
	}
}
