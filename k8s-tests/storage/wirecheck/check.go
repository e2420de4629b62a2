// Package wirecheck follows the HTTP/2 frames between a gRPC client and a server and reports
// what a server must never do, whichever client it serves: send more DATA than the client's
// flow-control windows allow (the stream's and the connection's), or end a response stream —
// DATA with END_STREAM, trailers, RST_STREAM — in the middle of a gRPC message. grpc-go reports
// the first and the second as `Internal: unexpected EOF` (it closes the stream with io.EOF while
// a message is half read), which is how kube-apiserver once saw a get of a 100 KiB value fail.
// Those are all of grpc-go's ways to that error on a response: its client closes a stream with
// io.EOF on DATA with END_STREAM, on trailers, on an RST_STREAM (before 1.72.1 and 1.73, which
// report the reset's code instead), and when its own count of a stream's DATA passes the window
// (it then resets the stream with FLOW_CONTROL_ERROR). The last is also reported here when the
// server kept within the windows the client granted: it would mean the client's count and its
// grants disagree.
//
// The windows are tracked as the client grants them: a WINDOW_UPDATE or SETTINGS from the
// client counts when it passes here, before the server can have read it, so the window followed
// here is never smaller than the server's own view of it. DATA beyond it is therefore beyond
// what the server was granted: no false alarms from frames crossing on the wire. (A client that
// lowers SETTINGS_INITIAL_WINDOW_SIZE would break that; grpc-go only raises it.)
package wirecheck

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// HTTP/2 frame types and flags used here (RFC 9113, section 6).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8

	// errFlowControl is HTTP/2's FLOW_CONTROL_ERROR code.
	errFlowControl = 0x3

	flagEndStream = 0x1
	flagAck       = 0x1
	flagPadded    = 0x8

	settingInitialWindowSize = 0x4
	defaultWindow            = 65535
	// history is how many frames a connection remembers for a report.
	history = 48
)

// Frame is one HTTP/2 frame: its header's fields and its payload.
type Frame struct {
	Type, Flags uint8
	Stream      uint32
	Payload     []byte
}

// stream is what the server may still send on one stream, and where its gRPC messages stand.
type stream struct {
	window int64
	// ended: the server ended the stream (END_STREAM or RST_STREAM); reset: the client reset it.
	ended, reset bool
	messages     messageScan
}

// messageScan follows gRPC's length-prefixed messages (1 flag byte, 4 length bytes, body).
type messageScan struct {
	header    [5]byte
	have      int
	remaining uint32
}

// feed passes response bytes through the scan.
func (m *messageScan) feed(b []byte) {
	for len(b) > 0 {
		if m.remaining > 0 {
			n := uint32(len(b))
			if n > m.remaining {
				n = m.remaining
			}
			m.remaining -= n
			b = b[n:]
			continue
		}
		n := copy(m.header[m.have:], b)
		m.have += n
		b = b[n:]
		if m.have == 5 {
			m.have = 0
			m.remaining = binary.BigEndian.Uint32(m.header[1:])
		}
	}
}

// midMessage says whether a message has begun and not ended.
func (m *messageScan) midMessage() bool { return m.have > 0 || m.remaining > 0 }

// Conn checks one connection's frames. Feed it the client's frames with FromClient as they
// pass to the server, and the server's with FromServer as they pass to the client; it is not
// safe for concurrent use.
type Conn struct {
	initialWindow int64
	connWindow    int64
	streams       map[uint32]*stream
	recent        []string
	// Violations are what the server did wrong, each with the frames that led to it.
	Violations []string
	// Counts of what passed, for a report.
	DataFrames, DataBytes, ServerResets, ClientResets, GoAways int64
}

// NewConn starts the check of a new connection.
func NewConn() *Conn {
	return &Conn{initialWindow: defaultWindow, connWindow: defaultWindow, streams: map[uint32]*stream{}}
}

func (c *Conn) remember(dir string, f Frame, note string) {
	line := fmt.Sprintf("%s type=%d flags=%#x stream=%d len=%d %s", dir, f.Type, f.Flags, f.Stream, len(f.Payload), note)
	c.recent = append(c.recent, line)
	if len(c.recent) > history {
		c.recent = c.recent[len(c.recent)-history:]
	}
}

