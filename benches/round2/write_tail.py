#!/usr/bin/env python3
"""Where a put's tail latency goes at a fixed offered load: each server's own disk histograms.

At a fixed rate of puts (one node, 64 clients over 8 connections by default), every server
(Concord, etcd 3.5.1, etcd 3.6 if given) runs alternately, fresh each round, and its
/metrics are read before and after the measured window. Both expose etcd's
`etcd_disk_wal_fsync_duration_seconds` (Raft log syncs) and
`etcd_disk_backend_commit_duration_seconds` (state commits), so the table sets the clients' p50,
p99 and max beside how many syncs and commits the server made per second and their own p50/p99
(from the histogram buckets, 1, 2, 4, 8 ms ...: a quantile is read as the upper bound of its
bucket, interpolated within it), and how busy the run kept the machine's CPUs (server and load
generator, from /proc), and the share of calls that took their server's handler over 5 and
10 ms (`grpc_server_handling_seconds`, request to response headers; etcd is started with
`--metrics extensive` for it, Concord always has it). If the log syncs' p99 is the puts' p99,
the disk sets the tail; if the handlers are fast while the clients' tail is long, the time is
spent outside the servers' handlers (HTTP/2, the generator).

Usage (from the repository root, release build):
  python3 benches/round2/write_tail.py --rate 15000 [--etcd36-dir .etcd-ref/bin/etcd-3.6]
      [--rounds 2] [--duration 10s] [--clients 64] [--workload put]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import compare  # noqa: E402  (the cluster and bench runners)

HISTOGRAMS = {
    "fsync": "etcd_disk_wal_fsync_duration_seconds",
    "commit": "etcd_disk_backend_commit_duration_seconds",
}


# The gRPC method each workload times (`grpc_server_handling_seconds`).
METHODS = {"put": "Put", "put-new": "Put", "txn-cas": "Txn", "range": "Range"}


def scrape(url: str, method: str) -> dict[str, dict[float, float]]:
    """Each histogram's cumulative bucket counts (le -> count), +Inf included; "handler" is
    `grpc_server_handling_seconds` of `method`."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    names = {**HISTOGRAMS, "handler": "grpc_server_handling_seconds"}
    out: dict[str, dict[float, float]] = {k: {} for k in names}
    for line in text.splitlines():
        for key, name in names.items():
            if not line.startswith(name + "_bucket{"):
                continue
            if key == "handler" and f'grpc_method="{method}"' not in line:
                continue
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[key][float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def share_over(before: dict[float, float], after: dict[float, float], bound: float) -> float:
    """The percentage of the observations between two scrapes above `bound` seconds."""
    total = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    under = after.get(bound, 0.0) - before.get(bound, 0.0)
    return 100 * (total - under) / total if total > 0 else float("nan")


class Extensive(compare.Cluster):
    """A cluster whose members time every gRPC call: etcd needs `--metrics extensive` for
    `grpc_server_handling_seconds`; Concord always has it and accepts the flag."""

    def argv(self, i: int) -> list[str]:
        return [*super().argv(i), "--metrics", "extensive"]


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> tuple[float, float]:
    """(count, q-quantile in ms) of the observations between two scrapes."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return 0.0, float("nan")
    want, lower, below = q * total, 0.0, 0.0
    for b, c in zip(bounds, counts):
        if c >= want:
            if b == float("inf"):
                return total, lower * 1000
            share = (want - below) / (c - below) if c > below else 1.0
            return total, (lower + (b - lower) * share) * 1000
        lower, below = b, c
    return total, lower * 1000


def one(args, label: str, binary: str) -> dict:
    c = Extensive(binary, 1, args.root, label)
    method = METHODS.get(args.workload, "Put")
    try:
        c.start()
        c.wait_ready()
        before = scrape(c.client[0], method)
        res = compare.bench(args, c, args.workload, [
            "--rate", str(args.rate), "--clients", str(args.clients),
            "--conns", str(compare.conns_for(args.clients))])
        after = scrape(c.client[0], method)
    finally:
        c.remove()
    seconds = res["ops"] / res["ops_per_sec"] if res["ops_per_sec"] else 1.0
    row = {"ops/s": res["ops_per_sec"], "p50": res["p50_ms"], "p99": res["p99_ms"],
           "p99.9": res["p999_ms"], "max": res["max_ms"],
           "busy %": 100 * (res["server_cpu_seconds"] + res["client_cpu_seconds"]) / seconds / compare.CPUS}
    for key in HISTOGRAMS:
        n, p50 = quantile(before[key], after[key], 0.5)
        _, p99 = quantile(before[key], after[key], 0.99)
        row[key + "/s"], row[key + " p50"], row[key + " p99"] = n / seconds, p50, p99
    # The handler's buckets are grpc-prometheus's (5, 10, 25 ms ...), so its tail is a share.
    row["handler >5ms %"] = share_over(before["handler"], after["handler"], 0.005)
    row["handler >10ms %"] = share_over(before["handler"], after["handler"], 0.01)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    ap.add_argument("--etcd-dir", default=os.path.join(here, ".etcd-ref/bin/etcd-ref"))
    ap.add_argument("--etcd36-dir", default=None)
    ap.add_argument("--concord", default=os.path.join(here, "target/release/concord"))
    ap.add_argument("--bench", default=os.path.join(here, "target/release/concord-bench"))
    ap.add_argument("--rate", type=int, required=True, help="offered ops/s")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--workload", default="put")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", default="10s")
    ap.add_argument("--root", default="/var/tmp")
    args = ap.parse_args()
    args.plain, args.auth, args.keep_servers = False, False, False
    servers = [("concord", args.concord), ("etcd", os.path.join(args.etcd_dir, "etcd"))]
    if args.etcd36_dir:
        servers.append(("etcd36", os.path.join(args.etcd36_dir, "etcd")))
    runs: dict[str, list[dict]] = {label: [] for label, _ in servers}
    for r in range(args.rounds):
        for label, binary in servers:
            row = one(args, label, binary)
            runs[label].append(row)
            print(f"round {r + 1} {compare.NAMES[label]}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    keys = list(runs[servers[0][0]][0])
    print(f"\n{args.workload} at {args.rate}/s offered, one node, {args.clients} clients, "
          f"{args.rounds} rounds of {args.duration} (medians; latencies in ms)\n")
    print("| server | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for label, _ in servers:
        print(f"| {compare.NAMES[label]} | " + " | ".join(
            f"{statistics.median(r[k] for r in runs[label]):.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
