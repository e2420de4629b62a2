#!/usr/bin/env python3
"""One client's latency on three nodes, at the leader and at a follower, for each server.

`compare.py` connects its one client to the first member, which is the leader in about one run
of three (elections pick any member), so its one-client medians on three nodes mix the two
paths. Here every round starts a fresh three-member cluster of each server (Concord, etcd
3.5.1, etcd 3.6), finds the leader from `/metrics` (`etcd_server_is_leader`), and runs each
workload with one client on one connection, first at the leader, then at the next member.

Usage (from the repository root, release build):
  python3 benches/round2/one_client_roles.py [--rounds 3] [--duration 3s] [--workloads range,put]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import compare  # noqa: E402  (the cluster runner)


def leader_of(c: compare.Cluster) -> int:
    for i, url in enumerate(c.client):
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            if "etcd_server_is_leader 1" in r.read().decode():
                return i
    raise SystemExit(f"{c.label}: no member reports itself leader")


def main() -> None:
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--etcd-dir", default=os.path.join(here, ".etcd-ref/bin/etcd-ref"))
    ap.add_argument("--etcd36-dir", default=os.path.join(here, ".etcd-ref/bin/etcd-3.6"))
    ap.add_argument("--concord", default=os.path.join(here, "target/release/concord"))
    ap.add_argument("--bench", default=os.path.join(here, "target/release/concord-bench"))
    ap.add_argument("--workloads", default="range,put")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", default="3s")
    ap.add_argument("--root", default="/var/tmp")
    args = ap.parse_args()
    servers = [("concord", args.concord), ("etcd", os.path.join(args.etcd_dir, "etcd")),
               ("etcd36", os.path.join(args.etcd36_dir, "etcd"))]
    p50: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(args.rounds):
        for label, binary in servers:
            c = compare.Cluster(binary, 3, args.root, label)
            try:
                c.start()
                c.wait_ready()
                time.sleep(0.5)
                lead = leader_of(c)
                for role, i in (("leader", lead), ("follower", (lead + 1) % 3)):
                    for w in args.workloads.split(","):
                        out = subprocess.run(
                            [args.bench, w, "--endpoints", c.client[i], "--clients", "1", "--conns", "1",
                             "--duration", args.duration, "--json"],
                            capture_output=True, text=True, check=True, timeout=300)
                        j = json.loads(out.stdout.strip().splitlines()[-1])
                        p50.setdefault((w, role, label), []).append(j["p50_ms"])
            finally:
                c.remove()
    names = [compare.NAMES[label] for label, _ in servers]
    print(f"\nOne client on three nodes, p50 ms (median of {args.rounds} fresh clusters)\n")
    print("| workload | at | " + " | ".join(names) + " | Concord / etcd 3.5.1 | Concord / etcd 3.6 |")
    print("|---|---|" + "---|" * (len(names) + 2))
    for w in args.workloads.split(","):
        for role in ("leader", "follower"):
            m = {label: statistics.median(p50[(w, role, label)]) for label, _ in servers}
            print(f"| {w} | {role} | " + " | ".join(f"{m[label]:.3f}" for label, _ in servers)
                  + f" | {m['concord'] / m['etcd']:.2f}x | {m['concord'] / m['etcd36']:.2f}x |")


if __name__ == "__main__":
    main()
