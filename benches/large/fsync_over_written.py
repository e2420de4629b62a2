#!/usr/bin/env python3
"""pwrite + fdatasync of one record at a time, three ways: appending to a growing file, into
space `posix_fallocate` reserved (etcd's WAL), and over blocks a file already holds (a
recycled Raft log segment). Prints p50, p99 and mean per way.

    benches/large/fsync_over_written.py [--dir /var/tmp] [--sizes 300,16400,102500] [--count 2000]
"""

import argparse
import os
import time


def run(directory, way, size, count):
    path = os.path.join(directory, f"fsync-{way}")
    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if way == "fallocated":
            os.posix_fallocate(fd, 0, count * size + 4096)
        elif way == "written":
            os.pwrite(fd, b"\0" * (count * size + 4096), 0)
        os.fsync(fd)
        record, times = os.urandom(size), []
        for i in range(count):
            t = time.perf_counter()
            os.pwrite(fd, record, i * size)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    times.sort()
    print(f"{way:>10} {size:>7} B  p50 {times[count // 2] * 1e3:.3f} ms  "
          f"p99 {times[count * 99 // 100] * 1e3:.3f} ms  mean {sum(times) / count * 1e3:.3f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--sizes", default="300,16400,102500")
    ap.add_argument("--count", type=int, default=2000)
    a = ap.parse_args()
    for size in (int(s) for s in a.sizes.split(",")):
        for way in ("growing", "fallocated", "written"):
            run(a.dir, way, size, a.count)


if __name__ == "__main__":
    main()
