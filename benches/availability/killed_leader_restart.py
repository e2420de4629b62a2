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

import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "large"))
from members import load, stop, wait_healthy  # noqa: E402
from trio import PORTS, Trio, arguments  # noqa: E402


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
    ap = arguments(__doc__, "/var/tmp/killed-leader-restart")
    ap.add_argument("--keys", type=int, default=0, help="keys to write before the rounds")
    ap.add_argument("--bench", default="target/release/concord-bench", help="writes the keys")
    args = ap.parse_args()
    trio = Trio(args.server, args.work)
    procs, eps = trio.procs, trio.eps
    listen, served = [], []
    try:
        for ep in eps:
            wait_healthy(args.etcdctl, ep)
        if args.keys:
            load(args.bench, eps[0], args.keys, 256)
        for r in range(args.rounds):
            time.sleep(2)
            leader = trio.leader(args.etcdctl)
            procs[leader].kill()
            procs[leader].wait()
            time.sleep(3)
            began = time.time()
            procs[leader], _ = trio.start(leader)
            up = accepting(PORTS[leader])
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
