#!/usr/bin/env python3
"""How soon a paused leader serves again once it wakes: Concord or etcd, 3 local members.

Each round: find the leader, SIGSTOP it for 3 s (the others elect a new leader), start an
`etcdctl put` against it while it is still stopped (the request waits in its socket), SIGCONT
it 0.3 s later and time the put from the SIGCONT. The woken member must learn that it was
deposed and forward the put to the new leader. The fault suite's "heal → full service" sees the
same thing only through its 100 ms probe period; this measures it directly.

    benches/availability/paused_leader_wake.py target/release/concord --rounds 10
    benches/availability/paused_leader_wake.py .etcd-ref/bin/etcd-ref/etcd --rounds 10
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "large"))
from members import member, status, stop, wait_healthy  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("server")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--etcdctl", default=".etcd-ref/bin/etcd-ref/etcdctl")
    ap.add_argument("--work", default="/var/tmp/paused-leader-wake")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    ports = [23790, 23800, 23810]
    cluster = ",".join(f"m{i}=http://127.0.0.1:{p + 1}" for i, p in enumerate(ports))
    procs, eps = [], []
    for i, p in enumerate(ports):
        proc, ep = member(args.server, f"m{i}", p, f"{args.work}/m{i}", cluster=cluster,
                          extra=["--heartbeat-interval", "100", "--election-timeout", "1000"])
        procs.append(proc)
        eps.append(ep)
    took = []
    try:
        for ep in eps:
            wait_healthy(args.etcdctl, ep)
        for r in range(args.rounds):
            time.sleep(2)
            statuses = [status(args.etcdctl, ep) for ep in eps]
            leader = next(i for i, s in enumerate(statuses)
                          if s and s["header"]["member_id"] == s["leader"])
            procs[leader].send_signal(signal.SIGSTOP)
            time.sleep(3)
            put = subprocess.Popen([args.etcdctl, "--endpoints", eps[leader], "--command-timeout",
                                    "5s", "put", f"wake/{r}", "v"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            time.sleep(0.3)
            woke = time.time()
            procs[leader].send_signal(signal.SIGCONT)
            out, err = put.communicate()
            ms = (time.time() - woke) * 1000
            ok = put.returncode == 0
            took.append(ms if ok else float("inf"))
            print(f"round {r}: member {leader} woke, its put {'ok' if ok else 'FAILED'} after "
                  f"{ms:.0f} ms {err.decode().strip()[:80]}", flush=True)
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
        stop(procs)
        shutil.rmtree(args.work, ignore_errors=True)
    took.sort()
    print(f"{os.path.basename(args.server)}: median {took[len(took) // 2]:.0f} ms, "
          f"all {[round(t) for t in took]}")


if __name__ == "__main__":
    main()
