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

import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "large"))
from members import stop, wait_healthy  # noqa: E402
from trio import Trio, arguments  # noqa: E402


def main():
    args = arguments(__doc__, "/var/tmp/paused-leader-wake").parse_args()
    trio = Trio(args.server, args.work)
    procs, eps = trio.procs, trio.eps
    took = []
    try:
        for ep in eps:
            wait_healthy(args.etcdctl, ep)
        for r in range(args.rounds):
            time.sleep(2)
            leader = trio.leader(args.etcdctl)
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
