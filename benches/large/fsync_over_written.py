#!/usr/bin/env python3
"""pwrite + fdatasync of one record at a time, three ways: appending to a growing file, into
space `posix_fallocate` reserved (etcd's WAL), and over blocks a file already holds (a
recycled Raft log segment). With --cold (root), two more over written blocks after the page
cache is dropped: as written, where each write ending inside an uncached block makes the kernel
read it from disk first, and padded with zeros to the end of the block (what the log does in a
reused segment). Prints p50, p99, mean and the KiB this process read from disk, per way.

    benches/large/fsync_over_written.py [--dir /var/tmp] [--sizes 300,16400,102500] [--count 2000] [--cold]
"""

import argparse
import os
import time

BLOCK = 4096


def read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes"):
                return int(line.split()[1])
    return 0


def run(directory, way, size, count):
    path = os.path.join(directory, f"fsync-{way}")
    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if way == "fallocated":
            os.posix_fallocate(fd, 0, count * size + BLOCK)
        elif way.startswith("written"):
            # Old contents, as a reused segment holds them.
            chunk = os.urandom(1 << 20)
            total = count * size + BLOCK
            for at in range(0, total, len(chunk)):
                os.pwrite(fd, chunk[: total - at], at)
        os.fsync(fd)
        if way.startswith("written-cold"):
            os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
        record, times, before = os.urandom(size), [], read_bytes()
        for i in range(count):
            buf = record
            if way == "written-cold-padded":
                buf = record + b"\0" * (-(i * size + size) % BLOCK)
            t = time.perf_counter()
            os.pwrite(fd, buf, i * size)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t)
        read_kib = (read_bytes() - before) >> 10
    finally:
        os.close(fd)
        os.unlink(path)
    times.sort()
    print(f"{way:>19} {size:>7} B  p50 {times[count // 2] * 1e3:.3f} ms  "
          f"p99 {times[count * 99 // 100] * 1e3:.3f} ms  mean {sum(times) / count * 1e3:.3f} ms  "
          f"read {read_kib} KiB")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--sizes", default="300,16400,102500")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--cold", action="store_true")
    a = ap.parse_args()
    ways = ["growing", "fallocated", "written"]
    if a.cold:
        ways += ["written-cold", "written-cold-padded"]
    for size in (int(s) for s in a.sizes.split(",")):
        for way in ways:
            run(a.dir, way, size, a.count)


if __name__ == "__main__":
    main()
