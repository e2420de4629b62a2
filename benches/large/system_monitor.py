#!/usr/bin/env python3
"""Samples the whole machine every 20 ms, to tell a server's stall from the machine's.

    benches/large/system_monitor.py SECONDS OUT

Writes one line per sample to OUT: the wall time, how late the sample came (ms; this process
only sleeps, so a late sample means the machine ran nothing of it), the pressure-stall time
(`/proc/pressure`, ms in the interval: CPU some, I/O some and full, memory some and full),
`/proc/stat`'s jiffies in the interval (user, system, iowait, steal), running tasks, requests
in flight on the disk, and the dirty and writeback MiB. At the end it prints every interval
over 60 ms (the monitor itself was frozen) with the CPU pressure and steal time counted in it.
Linux only; the disk is the one holding the current directory's file system, or DISK.

A stall that also freezes this monitor, with steal time counted and no disk or memory pressure,
is the machine's (the hypervisor ran none of the guest's CPUs), not the server's.
"""

import os
import sys
import time

LATE_MS = 60
STEP = 0.02
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def pressure(kind):
    """Total stall microseconds, (some, full), of one /proc/pressure file."""
    some = full = 0
    with open(f"/proc/pressure/{kind}") as f:
        for line in f:
            parts = line.split()
            total = int(parts[-1].split("=")[1])
            if parts[0] == "some":
                some = total
            else:
                full = total
    return some, full


def cpu_jiffies():
    """(user+nice, system, iowait, steal) since boot, and the running task count."""
    jiffies, running = None, 0
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu "):
                v = [int(x) for x in line.split()[1:9]]
                jiffies = (v[0] + v[1], v[2], v[4], v[7])
            elif line.startswith("procs_running"):
                running = int(line.split()[1])
    return jiffies, running


def disk_name():
    """The block device of the file system holding the current directory (or $DISK)."""
    if os.environ.get("DISK"):
        return os.environ["DISK"]
    dev = os.stat(".").st_dev
    name = os.path.basename(os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"))
    parent = os.path.realpath(f"/sys/class/block/{name}/..")
    if os.path.exists(os.path.join(parent, "stat")):
        name = os.path.basename(parent)
    return name


def in_flight(disk):
    with open("/proc/diskstats") as f:
        for line in f:
            parts = line.split()
            if parts[2] == disk:
                return int(parts[11])
    return -1


def dirty_mib():
    d = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":")
            d[key] = int(value.split()[0]) // 1024
    return d["Dirty"], d["Writeback"]


def sample():
    return (time.time(), pressure("cpu"), pressure("io"), pressure("memory"), cpu_jiffies())


def main():
    seconds, out = float(sys.argv[1]), sys.argv[2]
    disk = disk_name()
    start = prev = sample()
    frozen = []
    with open(out, "w") as f:
        f.write("time late_ms cpu_some io_some io_full mem_some mem_full "
                "user sys iowait steal running in_flight dirty_mib writeback_mib\n")
        while prev[0] - start[0] < seconds:
            time.sleep(STEP)
            cur = sample()
            late = (cur[0] - prev[0] - STEP) * 1000
            stall = [(cur[i][j] - prev[i][j]) // 1000 for i in (1, 2, 3) for j in (0, 1)]
            jiffies = [a - b for a, b in zip(cur[4][0], prev[4][0])]
            dirty, writeback = dirty_mib()
            row = [round(late, 1), stall[0], stall[2], stall[3], stall[4], stall[5],
                   *jiffies, cur[4][1], in_flight(disk), dirty, writeback]
            f.write(f"{cur[0]:.3f} " + " ".join(str(x) for x in row) + "\n")
            if late > LATE_MS:
                frozen.append((cur[0] - start[0], late, stall[0], jiffies[3]))
            prev = cur
    print(f"{len(frozen)} samples over {LATE_MS} ms late (disk {disk}):")
    for at, late, cpu_some, steal in frozen:
        print(f"  at {at:.2f} s: {late:.0f} ms late, CPU pressure {cpu_some} ms, "
              f"steal {steal * TICK_MS:.0f} ms (all CPUs)")


if __name__ == "__main__":
    main()
