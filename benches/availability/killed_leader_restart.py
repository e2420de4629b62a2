#!/usr/bin/env python3
"""How soon a killed leader serves again once it restarts: Concord or etcd, 3 local members.

Each round: find the leader, SIGKILL it, wait 3 s (the others elect a new leader), start it
again with the same flags and time, from the start: its client port accepting, and an
`etcdctl put` sent to it as soon as it accepts. The restarted member must open its data, learn
the new leader and forward the put. The fault suite's "heal → full service" after kill-leader
sees the same thing only through its 100 ms probe period; this measures it directly.

    benches/availability/killed_leader_restart.py target/release/concord --rounds 10
    benches/availability/killed_leader_restart.py .etcd-ref/bin/etcd-ref/etcd --rounds 10
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "large"))
from members import load, member, status, stop, wait_healthy  # noqa: E402

FLAGS = ["--heartbeat-interval", "100", "--election-timeout", "1000"]


def accepting(port, within=10):
    """Waits until 127.0.0.1:`port` accepts a connection; True if it did within `within` s."""
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.05).close()
            return True
        except OSError:
            time.sleep(0.001)
    return False


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("server")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--keys", type=int, default=0, help="keys to write before the rounds")
    ap.add_argument("--bench", default="target/release/concord-bench", help="writes the keys")
    ap.add_argument("--etcdctl", default=".etcd-ref/bin/etcd-ref/etcdctl")
    ap.add_argument("--work", default="/var/tmp/killed-leader-restart")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    ports = [23790, 23800, 23810]
    cluster = ",".join(f"m{i}=http://127.0.0.1:{p + 1}" for i, p in enumerate(ports))

    def start(i):
        return member(args.server, f"m{i}", ports[i], f"{args.work}/m{i}", cluster=cluster,
                      extra=FLAGS, log=f"{args.work}/m{i}.log")

    os.makedirs(args.work)
    procs, eps = [], []
    for i in range(len(ports)):
        proc, ep = start(i)
        procs.append(proc)
        eps.append(ep)
    listen, served = [], []
    try:
        for ep in eps:
            wait_healthy(args.etcdctl, ep)
        if args.keys:
            load(args.bench, eps[0], args.keys, 256)
        for r in range(args.rounds):
            time.sleep(2)
            statuses = [status(args.etcdctl, ep) for ep in eps]
            leader = next(i for i, s in enumerate(statuses)
                          if s and s["header"]["member_id"] == s["leader"])
            procs[leader].kill()
            procs[leader].wait()
            time.sleep(3)
            began = time.time()
            procs[leader], _ = start(leader)
            up = accepting(ports[leader])
            listen_ms = (time.time() - began) * 1000
            put = subprocess.run([args.etcdctl, "--endpoints", eps[leader], "--command-timeout",
                                  "5s", "put", f"restart/{r}", "v"], capture_output=True)
            ms = (time.time() - began) * 1000
            ok = up and put.returncode == 0
            listen.append(listen_ms)
            served.append(ms if ok else float("inf"))
            print(f"round {r}: member {leader} restarted, accepting after {listen_ms:.0f} ms, "
                  f"its put {'ok' if ok else 'FAILED'} after {ms:.0f} ms "
                  f"{put.stderr.decode().strip()[:80]}", flush=True)
    finally:
        stop(procs)
    print(f"{os.path.basename(args.server)}: accepting median {median(listen):.0f} ms, "
          f"put done median {median(served):.0f} ms, all {[round(t) for t in served]}")


if __name__ == "__main__":
    main()
