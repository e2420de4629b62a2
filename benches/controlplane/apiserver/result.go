package main

import (
	"os"
	"strconv"
	"strings"
)

// procStats are CPU seconds (user + system) and resident memory of processes, from /proc.
type procStats struct {
	cpu      float64
	rss, hwm int64
}

// readProcs sums the stats of pids (a process that is gone counts zero).
func readProcs(pids []int) procStats {
	var s procStats
	for _, pid := range pids {
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			// Fields after the command (which may contain spaces): utime is 14th, stime 15th.
			if i := strings.LastIndexByte(string(stat), ')'); i >= 0 {
				f := strings.Fields(string(stat[i+1:]))
				if len(f) > 12 {
					u, _ := strconv.ParseFloat(f[11], 64)
					k, _ := strconv.ParseFloat(f[12], 64)
					s.cpu += (u + k) / 100
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
					s.rss += kib << 10
				case "VmHWM:":
					s.hwm += kib << 10
				}
			}
		}
	}
	return s
}
