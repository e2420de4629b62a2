#!/usr/bin/env python3
"""Two (or more) Concord builds against each other, alternately, on one node: what a change
costs or gains per operation when the data is in memory.

For each round, each build and each case, a fresh single member is started on a fresh data dir
under `--work`, `concord-bench` runs the case for `--duration`, and the member is stopped; builds
alternate within every round so that the machine's drift hits all alike. Prints every run, then
a Markdown table of medians (throughput, p50/p99) and each build's ratio to the first.

Usage:
  benches/ab_builds.py --bench BIN --builds A_BIN,B_BIN [--rounds 2] [--duration 8s]
                       [--cases "range 1 1,range 16 4,..."] [--work /var/tmp]
A case is `WORKLOAD[+FLAG...] CLIENTS CONNS`, e.g. `range+--serializable 64 8`. A build is a
binary, or `VAR=VALUE[;VAR=VALUE...]:BINARY` to run it with those environment variables (the
same binary two ways, e.g. `TOKIO_WORKER_THREADS=2:target/release/concord`). Each run's server
CPU time per operation (µs, over the measured window) is reported beside its throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

DEFAULT_CASES = ("range 1 1,range 16 4,range 64 8,range+--serializable 64 8,mixed 64 8,"
                 "range-prefix 16 4")


def split_build(build: str) -> tuple[dict[str, str], str]:
    """A build's extra environment and its binary (see the usage)."""
    head, sep, binary = build.rpartition(":")
    if not sep or "=" not in head:
        return {}, build
    return dict(kv.split("=", 1) for kv in head.split(";")), binary


def label(build: str) -> str:
    """A build's name in the output: its binary's name, after its environment if any."""
    env, binary = split_build(build)
    return " ".join([*(f"{k}={v}" for k, v in env.items()), os.path.basename(binary)])


def run_case(build: str, bench: str, case: str, duration: str, work: str):
    """(ops/s, p50 ms, p99 ms, server CPU µs per op) of one case on a fresh member of `build`,
    or None."""
    workload, clients, conns = case.split()
    env, binary = split_build(build)
    data = tempfile.mkdtemp(prefix="ab-", dir=work)
    client, peer = "http://127.0.0.1:23790", "http://127.0.0.1:23800"
    server = subprocess.Popen(
        [binary, "--data-dir", data, "--listen-client-urls", client,
         "--advertise-client-urls", client, "--listen-peer-urls", peer,
         "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env})
    try:
        time.sleep(1.5)
        out = subprocess.run(
            [bench, "--endpoints", client, "--clients", clients, "--conns", conns,
             "--duration", duration, "--json", "--server-pids", str(server.pid),
             *workload.split("+")],
            capture_output=True, text=True, check=False).stdout
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(data, ignore_errors=True)
    try:
        r = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    cpu = r["server_cpu_seconds"] * 1e6 / r["ops"] if r.get("ops") else 0.0
    return (r["ops_per_sec"], r["p50_ms"], r["p99_ms"], cpu)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, help="concord-bench binary")
    ap.add_argument("--builds", required=True, help="Concord binaries, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", default="8s")
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--work", default="/var/tmp")
    args = ap.parse_args()
    builds = args.builds.split(",")
    cases = args.cases.split(",")
    results: dict[str, dict[str, list]] = {}
    for r in range(args.rounds):
        for build in builds:
            for case in cases:
                got = run_case(build, args.bench, case, args.duration, args.work)
                results.setdefault(case, {}).setdefault(build, []).append(got)
                print(f"round {r} {label(build)} {case}: {got}", flush=True)
    names = [label(b) for b in builds]
    print("\n| case (workload clients conns) | "
          + " | ".join(f"{n}: ops/s (p50 / p99 ms; CPU µs/op)" for n in names)
          + " | " + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(builds) - 1))
    for case, per in results.items():
        cells, medians = [], []
        for build in builds:
            runs = [x for x in per.get(build, []) if x]
            if not runs:
                cells.append("failed")
                medians.append(None)
                continue
            ops = statistics.median(x[0] for x in runs)
            p50 = statistics.median(x[1] for x in runs)
            p99 = statistics.median(x[2] for x in runs)
            cpu = statistics.median(x[3] for x in runs)
            medians.append(ops)
            cells.append(f"{ops:.0f} ({p50:.2f} / {p99:.2f}; {cpu:.1f})")
        ratios = [f"{m / medians[0]:.3f}" if m and medians[0] else "-" for m in medians[1:]]
        print(f"| {case.replace('+', ' ')} | " + " | ".join(cells) + " | "
              + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
