#!/usr/bin/env python3
"""Puts of large values (16 to 100 KiB), Concord beside etcd, at several concurrencies.

For each value size, one fresh member of each server (etcd's flags, an 8 GiB quota); then
`--rounds` rounds in which, for each client count, concord-bench's `put` runs `--seconds` on
etcd and then on Concord (alternating, so the machine's drift hits both alike), over a key space
of `--keys` keys (so puts overwrite, as a control plane's updates do). Reported per size and
client count, medians over the rounds: puts/s, MB/s of values, p50 and p99, server CPU per put,
the bytes each server wrote to storage per put (its `/proc/<pid>/io` write_bytes), and
Concord's ratio to each etcd. Large values make both servers write at the disk's bandwidth, and
on a virtual disk whose bandwidth a host rations that bandwidth moves within a run: bytes
written per put is what a server decides, puts/s partly what the disk allows at that moment.
Concord and etcd 3.6 fsync every put before they acknowledge it; etcd 3.5.1 with one member
acknowledges while its WAL fsync is still running (etcd issue 14370, fixed in 3.5.5), so its
one-client numbers are not a durable server's. `--disk-floor` also times what one durable put
cannot go below on this disk: a write of the value (plus 200 bytes of framing) and an
`fdatasync`, into a preallocated file in the work dir, 2,000 times per size, before the servers
start.

    benches/large/large_values.py --etcd-dir .etcd-ref/bin/etcd-ref \\
        [--etcd36-dir .etcd-ref/bin/etcd-3.6] \\
        --concord target/release/concord --bench target/release/concord-bench --out benches/large/
"""

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from members import arguments, member, save, servers, stop, wait_healthy


