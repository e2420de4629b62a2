#!/usr/bin/env python3
"""What each key costs in resident memory, and what the block cache adds: Concord beside etcd.

For each server and each key count: one member, `--keys` keys (`bench/k/<8 digits>`, 16 bytes)
with values of `--value-size` bytes written once by 16 clients (concord-bench `load`), then the
member restarted; reported is its resident memory (RSS) once it serves again, after a pause, so
that nothing of the load is in flight. Concord runs once per `--storage-cache-bytes` value.
The per-key cost is the slope between the smallest and the largest key count.

    benches/large/key_memory.py --etcd-dir .etcd-ref/bin/etcd-ref \\
        --concord target/release/concord --bench target/release/concord-bench --out benches/large/
"""

import os
import shutil
import tempfile
import time

from members import arguments, load, member, rss_mib, save, servers, stop, wait_healthy


def steady_rss(server, etcdctl, bench, keys, value_size, work, extra):
    """RSS (MiB) of a restarted member holding `keys` keys."""
    data = tempfile.mkdtemp(prefix="keymem-", dir=work)
    try:
        p, ep = member(server, "m", 24790, data, extra=extra)
        try:
            wait_healthy(etcdctl, ep)
            load(bench, ep, keys, value_size)
        finally:
            stop([p])
        p, ep = member(server, "m", 24790, data, extra=extra)
        try:
            wait_healthy(etcdctl, ep, within=600)
            time.sleep(3)
            return rss_mib(p.pid)
        finally:
            stop([p])
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main():
    ap = arguments(__doc__)
    ap.add_argument("--keys", default="250000,1000000,2000000")
    ap.add_argument("--value-size", type=int, default=16)
    ap.add_argument("--caches", default="8388608,67108864",
                    help="Concord's --storage-cache-bytes values to try")
    args = ap.parse_args()
    etcdctl = os.path.join(args.etcd_dir, "etcdctl")
    counts = [int(k) for k in args.keys.split(",")]
    runs = []
    for label, binary in servers(args):
        if binary != args.concord:
            runs.append((label, binary, []))
            continue
        for cache in args.caches.split(","):
            runs.append((f"{label}, cache {int(cache) >> 20} MiB", binary,
                         ["--storage-cache-bytes", cache]))
    rows = []
    for label, binary, extra in runs:
        rss = {n: steady_rss(binary, etcdctl, args.bench, n, args.value_size, args.work, extra)
               for n in counts}
        lo, hi = counts[0], counts[-1]
        per_key = (rss[hi] - rss[lo]) * 2**20 / (hi - lo)
        rows.append({"server": label, "rss_mib": rss, "bytes_per_key": round(per_key)})
        print(label, {n: round(v) for n, v in rss.items()}, f"{per_key:.0f} B/key", flush=True)
    head = "| server | " + " | ".join(f"RSS at {n:,} keys (MiB)" for n in counts) + " | per key |"
    table = [head, "|---" * (len(counts) + 2) + "|"]
    for r in rows:
        cells = " | ".join(f"{r['rss_mib'][n]:.0f}" for n in counts)
        table.append(f"| {r['server']} | {cells} | {r['bytes_per_key']} B |")
    text = "\n".join(table) + "\n"
    print(text)
    if args.out:
        save(args.out, "key-memory", rows, text)


if __name__ == "__main__":
    main()
