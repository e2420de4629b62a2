#!/usr/bin/env python3
"""Appends over a file's old blocks with a cold page cache: as written, and padded to a block.

    python3 benches/large/partial_block_writes.py [--dir /var/tmp] [--value 16384] [--rounds 2]

Writes a 64 MiB file and syncs it (a reused Raft log segment), then, after dropping the page
cache (root), writes records of `--value` + 53 bytes one after another from its start, each
with pwrite + fdatasync (the log's appends), over 32 MiB; once as they are, once padded with
zeros to the end of their last 4 KiB block. Prints, for each, the bytes this process read from
the disk (/proc/self/io) and the write + fdatasync p50 and p99. A write that ends inside a block
the page cache does not hold makes the kernel read that block first.
"""

import argparse
import os
import time


def read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes"):
                return int(line.split()[1])
    return 0


def run(fd, record, padded):
    os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
    offset, before, latencies = 0, read_bytes(), []
    while offset < 32 << 20:
        buf = record
        if padded:
            end = offset + len(record)
            buf = record + b"\0" * (-end % 4096)
        start = time.perf_counter()
        os.pwrite(fd, buf, offset)
        os.fdatasync(fd)
        latencies.append(time.perf_counter() - start)
        offset += len(record)
    latencies.sort()
    n = len(latencies)
    print(
        f"{'padded' if padded else 'as written'}: {n} appends, {(read_bytes() - before) >> 10} KiB"
        f" read, p50 {latencies[n // 2] * 1e3:.3f} ms, p99 {latencies[n * 99 // 100] * 1e3:.3f} ms"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--value", type=int, default=16384)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    path = os.path.join(args.dir, "partial-block-writes.dat")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        chunk = os.urandom(1 << 20)
        for i in range(64):
            os.pwrite(fd, chunk, i << 20)
        os.fsync(fd)
        record = b"x" * (args.value + 53)
        for _ in range(args.rounds):
            run(fd, record, False)
            run(fd, record, True)
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main()
