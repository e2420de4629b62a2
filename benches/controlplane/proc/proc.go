// Package proc reads what the control-plane benchmarks report of a process from /proc: its CPU
// time and its memory.
package proc

import (
	"os"
	"strconv"
	"strings"
)

// Stats are the CPU seconds (user + system) and resident memory of processes, summed.
type Stats struct {
	CPU float64
	// RSS and HWM are the resident memory now and at its peak, in bytes.
	RSS, HWM int64
}

// Read sums the stats of pids (a process that is gone counts zero).
func Read(pids ...int) Stats {
	var s Stats
	for _, pid := range pids {
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			// The fields after the command (which may hold spaces) start at state (field 3):
			// utime is the 14th field, stime the 15th, in USER_HZ.
			if i := strings.LastIndexByte(string(stat), ')'); i >= 0 {
				f := strings.Fields(string(stat[i+1:]))
				if len(f) > 12 {
					u, _ := strconv.ParseFloat(f[11], 64)
					k, _ := strconv.ParseFloat(f[12], 64)
					s.CPU += (u + k) / 100
				}
			}
		}
		if status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status"); err == nil {
			for _, line := range strings.Split(string(status), "\n") {
				f := strings.Fields(line)
				if len(f) < 2 {
					continue
				}
				kib, _ := strconv.ParseInt(f[1], 10, 64)
				switch f[0] {
				case "VmRSS:":
					s.RSS += kib << 10
				case "VmHWM:":
					s.HWM += kib << 10
				}
			}
		}
	}
	return s
}