def puts(bench, endpoint, pid, seconds, clients, value_size, keys):
    conns = max(1, min(8, clients // 4))
    out = subprocess.run([bench, "put", "--endpoints", endpoint, "--clients", str(clients),
                          "--conns", str(conns), "--duration", f"{seconds}s", "--value-size",
                          str(value_size), "--key-space", str(keys), "--server-pids", str(pid),
                          "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"concord-bench put against {endpoint} failed: {(out.stdout + out.stderr)[:2000]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def disk_floor(work, size, writes=2000):
    """p50 and p99 (ms) of a `size`+200-byte write and its fdatasync at increasing offsets of a
    preallocated file (as a log appends into a reused segment)."""
    path = os.path.join(work, "disk-floor.probe")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        step = size + 200
        os.posix_fallocate(fd, 0, step * writes)
        os.fsync(fd)
        buf = os.urandom(step)
        took = []
        for i in range(writes):
            started = time.perf_counter()
            os.pwrite(fd, buf, i * step)
            os.fdatasync(fd)
            took.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        os.unlink(path)
    took.sort()
    return round(1000 * took[writes // 2], 3), round(1000 * took[writes * 99 // 100], 3)


def main():
    ap = arguments(__doc__)
    ap.add_argument("--sizes", default="16384,65536,102400")
    ap.add_argument("--clients", default="1,16,64")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--snapshot-count", type=int,
                    help="--snapshot-count for every member (kubeadm sets 10000)")
    ap.add_argument("--warm-seconds", type=int, default=0,
                    help="16-client puts before the rounds, so that each log has been cut by "
                    "snapshots and every server is measured in its steady state")
    ap.add_argument("--disk-floor", action="store_true",
                    help="also time a write and fdatasync of each value size on the work dir")
    a = ap.parse_args()
    etcdctl = f"{a.etcd_dir}/etcdctl"
    sizes = [int(s) for s in a.sizes.split(",")]
    client_counts = [int(c) for c in a.clients.split(",")]
    runs = {}  # (server, size, clients) -> [result]
    floors = {size: disk_floor(a.work, size) for size in sizes} if a.disk_floor else {}
    chosen = servers(a)
    for size in sizes:
        started = []
        try:
            for i, (label, binary) in enumerate(chosen):
                d = tempfile.mkdtemp(prefix=f"values-{label.split()[0]}-", dir=a.work)
                extra = ["--snapshot-count", str(a.snapshot_count)] if a.snapshot_count else []
                proc, ep = member(binary, "m0", 25800 + 10 * i, f"{d}/m0", extra=extra,
                                  log=f"{d}/server.log")
                started.append((label, proc, ep, d))
            for _, _, ep, _ in started:
                wait_healthy(etcdctl, ep)
            for _, proc, ep, _ in started:
                if a.warm_seconds:
                    puts(a.bench, ep, proc.pid, a.warm_seconds, 16, size, a.keys)
            for _ in range(a.rounds):
                for clients in client_counts:
                    for label, proc, ep, _ in started:
                        r = puts(a.bench, ep, proc.pid, a.seconds, clients, size, a.keys)
                        runs.setdefault((label, size, clients), []).append(r)
        finally:
            stop([p for _, p, _, _ in started])
            for *_, d in started:
                shutil.rmtree(d, ignore_errors=True)

    rows, by = [], {}
    for (label, size, clients), rs in runs.items():
        ops = statistics.median(r["ops_per_sec"] for r in rs)
        row = {"server": label, "value_bytes": size, "clients": clients, "puts_per_sec": round(ops),
               "mb_per_sec": round(ops * size / 1e6, 1),
               "p50_ms": round(statistics.median(r["p50_ms"] for r in rs), 2),
               "p99_ms": round(statistics.median(r["p99_ms"] for r in rs), 2),
               "cpu_ms_per_put": round(statistics.median(
                   1000 * r["server_cpu_seconds"] / max(1, r["ops"]) for r in rs), 3),
               "written_kib_per_put": round(statistics.median(
                   r.get("server_write_bytes", 0) / 1024 / max(1, r["ops"]) for r in rs)),
               "errors": sum(r["errors"] for r in rs), "rounds": len(rs)}
        rows.append(row)
        by[(label, size, clients)] = row
    # Every other server (the etcds, and an earlier Concord build with --concord-before) is a
    # column Concord is compared with.
    etcds = [label for label, _ in chosen if label != "Concord"]
    lines = ["| value | clients | " + " | ".join(f"{e} puts/s" for e in etcds) + " | Concord puts/s | "
             + " | ".join(f"ratio to {e}" for e in etcds) + " | "
             + " | ".join(f"{e} p99 (ms)" for e in etcds) + " | Concord p99 (ms) | "
             + " | ".join(f"{e} CPU ms/put" for e in etcds) + " | Concord CPU ms/put | "
             + " | ".join(f"{e} KiB written/put" for e in etcds) + " | Concord KiB written/put |",
             "|" + "---:|" * (6 + 5 * len(etcds))]
    for size in sizes:
        for clients in client_counts:
            es = [by.get((e, size, clients)) for e in etcds]
            c = by.get(("Concord", size, clients))
            if not c or not all(es):
                continue
            lines.append(
                f"| {size // 1024} KiB | {clients} | "
                + " | ".join(str(e["puts_per_sec"]) for e in es) + f" | {c['puts_per_sec']} | "
                + " | ".join(f"{c['puts_per_sec'] / max(1, e['puts_per_sec']):.2f}x" for e in es)
                + " | " + " | ".join(str(e["p99_ms"]) for e in es) + f" | {c['p99_ms']} | "
                + " | ".join(str(e["cpu_ms_per_put"]) for e in es) + f" | {c['cpu_ms_per_put']} | "
                + " | ".join(str(e["written_kib_per_put"]) for e in es)
                + f" | {c['written_kib_per_put']} |")
    if floors:
        lines += ["", "| value | write + fdatasync p50 / p99 (ms) | "
                  + " | ".join(f"{label} one-client p50 (ms)" for label, _ in chosen) + " |",
                  "|---:|---:|" + "---:|" * len(chosen)]
        for size, (p50, p99) in floors.items():
            one = [by.get((label, size, 1)) for label, _ in chosen]
            lines.append(f"| {size // 1024} KiB | {p50} / {p99} | "
                         + " | ".join(str(r["p50_ms"]) if r else "" for r in one) + " |")
        rows.append({"disk_floor_ms": {str(size): f for size, f in floors.items()}})
    table = "\n".join(lines) + "\n"
    print(table)
    print(json.dumps(rows, indent=1))
    if a.out:
        save(a.out, "large-values", rows, table)


if __name__ == "__main__":
    main()