func (c *Conn) violation(format string, args ...any) {
	c.Violations = append(c.Violations, fmt.Sprintf(format, args...)+"\n  recent frames:\n    "+strings.Join(c.recent, "\n    "))
}

// FromClient accounts for a frame the client sent: windows it grants, streams it opens or resets.
func (c *Conn) FromClient(f Frame) {
	note := ""
	switch f.Type {
	case frameHeaders:
		if _, ok := c.streams[f.Stream]; !ok {
			c.streams[f.Stream] = &stream{window: c.initialWindow}
		}
	case frameWindowUpdate:
		if len(f.Payload) >= 4 {
			inc := int64(binary.BigEndian.Uint32(f.Payload) & 0x7fffffff)
			if f.Stream == 0 {
				c.connWindow += inc
			} else if s, ok := c.streams[f.Stream]; ok {
				s.window += inc
			}
			note = fmt.Sprintf("+%d", inc)
		}
	case frameSettings:
		if f.Flags&flagAck != 0 {
			break
		}
		for p := f.Payload; len(p) >= 6; p = p[6:] {
			if binary.BigEndian.Uint16(p) != settingInitialWindowSize {
				continue
			}
			v := int64(binary.BigEndian.Uint32(p[2:]))
			for _, s := range c.streams {
				s.window += v - c.initialWindow
			}
			c.initialWindow = v
			note = fmt.Sprintf("initial window %d", v)
		}
	case frameRSTStream:
		c.ClientResets++
		if s, ok := c.streams[f.Stream]; ok {
			s.reset = true
		}
		if len(f.Payload) >= 4 && binary.BigEndian.Uint32(f.Payload) == errFlowControl {
			c.remember("client", f, "FLOW_CONTROL_ERROR")
			c.violation("the client reset stream %d with FLOW_CONTROL_ERROR: it counted more DATA than its window (grpc-go then fails the call with `unexpected EOF`)", f.Stream)
			return
		}
	}
	c.remember("client", f, note)
}

// FromServer checks a frame the server sent.
func (c *Conn) FromServer(f Frame) {
	s := c.streams[f.Stream]
	switch f.Type {
	case frameData:
		c.DataFrames++
		c.DataBytes += int64(len(f.Payload))
		c.connWindow -= int64(len(f.Payload))
		c.remember("server", f, fmt.Sprintf("conn window left %d", c.connWindow))
		if c.connWindow < 0 {
			c.violation("DATA on stream %d overruns the connection window by %d bytes", f.Stream, -c.connWindow)
		}
		if s == nil || s.reset {
			return
		}
		if s.ended {
			c.violation("DATA on stream %d after the server ended it", f.Stream)
			return
		}
		s.window -= int64(len(f.Payload))
		if s.window < 0 {
			c.violation("DATA on stream %d overruns the stream window by %d bytes", f.Stream, -s.window)
		}
		s.messages.feed(dataOf(f))
		if f.Flags&flagEndStream != 0 {
			c.end(s, f, "DATA with END_STREAM")
		}
	case frameHeaders:
		c.remember("server", f, "")
		if s != nil && !s.reset && f.Flags&flagEndStream != 0 {
			c.end(s, f, "trailers")
		}
	case frameRSTStream:
		c.ServerResets++
		c.remember("server", f, "")
		// After its END_STREAM a server may still reset the stream to close the client's half
		// (grpc-go's server does, with NO_ERROR, when the client has not half-closed).
		if s != nil && !s.reset && !s.ended {
			c.end(s, f, "RST_STREAM")
		}
	case frameGoAway:
		c.GoAways++
		c.remember("server", f, "")
	default:
		c.remember("server", f, "")
	}
}

// end closes a stream the server ended, which must be between messages.
func (c *Conn) end(s *stream, f Frame, how string) {
	if s.ended {
		c.violation("%s on stream %d after the server ended it", how, f.Stream)
		return
	}
	s.ended = true
	if s.messages.midMessage() {
		c.violation("%s ends stream %d in the middle of a gRPC message (%d bytes of it missing)",
			how, f.Stream, s.messages.remaining)
	}
}

// dataOf is a DATA frame's data, without its padding.
func dataOf(f Frame) []byte {
	p := f.Payload
	if f.Flags&flagPadded == 0 || len(p) == 0 {
		return p
	}
	pad := int(p[0])
	if 1+pad > len(p) {
		return nil
	}
	return p[1 : len(p)-pad]
}
