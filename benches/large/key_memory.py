#!/usr/bin/env python3
"""What each key costs in resident memory, and what the block cache adds: Concord beside etcd.

For each server and each key count: one member, `--keys` keys (`bench/k/<8 digits>`, 16 bytes)
with values of `--value-size` bytes written once by 16 clients (concord-bench `load`), then the
member stopped (SIGTERM) and restarted; reported are the time from the restart until
`etcdctl endpoint health` succeeds (polled every 0.2 s), its resident memory (RSS) once it
serves, after a pause, so that nothing of the load is in flight, and its peak RSS since the
restart (VmHWM: what loading the key index cost at its worst). Concord runs once per
`--storage-cache-bytes` value. The per-key cost is the slope between the smallest and the
largest key count.

    benches/large/key_memory.py --etcd-dir .etcd-ref/bin/etcd-ref \\
        --concord target/release/concord --bench target/release/concord-bench --out benches/large/
"""

import os
import shutil
import tempfile
import time

from members import arguments, load, member, rss_mib, save, servers, stop, wait_healthy


def restarted(server, etcdctl, bench, keys, value_size, work, extra):
    """(seconds until healthy, RSS in MiB, peak RSS in MiB) of a restarted member holding `keys`
    keys."""
    data = tempfile.mkdtemp(prefix="keymem-", dir=work)
    try:
        p, ep = member(server, "m", 24790, data, extra=extra)
        try:
            wait_healthy(etcdctl, ep)
            load(bench, ep, keys, value_size)
        finally:
            stop([p])
        began = time.time()
        p, ep = member(server, "m", 24790, data, extra=extra)
        try:
            wait_healthy(etcdctl, ep, within=600)
            took = time.time() - began
            time.sleep(3)
            return took, rss_mib(p.pid), rss_mib(p.pid, "VmHWM")
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
        got = {n: restarted(binary, etcdctl, args.bench, n, args.value_size, args.work, extra)
               for n in counts}
        rss = {n: m for n, (_, m, _) in got.items()}
        peak = {n: round(h) for n, (_, _, h) in got.items()}
        restart = {n: round(t, 2) for n, (t, _, _) in got.items()}
        lo, hi = counts[0], counts[-1]
        per_key = (rss[hi] - rss[lo]) * 2**20 / (hi - lo)
        rows.append({"server": label, "rss_mib": rss, "peak_rss_mib": peak,
                     "restart_s": restart, "bytes_per_key": round(per_key)})
        print(label, {n: round(v) for n, v in rss.items()}, f"{per_key:.0f} B/key",
              "restart", restart, "peak", peak, flush=True)
    head = "| server | " + " | ".join(f"RSS at {n:,} keys (MiB)" for n in counts) + " | per key |"
    table = [head, "|---" * (len(counts) + 2) + "|"]
    for r in rows:
        cells = " | ".join(f"{r['rss_mib'][n]:.0f}" for n in counts)
        table.append(f"| {r['server']} | {cells} | {r['bytes_per_key']} B |")
    head = "| server | " + " | ".join(f"restart at {n:,} keys (s)" for n in counts) + " | " + \
        " | ".join(f"peak RSS in the restart at {n:,} keys (MiB)" for n in counts) + " |"
    table += ["", head, "|---" * (2 * len(counts) + 1) + "|"]
    for r in rows:
        table.append(f"| {r['server']} | " + " | ".join(f"{r['restart_s'][n]:.2f}" for n in counts)
                     + " | " + " | ".join(f"{r['peak_rss_mib'][n]}" for n in counts) + " |")
    text = "\n".join(table) + "\n"
    print(text)
    if args.out:
        save(args.out, "key-memory", rows, text)


if __name__ == "__main__":
    main()
