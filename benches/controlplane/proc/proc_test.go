package proc

import (
	"os"
	"testing"
)

func TestReadSeesThisProcess(t *testing.T) {
	busy := 0
	for i := 0; i < 50_000_000; i++ {
		busy += i
	}
	s := Read(os.Getpid())
	if s.RSS <= 0 || s.HWM < s.RSS || s.CPU < 0 || busy == 0 {
		t.Fatalf("stats of this process: %+v", s)
	}
	if gone := Read(1 << 30); gone != (Stats{}) {
		t.Fatalf("a process that does not exist counts %+v", gone)
	}
}
