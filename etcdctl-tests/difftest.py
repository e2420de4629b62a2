#!/usr/bin/env python3
"""Differential test: drive the real `etcdctl` against a server under test and
against reference etcd 3.5.1, and compare the (normalized) outputs.

Usage:
  difftest.py --server PATH_TO_SERVER_BINARY --etcd-dir DIR_WITH_REFERENCE_BINARIES
              [--cluster 1|3] [--etcdctl PATH ...] [-k FILTER ...] [-v] [--keep]
              [--ignore-grpc-codes] [--tls off|certs|auto] [--list]

For every etcdctl binary (default: the reference etcdctl 3.5.1 from --etcd-dir and,
if present, Debian's /usr/bin/etcdctl 3.4 run with ETCDCTL_API=3) a fresh pair of
servers is started: one single-node reference etcd, and the server under test
(single node, or a 3-member cluster with --cluster 3).  All scenarios are then run,
in the same order, against both.  Each scenario uses its own key prefix (/sNNN/),
but revisions are global, so revisions are compared exactly.  With --cluster 3 the
steps are spread round-robin over the members' endpoints (serializable reads are
sent to the member that served the last linearizable step, so that they are
guaranteed to observe the previous writes).

After every scenario the current revision of both servers is compared; if it
differs the scenario fails and the lagging server is padded with dummy puts
(/__pad) so that a single divergence does not make every later scenario fail.

Normalization: etcd-client JSON warning log lines ({"level":...}) are removed
(the gRPC status they carry, e.g. "code = OutOfRange desc = ...", is kept as one
"<grpc-error ...>" line per distinct error unless --ignore-grpc-codes); cluster
ids, member ids, raft terms, lease ids (hex in simple output, decimal in json /
fields output) and endpoint addresses are replaced by placeholders.  Revisions are
never normalized.

Watch scenarios (all named watch_*, so `--skip watch_` leaves them out) also use
background steps: BG starts a long-running `etcdctl watch ...` on both servers and
keeps its stdin open (interactive `watch -i` commands are written to it, SEND writes
more); WAIT blocks until a watcher has printed N complete stdout lines; STOP waits
for N lines, then ends the watcher (SIGTERM, or EOF on stdin for `watch -i`) and
compares its exit code, stdout and stderr like any other step.  Line counts, not
sleeps, keep this deterministic: a non-interactive watcher is started with
--rev={R+k} where R+k is the revision of the next write (a "sentinel" on a key the
watch covers), and nothing else is written until the sentinel event has been
printed, so the watch is known to be established and every later revision arrives
in its own response whether or not the watch was created before the sentinel put;
in `watch -i`, a `progress` line after the watch lines plays the same role (etcdctl
only reads the next line once the server confirmed the watch).  With --cluster 3
the background watchers of a scenario (and every other `watch` invocation) run on
a member that no later write of that scenario goes to, after a linearizable `get`
on that member so that it has applied all earlier writes.  The server under test
gets at most WAIT_GRACE seconds more than the reference to print a watcher's lines.

Lease scenarios (lease_*): `lease timetolive` remaining TTLs are time-dependent,
so remaining(N) / "ttl":N / "TTL" : N is shown as <=G when G-60 <= N <= G for the
granted TTL G (granted TTLs stay exact); attached keys and `lease list` entries are
sorted (their order is unspecified).  Leases are global, so lease_* scenarios
revoke what they grant, except lease_grant_min (minimum-TTL leases that expire by
themselves), which runs last.  Lock and election scenarios (lock_*, elect_*) run
`etcdctl lock` / `etcdctl elect` (client-side concurrency recipes over KV, lease and
watch) as background steps; their keys NAME/<lease id in hex> are normalized to
NAME/<LEASE:Kn>, Kn being the n-th lease id seen in such a key in the scenario (and
{L:Kn} usable in later steps); a waiter is known to be queued once a background
`watch --rev` has printed its key; PEEK compares a background process's output so
far (a queued waiter has printed nothing), EXITED waits for one to end by itself.

TLS (--tls, default off): with `certs`, a CA and, signed by it, server and peer
certificates (CN node, for localhost and 127.0.0.1) and a client certificate (CN
root) are made with openssl in the run's temp dir; both servers serve https client
and peer URLs with --cert-file/--key-file/--trusted-ca-file/--client-cert-auth and
the --peer-* equivalents, and etcdctl gets --cacert/--cert/--key.  With `auto`, both
servers get --auto-tls --peer-auto-tls (self-signed certificates of their own) and
etcdctl --insecure-transport=false --insecure-skip-tls-verify.  Both sides use the
same scheme, so endpoints in outputs (https://<ENDPOINT>) still compare equal.

Prints `PASS name (etcdctl X)` / `FAIL name (etcdctl X)` (+ a unified diff of the
first differing step) per scenario and finally `N passed, M failed`; exits 1 if
anything failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

# The parts live in the etcddiff package next to this file; make it importable however
# this script is started (from the repo root, from elsewhere, or imported as a module).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from etcddiff import procs  # noqa: E402
from etcddiff.ctl import Ctl, wait_ready  # noqa: E402
from etcddiff.dsl import READY_TIMEOUT, SCENARIOS, Scenario  # noqa: E402
from etcddiff.procs import _TMPDIRS, Cluster, _cleanup, _on_signal  # noqa: E402
from etcddiff.runner import Runner  # noqa: E402
from etcddiff.scenarios_kv import build_scenarios  # noqa: E402
from etcddiff.tls import MODES as TLS_MODES, Tls  # noqa: E402


def run_with_ctl(ctl: Ctl, args, scenarios: list[Scenario]) -> tuple[int, int]:
    tag = f"(etcdctl {ctl.version})"
    workdir = tempfile.mkdtemp(prefix="difftest-")
    _TMPDIRS.append(workdir)
    passed = failed = 0
    t0 = time.time()
    ref = test = None
    try:
        tls = Tls(args.tls, workdir)
        ctl.flags = tls.ctl_flags()
        for attempt in range(1, 4):
            sub = os.path.join(workdir, f"try{attempt}")
            os.makedirs(sub)
            ref = Cluster("ref", os.path.join(args.etcd_dir, "etcd"), 1, sub,
                          tls.scheme, tls.server_flags())
            test = Cluster("test", args.server, args.cluster, sub, tls.scheme, tls.server_flags())
            ref.start()
            test.start()
            deadline = time.time() + READY_TIMEOUT
            err = failed_cl = None
            for cl in (ref, test):
                err = wait_ready(ctl, cl, deadline)
                if err:
                    failed_cl = cl
                    break
            if not err:
                break
            ref.stop()
            test.stop()
            if attempt < 3 and "address already in use" in failed_cl.log_tail(200).lower():
                print(f"# port clash while starting {failed_cl.label}, retrying", file=sys.stderr)
                continue
            print(f"FAIL startup {tag}\n  {err}\n{failed_cl.log_tail()}")
            for sc in scenarios:
                print(f"FAIL {sc.name} {tag}\n  not run: {failed_cl.label} did not start")
            return 0, len(scenarios)
        runner = Runner(ctl, ref, test, not args.ignore_grpc_codes, args.verbose)
        revs = runner.revisions()
        if revs[0] != revs[1]:
            runner.resync(*revs)
            revs = runner.revisions()
        aborted = None
        for sc in scenarios:
            if aborted is None:
                aborted = test.dead() or ref.dead() or runner.aborted
                if aborted:
                    print(f"  !!! {aborted}\n{(ref if ref.dead() else test).log_tail()}")
            if aborted:
                print(f"FAIL {sc.name} {tag}\n  not run: {aborted}")
                failed += 1
                continue
            ok, msg, revs = runner.run(sc, revs)
            if ok:
                passed += 1
                print(f"PASS {sc.name} {tag}")
            else:
                failed += 1
                print(f"FAIL {sc.name} {tag}\n{msg}")
            sys.stdout.flush()
    finally:
        for cl in (ref, test):
            if cl is not None:
                cl.stop()
        if not procs.KEEP:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"# etcdctl {ctl.version} ({ctl.path}): {passed} passed, {failed} failed "
          f"in {time.time() - t0:.1f}s", file=sys.stderr)
    return passed, failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True, help="binary of the server under test")
    ap.add_argument("--etcd-dir", required=True,
                    help="folder holding the reference etcd and etcdctl 3.5.1 binaries")
    ap.add_argument("--cluster", type=int, choices=(1, 3), default=1,
                    help="members of the server under test (default 1)")
    ap.add_argument("--etcdctl", action="append", metavar="PATH",
                    help="etcdctl binary to drive (repeatable; default: reference etcdctl "
                         "and /usr/bin/etcdctl if present)")
    ap.add_argument("-k", dest="filters", action="append", metavar="FILTER",
                    help="only run scenarios whose name contains FILTER (repeatable)")
    ap.add_argument("--skip", action="append", metavar="FILTER",
                    help="skip scenarios whose name contains FILTER (repeatable)")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print every step and its normalized reference output")
    ap.add_argument("--ignore-grpc-codes", action="store_true",
                    help="drop the client warning lines entirely instead of comparing "
                         "the gRPC status they carry")
    ap.add_argument("--tls", choices=TLS_MODES, default="off",
                    help="client and peer TLS: certs = openssl-made CA and certificates, "
                         "auto = --auto-tls --peer-auto-tls (default off)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (data, logs)")
    ap.add_argument("--list", action="store_true", help="list scenario names and exit")
    args = ap.parse_args()
    procs.KEEP = args.keep
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)

    build_scenarios()
    scenarios = [s for s in SCENARIOS
                 if (not args.filters or any(f in s.name for f in args.filters))
                 and not any(f in s.name for f in (args.skip or []))]
    if args.list:
        for s in scenarios:
            print(f"{s.name} ({len(s.steps)} steps)")
        return 0
    for b in ("etcd", "etcdctl"):
        if not os.access(os.path.join(args.etcd_dir, b), os.X_OK):
            ap.error(f"{b} not found in --etcd-dir {args.etcd_dir}")
    if not os.access(args.server, os.X_OK):
        ap.error(f"--server {args.server} is not executable")
    ctl_paths = args.etcdctl or [os.path.join(args.etcd_dir, "etcdctl")] + \
        (["/usr/bin/etcdctl"] if os.access("/usr/bin/etcdctl", os.X_OK) else [])
    if not scenarios:
        ap.error("no scenario matches the filters")

    ctls = [Ctl(path) for path in ctl_paths]
    if args.tls == "auto":
        # the servers' auto-TLS certificates are self-signed: etcdctl must not verify them
        flags = ("--insecure-transport", "--insecure-skip-tls-verify")
        for ctl in [c for c in ctls if not all(c.has_flag(f) for f in flags)]:
            missing = " or ".join(f for f in flags if not ctl.has_flag(f))
            if args.etcdctl:
                ap.error(f"--tls auto: etcdctl {ctl.version} ({ctl.path}) has no {missing}")
            print(f"# --tls auto: skipping etcdctl {ctl.version} ({ctl.path}): no {missing}",
                  file=sys.stderr)
            ctls.remove(ctl)

    total_pass = total_fail = 0
    try:
        for ctl in ctls:
            p, f = run_with_ctl(ctl, args, scenarios)
            total_pass += p
            total_fail += f
    finally:
        _cleanup()
    print(f"{total_pass} passed, {total_fail} failed")
    return 1 if total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
