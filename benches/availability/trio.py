"""What the leader-fault scripts share: their command line, three local members with the fault
suite's timing (heartbeat 100 ms, election 1000 ms), and finding the leader."""

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "large"))
from members import member, status  # noqa: E402

PORTS = [23790, 23800, 23810]
FLAGS = ["--heartbeat-interval", "100", "--election-timeout", "1000"]


def arguments(doc, work):
    """The server binary, `--rounds`, `--etcdctl` and `--work` (default `work`)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("server")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--etcdctl", default=".etcd-ref/bin/etcd-ref/etcdctl")
    ap.add_argument("--work", default=work)
    return ap


class Trio:
    """Three members of `server` on fresh data dirs under `work` (each logs to `m<i>.log`)."""

    def __init__(self, server, work):
        self.server, self.work = server, work
        self.cluster = ",".join(f"m{i}=http://127.0.0.1:{p + 1}" for i, p in enumerate(PORTS))
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        self.procs, self.eps = [], []
        for i in range(len(PORTS)):
            proc, ep = self.start(i)
            self.procs.append(proc)
            self.eps.append(ep)

    def start(self, i):
        """Starts (or restarts, on its data dir) member `i`: its process and client URL."""
        return member(self.server, f"m{i}", PORTS[i], f"{self.work}/m{i}", cluster=self.cluster,
                      extra=FLAGS, log=f"{self.work}/m{i}.log")

    def leader(self, etcdctl):
        """The index of the member that reports itself leader."""
        statuses = [status(etcdctl, ep) for ep in self.eps]
        return next(i for i, s in enumerate(statuses)
                    if s and s["header"]["member_id"] == s["leader"])
