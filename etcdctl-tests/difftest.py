#!/usr/bin/env python3
"""Differential test: drive the real `etcdctl` against a server under test and
against reference etcd 3.5.1, and compare the (normalized) outputs.

Usage:
  difftest.py --server PATH_TO_SERVER_BINARY --etcd-dir DIR_WITH_REFERENCE_BINARIES
              [--cluster 1|3] [--etcdctl PATH ...] [-k FILTER ...] [-v] [--keep]
              [--ignore-grpc-codes] [--list]

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

Prints `PASS name (etcdctl X)` / `FAIL name (etcdctl X)` (+ a unified diff of the
first differing step) per scenario and finally `N passed, M failed`; exits 1 if
anything failed.
"""

from __future__ import annotations

import argparse
import atexit
import difflib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

STEP_TIMEOUT = 20.0       # seconds for one etcdctl invocation
WATCH_EXIT_TIMEOUT = 5.0  # seconds for a `watch` that is expected to end by itself (W steps)
WAIT_TIMEOUT = 5.0        # seconds a WAIT/STOP step waits for a background watcher's lines
WAIT_GRACE = 2.0          # ... at most this long after the reference watcher got its lines
WAIT_GRACE_LATE = 0.5     # ... once the server under test has been late in the scenario
STOP_SETTLE = 0.1         # extra time for unexpected output before a watcher is stopped
READY_TIMEOUT = 30.0      # seconds for servers to become healthy

# --------------------------------------------------------------------------
# Scenario DSL
# --------------------------------------------------------------------------
# Placeholders (substituted per server, in argv and stdin):
#   {P}       the scenario's key prefix, e.g. /s007/
#   {R}       the revision at the start of the scenario ({R+3}, {R-1} also work)
#   {L:name}  the hex id of a lease captured by a step with capture="name"


@dataclass
class Step:
    argv: list[str]
    stdin: str | None = None
    capture: str | None = None   # capture the lease id printed by `lease grant`
    kind: str = "run"            # run | bg | wait | send | stop | peek (see BG/WAIT/SEND/STOP/PEEK)
    name: str | None = None      # background watcher name (bg/wait/send/stop)
    lines: int = 0               # wait/stop: stdout lines to wait for
    eof: bool = False            # stop: close stdin (watch -i) instead of SIGTERM
    canon: str | None = None     # stop: "rev" = sort stdout lines by (revision, text),
                                 # "uniq" = collapse runs of identical stdout lines
    timeout: float = STEP_TIMEOUT

    @property
    def command(self) -> str:
        """The etcdctl command word (first argument that is not a flag)."""
        return next((a for a in self.argv if not a.startswith("-")), "")


@dataclass
class Scenario:
    name: str
    steps: list[Step]
    index: int = 0

    @property
    def prefix(self) -> str:
        return f"/s{self.index:03d}/"


SCENARIOS: list[Scenario] = []


def S(cmd: str, stdin: str | None = None, capture: str | None = None) -> Step:
    return Step(shlex.split(cmd), stdin=stdin, capture=capture)


def scenario(name: str, *steps) -> None:
    assert all(s.name != name for s in SCENARIOS), name
    SCENARIOS.append(Scenario(name, [s if isinstance(s, Step) else S(s) for s in steps],
                              index=len(SCENARIOS) + 1))


def TXN(stdin: str, flags: str = "") -> Step:
    return S("txn " + flags, stdin=stdin)


def W(cmd: str, stdin: str | None = None) -> Step:
    """A `watch` invocation that is expected to end by itself (argument errors,
    compacted revision, `watch -i` hitting EOF): a normal step with a short timeout."""
    return Step(shlex.split(cmd), stdin=stdin, timeout=WATCH_EXIT_TIMEOUT)


def BG(name: str, cmd: str, stdin: str | None = None) -> Step:
    """Start `etcdctl <cmd>` in the background (on the scenario's watch member);
    `stdin` is written to it but stdin stays open.  Not compared by itself."""
    return Step(shlex.split(cmd), stdin=stdin, kind="bg", name=name)


def WAIT(name: str, lines: int) -> Step:
    """Wait until watcher `name` has printed `lines` complete stdout lines (or it
    exited, or timed out: see wait_lines).  Not compared by itself."""
    return Step([], kind="wait", name=name, lines=lines)


def SEND(name: str, text: str) -> Step:
    """Write more stdin to watcher `name` (`watch -i` commands)."""
    return Step([], stdin=text, kind="send", name=name)


def STOP(name: str, lines: int, eof: bool = False, canon: str | None = None) -> Step:
    """Wait for `lines` stdout lines like WAIT, then end watcher `name` (SIGTERM, or
    close its stdin if eof) and compare its exit code, stdout and stderr."""
    return Step([], kind="stop", name=name, lines=lines, eof=eof, canon=canon)


def EXITED(name: str, canon: str | None = None) -> Step:
    """Like STOP, but wait (WAIT_TIMEOUT) for watcher `name` to exit by itself."""
    return Step([], kind="stop", name=name, lines=-1, canon=canon)


def PEEK(name: str) -> Step:
    """Compare what watcher `name` has printed so far (after STOP_SETTLE), without
    stopping it: e.g. that a lock waiter has not run its command yet."""
    return Step([], kind="peek", name=name)


def txn_input(compares=(), success=(), failure=()) -> str:
    """etcdctl (non-interactive) txn stdin: compares, blank line, success requests,
    blank line, failure requests, blank line.  Every section must be terminated by
    a blank line: hitting EOF instead fails with `Error: EOF` (exit 3)."""
    return "".join(f"{line}\n" for line in compares) + "\n" + \
        "".join(f"{line}\n" for line in success) + "\n" + \
        "".join(f"{line}\n" for line in failure) + "\n"


def build_scenarios() -> None:
    # ----------------------------------------------------------------- put
    scenario("put_simple",
             "put {P}a 1",
             "get {P}a",
             "put {P}a 2",
             "get {P}a",
             "get {P}a -w json",
             "get {P}a -w fields",
             "get {P}a -w simple",
             "put {P}b 'hello world'",
             "get {P}b -w json")
    scenario("put_versions",
             "put {P}k v1", "put {P}k v2", "put {P}k v3",
             "get {P}k -w json",
             "put {P}other x",
             "put {P}k v4",
             "get {P}k -w fields",
             "get --prefix {P} -w json")
    scenario("put_prev_kv",
             "put {P}k v1 --prev-kv",
             "put {P}k v2 --prev-kv",
             "put {P}k v3 --prev-kv -w json",
             "put {P}k v4 --prev-kv -w fields",
             "put {P}k2 new --prev-kv -w json",
             "put {P}k2 new --prev-kv -w fields")
    scenario("put_write_out",
             "put {P}a 1 -w json",
             "put {P}a 2 -w fields",
             "put {P}a 3 -w simple",
             "put {P}a 4 -w table",
             "get {P}a -w table",
             "get {P}a -w bogus")
    scenario("put_ignore_value",
             "put {P}iv original",
             "put {P}iv --ignore-value",
             "get {P}iv -w json",
             "put {P}iv --ignore-value --prev-kv",
             "put {P}iv --ignore-value --prev-kv -w json",
             "put {P}missing --ignore-value",
             "put {P}iv newvalue --ignore-value",
             "get {P}iv -w fields")
    scenario("put_lease_ignore_lease",
             S("lease grant 600", capture="L1"),
             S("lease grant 600 -w json", capture="L2"),
             "put {P}l v1 --lease={L:L1}",
             "get {P}l -w json",
             "get {P}l -w fields",
             "put {P}l v2 --ignore-lease",
             "get {P}l -w json",
             "put {P}l v3 --ignore-lease --prev-kv -w json",
             "put {P}l v4 --lease={L:L2} --prev-kv -w fields",
             "get {P}l -w fields",
             "put {P}l v5",
             "get {P}l -w json",
             "put {P}nolease x --ignore-lease",
             "put {P}l v6 --ignore-lease --lease={L:L1}",
             "put {P}l --ignore-lease --ignore-value",
             "get {P}l -w json",
             "put {P}l2 a --lease={L:L1}",
             "lease revoke {L:L1}",
             "get --prefix {P} -w json",
             "put {P}l3 a --lease={L:L1}")
    scenario("put_lease_errors",
             "put {P}x v --lease=1234",
             "put {P}x v --lease=zz",
             "put {P}x v --lease=0",
             "get {P}x -w json",
             "put {P}x v --lease=7fffffffffffffff")
    scenario("put_arg_errors",
             "put '' x",
             "put",
             "put {P}a",
             "put {P}a b c",
             "get {P}a")
    scenario("put_value_from_stdin",
             S("put {P}in", stdin="hello world\nline2 ünïcødé ✓\n"),
             "get {P}in",
             "get {P}in -w json",
             "get {P}in --print-value-only",
             S("put {P}in2 --prev-kv", stdin="no trailing newline"),
             "get {P}in2 -w fields",
             S("put {P}in3", stdin=""),
             S("put {P}in3 'arg wins'", stdin="stdin loses"),
             "get {P}in3")
    scenario("put_special_values",
             "put {P}sp 'a value with   spaces'",
             "put {P}uni 'ünïcødé — 日本語 ✓'",
             "put {P}nl 'line1\nline2'",
             Step(["put", "{P}quote", "\"quoted\" and 'single'"]),
             "put {P}empty ''",
             "put {P}dash -- -starts-with-dash",
             "put {P}tab 'a\tb'",
             S("put {P}big", stdin="0123456789abcdef" * 1024),
             "get {P}sp", "get {P}uni", "get {P}nl", "get {P}quote",
             "get {P}empty", "get {P}empty -w json", "get {P}dash", "get {P}tab -w json",
             "get {P}big -w fields",
             "get --prefix {P} --keys-only",
             "get --prefix {P} --print-value-only --limit 6")
    scenario("put_special_keys",
             "put '{P}key with spaces' v1",
             "put '{P}ключ' v2",
             "put '{P}emoji😀' v3",
             "put '{P}nl\nkey' v4",
             "get --prefix {P}",
             "get --prefix {P} -w json",
             "get '{P}ключ' -w fields",
             "--hex get --prefix {P}",
             "del '{P}key with spaces'",
             "get --prefix {P} --keys-only")
    # ----------------------------------------------------------------- get
    scenario("get_missing_key",
             "get {P}nothing",
             "get {P}nothing -w json",
             "get {P}nothing -w fields",
             "get {P}nothing --print-value-only",
             "get --prefix {P}nothing -w json")
    scenario("get_prefix",
             "put {P}a 1", "put {P}ab 2", "put {P}abc 3", "put {P}b 4", "put {P}ba 5",
             "put {P}c 6",
             "get --prefix {P}a",
             "get --prefix {P}a -w json",
             "get --prefix {P}a -w fields",
             "get --prefix {P}",
             "get --prefix {P}b --keys-only",
             "get --prefix {P}b --print-value-only",
             "get --prefix {P}zzz -w json",
             "get {P}a --prefix --limit 2 -w json",
             "get {P}a --prefix --limit 3 -w json",
             "get {P}a --prefix --limit 4 -w json")
    scenario("get_range_end",
             "put {P}a 1", "put {P}b 2", "put {P}c 3", "put {P}d 4", "put {P}e 5",
             "get {P}b {P}d",
             "get {P}b {P}d -w json",
             "get {P}a {P}z --keys-only",
             "get {P}b {P}b -w json",
             "get {P}d {P}b -w json",
             "get {P}b {P}d --limit 1 -w fields",
             "get {P}b {P}dd --order=DESCEND",
             "get {P}b {P}d --prefix")
    scenario("get_from_key",
             "put {P}a 1", "put {P}b 2", "put {P}c 3", "put {P}d 4",
             "get --from-key {P}b",
             "get --from-key {P}b -w json",
             "get --from-key {P}bb --keys-only",
             "get --from-key {P}b --limit 2 -w json",
             "get --from-key {P}b --order=DESCEND --keys-only",
             "get --from-key {P}b --prefix",
             "get --from-key {P}zzzz -w json",
             "get {P}a {P}c --from-key")
    scenario("get_limit",
             "put {P}a 1", "put {P}b 2", "put {P}c 3",
             "get --prefix {P} --limit 1",
             "get --prefix {P} --limit 2 -w json",
             "get --prefix {P} --limit 3 -w json",
             "get --prefix {P} --limit 100 -w fields",
             "get --prefix {P} --limit 0 -w json",
             "get --prefix {P} --limit -1 -w json",
             "get {P}a --limit 1 -w json")
    sort_steps = ["put {P}c 3", "put {P}a 5", "put {P}e 1", "put {P}b 4", "put {P}d 2",
                  "put {P}a 6", "put {P}b 4", "put {P}a 7", "put {P}d 9"]
    for target in ("KEY", "VERSION", "CREATE", "MODIFY", "VALUE"):
        sort_steps.append(f"get --prefix {{P}} --sort-by={target} -w json")
        for order in ("ASCEND", "DESCEND"):
            sort_steps.append(f"get --prefix {{P}} --sort-by={target} --order={order}")
    sort_steps += ["get --prefix {P} --order=DESCEND",
                   "get --prefix {P} --order=ASCEND --keys-only",
                   "get --prefix {P} --sort-by=VERSION --order=DESCEND --limit 2 -w json",
                   "get --prefix {P} --sort-by=VALUE --order=DESCEND --limit 3 --keys-only",
                   "get --prefix {P} --sort-by=MODIFY --limit 1 -w fields",
                   "get --prefix {P} --sort-by=create --order=descend",
                   "get --prefix {P} --sort-by=BOGUS",
                   "get --prefix {P} --order=BOGUS"]
    scenario("get_sort_small", *sort_steps)
    scenario("get_sort_ties_small",
             # ties: (only <= 6 keys so Go's sort.Sort in etcd is effectively stable)
             "put {P}f same", "put {P}b same", "put {P}d other", "put {P}a same",
             "put {P}c other", "put {P}e same",
             "get --prefix {P} --sort-by=VALUE",
             "get --prefix {P} --sort-by=VALUE --order=DESCEND",
             "get --prefix {P} --sort-by=VERSION --keys-only",
             "get --prefix {P} --sort-by=VERSION --order=DESCEND --keys-only",
             "get --prefix {P} --sort-by=VALUE --limit 2 -w json")
    scenario("get_keys_only_print_value_only",
             "put {P}a 1", "put {P}b 2",
             "get --prefix {P} --keys-only",
             "get --prefix {P} --keys-only -w json",
             "get --prefix {P} --keys-only -w fields",
             "get --prefix {P} --print-value-only",
             "get --prefix {P} --print-value-only -w json",
             "get --prefix {P} --keys-only --print-value-only",
             "get {P}a --keys-only --limit 1 -w json")
    scenario("get_count_only",
             "put {P}a 1", "put {P}b 2", "put {P}c 3",
             "get --prefix {P} --count-only -w fields",
             "get --prefix {P} --count-only -w json",
             "get --prefix {P} --count-only",
             "get --prefix {P} --count-only --keys-only -w fields",
             "get --prefix {P} --count-only --limit 1 -w fields",
             "get {P}a --count-only -w fields",
             "get {P}zz --count-only -w fields",
             "get {P}a {P}c --count-only -w json")
    scenario("get_rev_history",
             "put {P}k v1", "put {P}k v2", "put {P}j j1", "put {P}k v3", "del {P}k",
             "get {P}k --rev={R+1}",
             "get {P}k --rev={R+2} -w json",
             "get {P}k --rev={R+3} -w fields",
             "get {P}k --rev={R+4}",
             "get {P}k --rev={R+5} -w json",
             "get --prefix {P} --rev={R+3} -w json",
             "get --prefix {P} --rev={R+5} -w json",
             "get --prefix {P} --rev={R+2} --count-only -w fields",
             "get {P}k --rev=0 -w json",
             "get {P}k --rev=-1 -w json")
    scenario("get_rev_future",
             "put {P}k v1",
             "get {P}k --rev={R+1}",
             "get {P}k --rev={R+2}",
             "get {P}k --rev={R+1000} -w json",
             "get --prefix {P} --rev={R+2} --count-only -w fields")
    scenario("get_consistency",
             "put {P}a 1", "put {P}b 2",
             "get {P}a --consistency=s",
             "get --prefix {P} --consistency=s -w json",
             "get {P}a --consistency=l -w json",
             "get {P}a --consistency=x",
             "put {P}a 3",
             "get {P}a --consistency=s -w fields")
    # (no --min/max-mod-revision, --min/max-create-revision: neither etcdctl 3.5.1 nor
    #  3.4 has these flags -- they only exist in the gRPC RangeRequest / etcdctl 3.6.)
    scenario("get_sort_with_range_and_rev",
             "put {P}a 3", "put {P}b 1", "put {P}c 2", "put {P}a 4", "put {P}d 0", "put {P}b 5",
             "get {P}a {P}d --sort-by=VALUE -w json",
             "get {P}a {P}d --sort-by=MODIFY --order=DESCEND --limit 2 -w json",
             "get --prefix {P} --sort-by=CREATE --order=DESCEND --limit 1 -w json",
             "get --prefix {P} --rev={R+4} --sort-by=VALUE --order=DESCEND -w json",
             "get --prefix {P} --rev={R+3} --sort-by=MODIFY --limit 2 --keys-only",
             "get --from-key {P}b --sort-by=VERSION --order=DESCEND --keys-only",
             "get --prefix {P} --sort-by=KEY --order=ASCEND --limit 2 -w json")
    scenario("get_hex",
             "put {P}a 'hi there'",
             "--hex get {P}a",
             "--hex get {P}a --print-value-only",
             "--hex get --prefix {P} --keys-only",
             "--hex get {P}a -w fields",
             "--hex get {P}a -w json")
    scenario("get_arg_errors",
             "get",
             "get {P}a {P}b {P}c",
             "get {P}a --prefix --from-key",
             "get {P}a {P}b --prefix",
             "get {P}a --rev=abc",
             "get {P}a --min-mod-revision=1")
    keys = [f"k{i:02d}" for i in range(30)]
    perm = [(i * 7 + 3) % 30 for i in range(30)]       # a permutation of 0..29
    many = [f"put {{P}}{keys[p]} val{(p * 11) % 30:02d}" for p in perm]
    many += [f"put {{P}}{keys[p]} upd{(p * 13) % 30:02d}" for p in perm[::4]]
    many += ["get --prefix {P} --keys-only",
             "get --prefix {P} --count-only -w fields",
             "get --prefix {P} --limit 5 -w json",
             "get --prefix {P} --sort-by=KEY --order=DESCEND --limit 4 -w json",
             "get --prefix {P} --sort-by=CREATE --order=ASCEND --limit 7 --keys-only",
             "get --prefix {P} --sort-by=CREATE --order=DESCEND --limit 7 --keys-only",
             "get --prefix {P} --sort-by=MODIFY --order=DESCEND --limit 5 -w json",
             "get --prefix {P} --sort-by=MODIFY --order=ASCEND --limit 30 --keys-only",
             "get --prefix {P} --sort-by=VALUE --limit 6",
             "get --prefix {P} --sort-by=VALUE --order=DESCEND --limit 6 -w fields",
             "get --prefix {P} --order=DESCEND --limit 3 --keys-only",
             "get {P}k05 {P}k15 --sort-by=VALUE --order=DESCEND --keys-only",
             "get --from-key {P}k20 --sort-by=MODIFY --order=DESCEND --limit 4 --keys-only",
             # VERSION has ties: keep it to <= 6 keys (Go's sort.Sort is only stable there)
             "get {P}k00 {P}k06 --sort-by=VERSION --keys-only",
             "get {P}k10 {P}k16 --sort-by=VERSION --order=DESCEND --limit 3 --keys-only",
             "get {P}k20 {P}k26 --sort-by=VERSION --order=DESCEND -w json",
             "get --prefix {P} --rev={R+15} --sort-by=VALUE --order=DESCEND --limit 4 -w json",
             "get --prefix {P} --limit 29 --keys-only -w json",
             "del --prefix {P}k1",
             "get --prefix {P} --sort-by=MODIFY --order=DESCEND --limit 3 -w json"]
    scenario("get_many_keys_sort_limit", *many)
    # ----------------------------------------------------------------- del
    scenario("del_single",
             "put {P}a 1", "put {P}b 2",
             "del {P}a",
             "del {P}a",
             "del {P}nothing -w json",
             "del {P}b -w json",
             "get --prefix {P} -w json",
             "del {P}b -w fields")
    scenario("del_prev_kv",
             "put {P}a 1", "put {P}a 2", "put {P}b 3",
             "del {P}a --prev-kv",
             "del {P}b --prev-kv -w json",
             "put {P}c 4",
             "del {P}c --prev-kv -w fields",
             "del {P}nothing --prev-kv -w json",
             "del {P}nothing --prev-kv")
    scenario("del_prefix",
             "put {P}a 1", "put {P}ab 2", "put {P}abc 3", "put {P}b 4",
             "del --prefix {P}a",
             "get --prefix {P} --keys-only",
             "del --prefix {P}zzz",
             "put {P}a 5", "put {P}ax 6",
             "del --prefix {P}a --prev-kv -w json",
             "del --prefix {P}",
             "get --prefix {P} -w json")
    scenario("del_from_key",
             "put {P}a 1", "put {P}b 2", "put {P}c 3", "put {P}d 4",
             "del --from-key {P}c",
             "get --prefix {P} --keys-only",
             "del --from-key {P}b --prev-kv",
             "del --from-key {P}b",
             "get --prefix {P} -w json")
    scenario("del_range",
             "put {P}a 1", "put {P}b 2", "put {P}c 3", "put {P}d 4", "put {P}e 5",
             "del {P}b {P}d",
             "get --prefix {P} --keys-only",
             "del {P}a {P}dz --prev-kv -w json",
             "del {P}x {P}y",
             "del {P}e {P}a",
             "get --prefix {P} --keys-only")
    scenario("del_and_recreate",
             "put {P}k v1", "put {P}k v2",
             "del {P}k",
             "get {P}k -w json",
             "put {P}k v3",
             "get {P}k -w json",
             "get {P}k --rev={R+2} -w json",
             "get {P}k --rev={R+3} -w json")
    scenario("del_arg_errors",
             "del",
             "del {P}a --prefix --from-key",
             "del {P}a {P}b {P}c",
             "del {P}a {P}b --prefix")
    # ----------------------------------------------------------------- txn
    scenario("txn_value_compares",
             "put {P}k b",
             TXN(txn_input(['value("{P}k") = "b"'], ['put {P}r eq-true'], ['put {P}r eq-false'])),
             TXN(txn_input(['value("{P}k") != "b"'], ['put {P}r ne-true'], ['put {P}r ne-false'])),
             TXN(txn_input(['value("{P}k") < "c"'], ['put {P}r lt-true'], ['put {P}r lt-false'])),
             TXN(txn_input(['value("{P}k") > "c"'], ['put {P}r gt-true'], ['put {P}r gt-false'])),
             TXN(txn_input(['val("{P}k") > "a"'], ['get {P}r'], ['get {P}k'])),
             TXN(txn_input(['value("{P}k") = "B"'], ['get {P}r'], ['get {P}k'])),
             TXN(txn_input(['value("{P}missing") = ""'], ['get {P}r'], ['get {P}k'])),
             TXN(txn_input(['value("{P}missing") != "x"'], ['get {P}r'], ['get {P}k'])),
             "get {P}r -w json")
    scenario("txn_version_compares",
             "put {P}k 1", "put {P}k 2",
             TXN(txn_input(['version("{P}k") = "2"'], ['put {P}r 1'], ['put {P}r 0'])),
             TXN(txn_input(['version("{P}k") > "2"'], ['put {P}r 1'], ['put {P}r 0'])),
             TXN(txn_input(['ver("{P}k") < "3"'], ['get {P}r'], ['get {P}k'])),
             TXN(txn_input(['version("{P}k") != "2"'], ['get {P}r'], ['get {P}k'])),
             TXN(txn_input(['version("{P}missing") = "0"'], ['put {P}missing created'], [])),
             TXN(txn_input(['version("{P}missing") = "0"'], ['put {P}missing created'], ['get {P}missing'])),
             TXN(txn_input(['version("{P}k") = "x"'], [], [])),
             "get --prefix {P} -w json")
    scenario("txn_create_compares",
             "put {P}a 1", "put {P}b 1", "put {P}a 2",
             TXN(txn_input(['create("{P}a") = "{R+1}"'], ['get {P}a'], ['get {P}b'])),
             TXN(txn_input(['create("{P}a") > "{R+1}"'], ['get {P}a'], ['get {P}b'])),
             TXN(txn_input(['c("{P}b") > "{R+1}"'], ['get {P}a'], ['get {P}b'])),
             TXN(txn_input(['create("{P}b") < "{R+1}"'], ['get {P}a'], ['get {P}b'])),
             TXN(txn_input(['create("{P}b") != "{R+2}"'], ['get {P}a'], ['get {P}b'])),
             TXN(txn_input(['create("{P}none") = "0"'], ['put {P}none x'], ['get {P}none'])),
             TXN(txn_input(['create("{P}none") = "0"'], ['put {P}none y'], ['get {P}none'])))
    scenario("txn_mod_compares",
             "put {P}a 1", "put {P}b 1", "put {P}a 2",
             TXN(txn_input(['mod("{P}a") = "{R+3}"'], ['put {P}a 3'], ['get {P}a'])),
             TXN(txn_input(['mod("{P}a") = "{R+3}"'], ['put {P}a 4'], ['get {P}a'])),
             TXN(txn_input(['m("{P}a") > "{R+3}"'], ['get {P}a'], ['get {P}b'])),
             TXN(txn_input(['mod("{P}b") < "{R+3}"'], ['get {P}a'], ['get {P}b'])),
             TXN(txn_input(['mod("{P}b") != "{R+2}"'], ['get {P}a'], ['get {P}b'])),
             TXN(txn_input(['mod("{P}missing") = "0"'], ['get {P}a'], ['get {P}b'])),
             TXN(txn_input(['mod("{P}missing") < "1"'], ['get {P}a'], ['get {P}b'])))
    scenario("txn_multiple_compares",
             "put {P}a 1", "put {P}b 2",
             TXN(txn_input(['value("{P}a") = "1"', 'value("{P}b") = "2"'],
                           ['put {P}res both'], ['put {P}res notboth'])),
             TXN(txn_input(['value("{P}a") = "1"', 'value("{P}b") = "3"', 'version("{P}a") = "1"'],
                           ['put {P}res all'], ['put {P}res notall'])),
             TXN(txn_input(['value("{P}a") = "1"', 'mod("{P}a") = "{R+1}"', 'create("{P}b") = "{R+2}"', 'version("{P}b") > "0"'],
                           ['get {P}res'], []), "-w json"),
             "get {P}res -w json")
    scenario("txn_ops_inside",
             "put {P}a 1", "put {P}b 2", "put {P}c 3",
             TXN(txn_input([], ['get --prefix {P}', 'get {P}a --keys-only', 'get {P}b --print-value-only',
                                'get --prefix {P} --limit 1', 'get --prefix {P} --sort-by=VALUE --order=DESCEND',
                                'get --prefix {P} --count-only'], [])),
             TXN(txn_input([], ['put {P}a 10 --prev-kv', 'del {P}b --prev-kv', 'del {P}nothing',
                                'put {P}d "spaced value"', 'get --prefix {P}'], []), "-w json"),
             TXN(txn_input([], ['del --prefix {P} --prev-kv', 'get --prefix {P}'], []), "-w fields"),
             TXN(txn_input([], ['put {P}x 1', 'put {P}y 2', 'get --from-key {P}x'], [])),
             TXN(txn_input([], ['del --from-key {P}y'], [])),
             TXN(txn_input([], ['delete {P}x'], [])),
             "get --prefix {P} -w json")
    scenario("txn_output_formats",
             "put {P}a 1",
             TXN(txn_input(['value("{P}a") = "1"'], ['get {P}a', 'put {P}b 2', 'del {P}a'], []), "-w json"),
             TXN(txn_input(['value("{P}a") = "1"'], [], ['get {P}b', 'put {P}c 3', 'del {P}zz']), "-w json"),
             TXN(txn_input(['value("{P}b") = "2"'], ['get {P}b', 'put {P}c 4 --prev-kv', 'del {P}b --prev-kv', 'del {P}zz --prev-kv'], []), "-w fields"),
             TXN(txn_input(['value("{P}b") = "2"'], ['get {P}b', 'put {P}c 5'], []), "-w simple"),
             TXN(txn_input(['value("{P}b") = "2"'], ['get {P}b'], []), "-w table"))
    scenario("txn_empty_and_readonly",
             TXN(txn_input()),
             TXN(txn_input(), "-w json"),
             TXN(txn_input(['value("{P}a") = "1"'])),
             TXN(txn_input(['value("{P}a") = "1"']), "-w json"),
             "put {P}a 1",
             TXN(txn_input([], ['get {P}a']), "-w json"),
             TXN(txn_input([], [], ['get {P}a']), "-w json"),
             TXN(txn_input(['value("{P}a") = "1"'], ['get {P}a'], ['get {P}a']), "-w fields"),
             "get {P}a -w json")
    scenario("txn_duplicate_keys",
             "put {P}a 1",
             TXN(txn_input([], ['put {P}a 2', 'put {P}a 3'], [])),
             TXN(txn_input([], ['put {P}a 2', 'del {P}a'], [])),
             TXN(txn_input([], ['put {P}ab 2', 'del --prefix {P}a'], [])),
             TXN(txn_input([], ['del {P}a', 'del {P}a'], [])),
             TXN(txn_input([], ['get {P}a', 'put {P}a 4', 'get {P}a'], [])),
             TXN(txn_input(['value("{P}a") = "nope"'], ['put {P}a 5'], ['put {P}a 6', 'put {P}a 7'])),
             TXN(txn_input(['value("{P}a") = "nope"'], ['put {P}a 5', 'put {P}a 5'], ['put {P}a 8'])),
             TXN(txn_input(['value("{P}a") = "4"'], ['put {P}a 9'], ['put {P}a 8', 'put {P}a 8'])),
             "get {P}a -w json")
    scenario("txn_create_if_missing",
             TXN(txn_input(['create("{P}lock") = "0"'], ['put {P}lock owner1'], ['get {P}lock'])),
             TXN(txn_input(['create("{P}lock") = "0"'], ['put {P}lock owner2'], ['get {P}lock']), "-w json"),
             TXN(txn_input(['value("{P}lock") = "owner1"'], ['del {P}lock'], [])),
             TXN(txn_input(['create("{P}lock") = "0"'], ['put {P}lock owner2'], ['get {P}lock'])),
             "get {P}lock -w fields")
    scenario("txn_parse_errors",
             "put {P}a 1",
             S("txn", stdin=""),
             S("txn", stdin='value("{P}a") = "1"\n\nput {P}b 1\n'),
             S("txn", stdin='value("{P}a") = "1"\n\nput {P}b 1\n\nput {P}b 0'),
             S("txn", stdin='value("{P}a") = "1"\n\nput {P}b 2\n\nput {P}b 0\n'),
             S("txn", stdin='val({P}a) = "1"\n\n\n\n'),
             S("txn", stdin='foo("{P}a") = "1"\n\n\n\n'),
             S("txn", stdin='value "{P}a" = "1"\n\n\n\n'),
             S("txn", stdin='value("{P}a") = 1\n\n\n\n'),
             S("txn", stdin='version("{P}a") = "one"\n\n\n\n'),
             S("txn", stdin='\nfoo bar\n\n\n'),
             S("txn", stdin='\nput {P}onlykey\n\n\n'),
             S("txn", stdin='\nget\n\n\n'),
             S("txn", stdin='\nput {P}c 1 --bogus-flag\n\n\n'),
             S("txn extra-arg", stdin='\n\n\n'),
             S("txn", stdin='   \n  put {P}c   "indented"  \n\n\n'),
             "get --prefix {P} -w json")
    scenario("txn_lease",
             S("lease grant 600", capture="L"),
             "put {P}a 1 --lease={L:L}",
             "put {P}b 1",
             # (no lease("k") compares: etcdctl 3.5.1 panics on them client-side,
             #  "panic: bad value" in clientv3.mustInt64orLeaseID)
             TXN(txn_input([], ['put {P}c 1 --lease={L:L}', 'get --prefix {P}'], []), "-w json"),
             TXN(txn_input([], ['put {P}c 2 --ignore-lease', 'put {P}a --ignore-value'], []), "-w json"),
             TXN(txn_input([], ['put {P}d 1 --lease=1234'], [])),
             "get --prefix {P} -w json",
             "lease revoke {L:L}",
             "get --prefix {P} -w json")
    scenario("txn_get_rev",
             "put {P}a 1", "put {P}a 2",
             TXN(txn_input([], ['get {P}a --rev={R+1}', 'get {P}a --rev={R+2}'], []), "-w json"),
             TXN(txn_input([], ['get {P}a --rev={R+100}'], [])),
             TXN(txn_input([], ['get --prefix {P} --rev={R+1} --limit 1'], [])),
             TXN(txn_input([], ['get --prefix {P} --rev={R+2} --sort-by=MODIFY --order=DESCEND'], []), "-w json"))
    # --------------------------------------------------------- compaction
    scenario("compaction_basic",
             "put {P}k v1", "put {P}k v2", "put {P}gone x", "del {P}gone", "put {P}k v3",
             "compaction {R+3}",
             "get {P}k --rev={R+1}",
             "get {P}k --rev={R+2} -w json",
             "get {P}k --rev={R+3} -w json",
             "get --prefix {P} --rev={R+3} -w json",
             "get --prefix {P} --rev={R+4} -w json",
             "get --prefix {P} --rev={R+5} -w json",
             "get {P}k -w json",
             "get --prefix {P} --rev={R+2} --count-only -w fields",
             "get {P}k --rev={R+3} --consistency=s -w json",
             "get {P}k --rev={R+2} --consistency=s")
    scenario("compaction_errors",
             "put {P}k v1", "put {P}k v2", "put {P}k v3",
             "compaction {R+2}",
             "compaction {R+2}",
             "compaction {R+1}",
             "compaction {R+1000}",
             "compaction {R+4}",
             "compaction 0",
             "compaction -5",
             "compaction",
             "compaction abc",
             "compaction {R+3} {R+3}",
             "compaction {R+3} -w json",
             "compaction {R+3} -w fields",
             "get {P}k -w json")
    scenario("compaction_physical",
             "put {P}a 1", "put {P}a 2", "put {P}b 1", "put {P}a 3",
             "compaction --physical {R+2}",
             "get {P}a --rev={R+1}",
             "get --prefix {P} --rev={R+2} -w json",
             "compaction --physical=true {R+3} -w json",
             "get --prefix {P} --rev={R+2} -w json",
             "get --prefix {P} --rev={R+3} -w json",
             "compaction --physical {R+3}",
             "get --prefix {P} -w json")
    scenario("compaction_then_txn_and_history",
             "put {P}a 1", "put {P}a 2", "put {P}b 1", "del {P}a", "put {P}a 3",
             "compaction {R+4}",
             TXN(txn_input([], ['get {P}a --rev={R+3}'], []), "-w json"),
             TXN(txn_input([], ['get {P}a --rev={R+4}', 'get --prefix {P} --rev={R+5}'], []), "-w json"),
             TXN(txn_input(['mod("{P}a") = "{R+5}"'], ['put {P}a 4', 'get {P}a --rev={R+5}'], []), "-w json"),
             "get {P}a -w json",
             "get {P}a --rev={R+4} -w json",
             "del --prefix {P} --prev-kv -w json",
             "get --prefix {P} --rev={R+6} -w json",
             "get --prefix {P} --rev={R+7} -w json")
    scenario("keyspace_wide_reads",
             "put {P}a 1",
             "get '' --prefix --count-only -w fields",
             "get --from-key '' --keys-only --limit 3 -w json",
             "get --prefix {P} -w json")
    build_watch_scenarios()
    build_lease_scenarios()
    build_lock_scenarios()
    build_elect_scenarios()


def build_watch_scenarios() -> None:
    # Line counts for WAIT/STOP: simple output prints 3 lines per event (type, key,
    # value; a DELETE's value line is empty), 5 with a prev_kv; json prints 1 line per
    # response (a replay from --rev sends all past revisions in one response whose
    # header revision is the current one, a live watcher one response per revision);
    # fields prints 4 header lines per response + per event 1 type line, 6 for the
    # prev_kv if any and 6 for the kv.  `progress` prints `progress notify: REV` once
    # per watch of the `watch -i` session (+ 1 json line each with -w json).
    scenario("watch_arg_errors",
             W("watch"),
             W("watch --prefix {P}a {P}b"),
             W("watch {P}b {P}a"),
             W("watch {P}a {P}a -w json"),
             W("watch -i", stdin=""),
             W("watch -i", stdin="bogus\n\n  \nwatch\nwatch --prefix {P}a {P}b\nprogress extra\n"))
    scenario("watch_single_key",
             BG("w", "watch {P}k --rev={R+1}"),
             "put {P}k sentinel",                                        # R+1
             WAIT("w", 3),
             "put {P}k v1",                                              # R+2
             "put {P}kk not-watched",                                    # R+3
             "put {P}j not-watched",                                     # R+4
             "del {P}k",                                                 # R+5
             "del {P}k",                                                 # (no revision)
             "put {P}k 'after delete'",                                  # R+6
             TXN(txn_input([], ['put {P}j x', 'put {P}k in-txn', 'put {P}kk y'])),   # R+7
             TXN(txn_input(['value("{P}k") = "nope"'], ['put {P}k success'],
                           ['put {P}k failure'])),                       # R+8
             TXN(txn_input([], ['get {P}k', 'del {P}kk'])),              # R+9 (not watched)
             "put {P}k 'two\nlines'",                                    # R+10
             STOP("w", 22),
             "get {P}k -w json")
    scenario("watch_prefix_json",
             S("lease grant 600", capture="L"),
             BG("w", "watch --prefix {P} --rev={R+1} -w json"),
             "put {P}sentinel s",                                        # R+1
             WAIT("w", 1),
             "put {P}a 1",                                               # R+2
             "put {P}b 2 --lease={L:L}",                                 # R+3
             TXN(txn_input([], ['put {P}c 3', 'put {P}a 10', 'del {P}sentinel',
                                'put {P}d 4 --lease={L:L}', 'get --prefix {P}'])),  # R+4
             "del --prefix {P}a",                                        # R+5
             "lease revoke {L:L}",                                       # R+6 (b, d)
             "del --prefix {P}",                                         # R+7 (c)
             "del --prefix {P}",                                         # (no revision)
             "put {P}e 5",                                               # R+8
             STOP("w", 8))
    scenario("watch_range_prev_kv_fields",
             "put {P}b0 pre",                                            # R+1
             BG("w", "watch {P}b {P}d --prev-kv --rev={R+2}"),
             BG("f", "watch {P}b {P}d --prev-kv --rev={R+2} -w fields"),
             BG("all", "watch --prefix '' --rev={R+2} -w json"),
             "put {P}b sentinel",                                        # R+2
             WAIT("w", 3), WAIT("f", 11), WAIT("all", 1),
             "put {P}a out", "put {P}d out", "put {P}e out",             # R+3..R+5
             "put {P}c 1",                                               # R+6
             "put {P}b0 changed",                                        # R+7
             "put {P}c 2 --prev-kv",                                     # R+8
             "del {P}a {P}cz",                                           # R+9 (a, b, b0, c)
             "put {P}b again",                                           # R+10
             STOP("w", 34), STOP("f", 110), STOP("all", 9))
    scenario("watch_rev_history",
             "put {P}k v1",                                              # R+1
             "put {P}k v2",                                              # R+2
             "put {P}j j1",                                              # R+3
             "del {P}k",                                                 # R+4
             "put {P}k v3",                                              # R+5 put after delete
             "put {P}j j2",                                              # R+6
             BG("all", "watch --prefix {P} --rev={R+1}"),
             BG("k3", "watch {P}k --rev={R+3} -w json"),                 # before the delete
             BG("k5", "watch {P}k --rev={R+5} --prev-kv"),               # the put after it
             BG("pk", "watch --prefix {P} --rev={R+2} --prev-kv -w json"),
             BG("ff", "watch {P}j --rev={R+3} --prev-kv -w fields"),
             BG("fut", "watch {P}k --rev={R+8}"),                        # future revision
             WAIT("all", 18), WAIT("k3", 1), WAIT("k5", 3), WAIT("pk", 1), WAIT("ff", 24),
             "put {P}k v4",                                              # R+7
             "put {P}k v5",                                              # R+8
             "put {P}j j3",                                              # R+9
             STOP("all", 27), STOP("k3", 3), STOP("k5", 13), STOP("pk", 4), STOP("ff", 41),
             STOP("fut", 3))
    scenario("watch_compacted",
             "put {P}k v1",                                              # R+1
             "put {P}k v2",                                              # R+2
             "put {P}j j1",                                              # R+3
             "put {P}k v3",                                              # R+4
             "compaction {R+3}",
             W("watch {P}k --rev={R+1}"),
             W("watch --prefix {P} --rev={R+2} -w json"),
             W("watch {P}k --rev=1 --prev-kv -w fields"),
             BG("at", "watch --prefix {P} --rev={R+3} --prev-kv"),       # = compact revision
             STOP("at", 8))
    scenario("watch_interactive",
             BG("i", "watch -i", stdin="watch {P}a\nwatch --prefix {P}b\nprogress\n"),
             WAIT("i", 2),
             "put {P}a 1",                                               # R+1
             WAIT("i", 5),
             "put {P}b1 x",                                              # R+2
             WAIT("i", 8),
             "put {P}c unwatched",                                       # R+3
             "put {P}a 2",                                               # R+4
             WAIT("i", 11),
             SEND("i", "watch --rev={R+1} --prev-kv {P}c\n"),
             WAIT("i", 14),
             SEND("i", "progress\n"),
             WAIT("i", 17),
             "put {P}c again",                                           # R+5
             WAIT("i", 22),
             TXN(txn_input([], ['put {P}b2 y', 'put {P}d z'])),          # R+6
             STOP("i", 25, eof=True))
    # Two watches of one `watch -i` session covering the same key print the same
    # revision concurrently (one goroutine each): canon="rev" sorts stdout lines by
    # (revision, text).
    scenario("watch_interactive_json_overlap",
             BG("i", "watch -i -w json", stdin="watch {P}a\nwatch --prefix {P}\nprogress\n"),
             WAIT("i", 4),
             "put {P}a 1",                                               # R+1
             WAIT("i", 6),
             TXN(txn_input([], ['put {P}a 2', 'put {P}b 3'])),           # R+2
             WAIT("i", 8),
             "put {P}b 4",                                               # R+3
             WAIT("i", 9),
             SEND("i", "watch --rev={R+1} {P}b\n"),
             WAIT("i", 10),
             "del --prefix {P}",                                         # R+4
             STOP("i", 13, eof=True, canon="rev"))


def build_lease_scenarios() -> None:
    # All named lease_*.  Leases are global: `lease list` shows every live lease of
    # the run (earlier scenarios' as <HEXID>/<LEASE?>), so every lease granted here
    # is revoked again, except the minimum-TTL ones of lease_grant_min, which comes
    # last and expires by itself (no keys attached: no revision).  Remaining TTLs
    # in `lease timetolive` are time-dependent: remaining(N) is shown as <=G when
    # G-60 <= N <= G for the granted TTL G (see canon_ttl); granted TTLs are exact.
    scenario("lease_grant",
             S("lease grant 600", capture="a"),
             S("lease grant 600", capture="b"),
             S("lease grant 300 -w json", capture="j"),
             S("lease grant 120 -w fields", capture="f"),
             S("lease grant 9000000000", capture="max"),
             "lease grant 9000000001",
             "lease grant",
             "lease grant abc",
             "lease grant 5 6",
             "lease timetolive {L:a}",
             "lease timetolive {L:b} -w json",
             "lease timetolive {L:j} -w fields",
             "lease timetolive {L:max}",
             "lease revoke {L:a}", "lease revoke {L:b}", "lease revoke {L:j}",
             "lease revoke {L:f}", "lease revoke {L:max}",
             "get {P}nothing -w json")
    scenario("lease_timetolive",
             S("lease grant 600", capture="L"),
             "lease timetolive {L:L}",
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:L} -w json",
             "lease timetolive {L:L} --keys -w json",
             "lease timetolive {L:L} --keys -w fields",
             "put {P}k1 v --lease={L:L}",                                # R+1
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:L} --keys -w json",
             "lease timetolive {L:L} --keys -w fields",
             "put {P}k2 v --lease={L:L}",                                # R+2
             "lease timetolive {L:L}",
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:L} --keys -w json",
             "lease timetolive {L:L} --keys -w fields",
             "lease timetolive {L:L} -w fields",
             "lease revoke {L:L}",                                       # R+3
             "lease timetolive {L:L}",
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:L} -w json",
             "lease timetolive {L:L} --keys -w json",
             "lease timetolive {L:L} --keys -w fields",
             "lease timetolive 1234",
             "lease timetolive 1234 -w json",
             "lease timetolive zz",
             "lease timetolive",
             "lease timetolive {L:L} -w table",
             "get --prefix {P} -w json")
    scenario("lease_revoke",
             S("lease grant 600", capture="E"),
             "lease revoke {L:E}",                                       # no keys: no revision
             "get {P}x -w json",
             "lease revoke {L:E}",
             "lease revoke {L:E} -w json",
             S("lease grant 600", capture="J"),
             "lease revoke {L:J} -w json",
             S("lease grant 600", capture="F"),
             "lease revoke {L:F} -w fields",
             "lease revoke 1234",
             "lease revoke zz",
             "lease revoke",
             "lease revoke 1 2",
             "put {P}x v --lease={L:E}",
             "get {P}x -w json")
    scenario("lease_attach_keys",
             S("lease grant 600", capture="L"),
             S("lease grant 600", capture="M"),
             "put {P}a 1 --lease={L:L}",                                 # R+1
             "put {P}b 2 --lease={L:L}",                                 # R+2
             "get {P}a -w json",
             "get --prefix {P} -w fields",
             "put {P}a 3 --ignore-lease",                                # R+3 keeps L
             "get {P}a -w json",
             "put {P}b 4",                                               # R+4 detaches b
             "get {P}b -w json",
             "lease timetolive {L:L} --keys",
             TXN(txn_input([], ['put {P}c 5 --lease={L:L}', 'put {P}d 6 --lease={L:M}',
                                'put {P}b 7 --lease={L:M}'])),           # R+5
             "get --prefix {P} -w json",
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:M} --keys -w json",
             "put {P}c 8 --lease={L:M}",                                 # R+6 c: L -> M
             "lease timetolive {L:L} --keys",
             "lease timetolive {L:M} --keys",
             "del {P}d",                                                 # R+7
             "lease timetolive {L:M} --keys -w fields",
             "lease revoke {L:M}",                                       # R+8 deletes b, c
             "get --prefix {P} -w json",
             "get --prefix {P} --rev={R+7} --keys-only",
             "get {P}b --rev={R+8} -w json",
             "get {P}c -w json",
             "lease revoke {L:L}",                                       # R+9 deletes a
             "get --prefix {P} -w json",
             "get {P}a --rev={R+8} -w fields",
             "lease timetolive {L:L} --keys",
             "put {P}z 1 --lease={L:L}",
             TXN(txn_input([], ['put {P}z 1 --lease={L:M}'])),
             "get --prefix {P} --count-only -w fields")
    scenario("lease_list",
             "lease list",
             S("lease grant 600", capture="x"),
             S("lease grant 700", capture="y"),
             "lease list",
             "lease list -w json",
             "lease list -w fields",
             "lease revoke {L:x}",
             "lease list",
             "lease list -w json",
             "lease revoke {L:y}",
             "lease list",
             "lease list extra-arg",
             "lease list -w table")
    scenario("lease_keepalive",
             S("lease grant 600", capture="L"),
             "lease keep-alive --once {L:L}",
             "lease keep-alive --once {L:L} -w json",
             "lease keep-alive --once {L:L} -w fields",
             "lease timetolive {L:L}",
             "lease revoke {L:L}",
             "lease keep-alive --once {L:L}",
             "lease keep-alive --once 1234",
             "lease keep-alive --once",
             "lease keep-alive --once zz",
             # A streaming keep-alive (renews every TTL/3 s) ends by itself once the
             # lease is revoked: "expired or revoked."  How many renewals it prints
             # depends on timing: canon="uniq" collapses them.
             S("lease grant 3", capture="S"),
             BG("ka", "lease keep-alive {L:S}"),
             WAIT("ka", 1),
             "lease revoke {L:S}",
             EXITED("ka", canon="uniq"))
    # must stay the last lease_ scenario (its leases expire by themselves in 2 s)
    scenario("lease_grant_min",
             S("lease grant 1", capture="m1"),
             "lease keep-alive --once {L:m1}",
             S("lease grant 2 -w json", capture="m2"),
             S("lease grant 0", capture="m0"),
             S("lease grant -w fields -- -5", capture="mn"),
             S("lease grant 3", capture="m3"),
             "lease grant 1 -w table")


def build_lock_scenarios() -> None:
    # All named lock_*.  `etcdctl lock` uses the concurrency.Mutex recipe (a session
    # lease, key NAME/<lease id in hex>, waiting for the deletion of older keys), not
    # the v3lock service.  In lock_ and elect_ scenarios such keys are normalized to
    # NAME/<LEASE:Kn>: the n-th lease id first seen in a key under the scenario's
    # prefix (also usable as {L:Kn} in later steps).  A holder that gets SIGTERM
    # deletes its key but does not revoke its session lease.
    scenario("lock_command",
             "lock {P}m -- echo hello",                                  # R+1, R+2
             "lock {P}m -- sh -c 'echo key=$ETCD_LOCK_KEY rev=$ETCD_LOCK_REV'",   # R+3, R+4
             "lock {P}m -- sh -c 'echo out; echo err >&2; exit 3'",      # R+5, R+6
             "lock {P}m -- /nonexistent/command",                        # R+7, R+8
             "lock {P}other --ttl 5 -- echo ttl",                        # R+9, R+10
             "lock {P}m --ttl 0 -- echo ttl0",                           # R+11, R+12
             "lock",
             "get --prefix {P} -w json")
    scenario("lock_contended",
             BG("h", "lock {P}mtx"),                                     # R+1
             WAIT("h", 2),
             BG("w", "lock {P}mtx -- sh -c 'echo got $ETCD_LOCK_KEY $ETCD_LOCK_REV'"),  # R+2
             BG("q", "watch --prefix {P}mtx --rev={R+2}"),
             WAIT("q", 3),                       # the waiter's key exists: it is queued
             PEEK("w"),
             "get --prefix {P}mtx --keys-only --sort-by=CREATE",
             "get --prefix {P}mtx -w fields --sort-by=CREATE",
             "lock {P}other -- echo unrelated",                          # R+3, R+4
             STOP("h", 2),                       # unlock: R+5; the waiter runs, R+6
             WAIT("q", 9),
             STOP("w", 1),
             STOP("q", 9),
             "get --prefix {P} -w json")
    scenario("lock_ttl",
             BG("h", "lock --ttl 7 {P}t"),                               # R+1
             WAIT("h", 2),
             "lease timetolive {L:K1} --keys",
             "get {P}t --prefix -w fields",
             STOP("h", 2),                                               # R+2
             "lease timetolive {L:K1} --keys",
             BG("h1", "lock --ttl 1 {P}u"),                              # R+3 (TTL 2: minimum)
             WAIT("h1", 2),
             "lease timetolive {L:K2}",
             STOP("h1", 2),                                              # R+4
             "get --prefix {P} -w json")


def build_elect_scenarios() -> None:
    # All named elect_*.  `etcdctl elect` uses the concurrency.Election recipe (like
    # lock: keys NAME/<lease>, value = proposal), not the v3election service; a
    # candidate that gets SIGTERM resigns (deletes its key).  `elect -l` prints the
    # key and value of every new leader.
    scenario("elect_arg_errors",
             "elect",
             "elect {P}x",
             "elect {P}x a b",
             "elect -l {P}x a")
    scenario("elect_campaign_observe",
             BG("obs", "elect -l {P}e"),
             BG("c1", "elect {P}e p1"),                                  # R+1
             WAIT("c1", 2),
             WAIT("obs", 2),
             BG("c2", "elect {P}e 'proposal two'"),                      # R+2
             BG("q", "watch --prefix {P}e --rev={R+2}"),
             WAIT("q", 3),                       # the second candidate is queued
             PEEK("c2"),
             "get --prefix {P}e --sort-by=CREATE -w fields",
             BG("late", "elect -l {P}e"),        # an observer started after the election
             WAIT("late", 2),
             STOP("c1", 2),                      # resigns: R+3, c2 takes over
             WAIT("c2", 2), WAIT("obs", 4), WAIT("late", 4),
             "get --prefix {P}e --print-value-only",
             STOP("c2", 2),                      # resigns: R+4
             WAIT("q", 9),
             STOP("obs", 4), STOP("late", 4), STOP("q", 9),
             "get --prefix {P} -w json")


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------

_PROCS: list[subprocess.Popen] = []
_TMPDIRS: list[str] = []
_KEEP = False


def _cleanup() -> None:
    for p in list(_PROCS):
        if p.poll() is None:
            try:
                p.terminate()
            except OSError:
                pass
    deadline = time.time() + 5
    for p in list(_PROCS):
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            try:
                p.kill()
                p.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
    _PROCS.clear()
    if not _KEEP:
        for d in _TMPDIRS:
            shutil.rmtree(d, ignore_errors=True)
        _TMPDIRS.clear()


atexit.register(_cleanup)


def _on_signal(signum, _frame):
    raise SystemExit(128 + signum)


_USED_PORTS: set[int] = set()


def _port_window() -> tuple[int, int]:
    """Ports below the kernel's ephemeral range, so that outgoing client
    connections (etcdctl, peers) cannot grab them between probe and bind."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    if lo > 12000:
        return 10000, lo - 1
    return 50000, 65000


def free_ports(n: int) -> list[int]:
    """n distinct, currently bindable ports, never handed out twice by this process."""
    import random
    lo, hi = _port_window()
    ports: list[int] = []
    for _ in range(100 * n):
        if len(ports) == n:
            break
        p = random.randint(lo, hi)
        if p in _USED_PORTS:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            s.close()
        _USED_PORTS.add(p)
        ports.append(p)
    if len(ports) < n:
        raise RuntimeError("cannot find free ports")
    return ports


class Cluster:
    """A single node or an n-member cluster of some etcd-compatible binary."""

    def __init__(self, label: str, binary: str, members: int, workdir: str):
        self.label = label
        self.binary = binary
        self.n = members
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []
        ports = free_ports(2 * members)
        self.client_ports = ports[:members]
        self.peer_ports = ports[members:]
        self.names = [f"{label}{i}" for i in range(members)]
        self.endpoints = [f"http://127.0.0.1:{p}" for p in self.client_ports]

    def start(self) -> None:
        initial = ",".join(f"{nm}=http://127.0.0.1:{pp}"
                           for nm, pp in zip(self.names, self.peer_ports))
        for i in range(self.n):
            ddir = os.path.join(self.workdir, f"{self.names[i]}.data")
            log = os.path.join(self.workdir, f"{self.names[i]}.log")
            self.logs.append(log)
            argv = [self.binary,
                    "--name", self.names[i],
                    "--data-dir", ddir,
                    "--listen-client-urls", self.endpoints[i],
                    "--advertise-client-urls", self.endpoints[i],
                    "--listen-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
                    "--initial-cluster", initial,
                    "--initial-cluster-state", "new",
                    "--initial-cluster-token", f"difftest-{self.label}"]
            with open(log, "wb") as lf:
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=lf,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            self.procs.append(p)
            _PROCS.append(p)

    def dead(self) -> str | None:
        for nm, p in zip(self.names, self.procs):
            if p.poll() is not None:
                return f"{self.label} member {nm} exited with code {p.returncode}"
        return None

    def log_tail(self, lines: int = 25) -> str:
        out = []
        for log in self.logs:
            try:
                with open(log, "rb") as f:
                    data = f.read().decode("utf-8", "replace").splitlines()
            except OSError:
                continue
            out.append(f"==> {log} <==")
            out.extend(data[-lines:])
        return "\n".join(out)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
            if p in _PROCS:
                _PROCS.remove(p)


# --------------------------------------------------------------------------
# etcdctl invocation
# --------------------------------------------------------------------------

@dataclass
class Result:
    code: int | str
    stdout: str
    stderr: str


class Ctl:
    def __init__(self, path: str):
        self.path = path
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
        self.env["ETCDCTL_API"] = "3"
        r = subprocess.run([path, "version"], env=self.env, capture_output=True, text=True,
                           timeout=STEP_TIMEOUT)
        m = re.search(r"etcdctl version:\s*(\S+)", r.stdout)
        self.version = m.group(1) if m else "unknown"

    def start(self, endpoint: str, argv: list[str], stdin: str | None) -> subprocess.Popen:
        return subprocess.Popen([self.path, f"--endpoints={endpoint}", *argv], env=self.env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    @staticmethod
    def finish(p: subprocess.Popen, stdin: str | None, deadline: float) -> Result:
        data = (stdin or "").encode()
        try:
            out, err = p.communicate(data, timeout=max(0.1, deadline - time.time()))
            code: int | str = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            code = "TIMEOUT"
        return Result(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def run(self, endpoint: str, argv: list[str], stdin: str | None = None,
            timeout: float = STEP_TIMEOUT) -> Result:
        p = self.start(endpoint, argv, stdin)
        return self.finish(p, stdin, time.time() + timeout)


class BgProc:
    """A background etcdctl (a watcher): threads collect its stdout and stderr."""

    def __init__(self, ctl: Ctl, endpoint: str, argv: list[str], stdin: str | None):
        self.argv = argv
        self.p = ctl.start(endpoint, argv, None)
        _PROCS.append(self.p)
        self.out = bytearray()
        self.err = bytearray()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._pump, args=(f, buf), daemon=True)
                        for f, buf in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self.threads:
            t.start()
        if stdin:
            self.send(stdin)

    def _pump(self, f, buf: bytearray) -> None:
        fd = f.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            with self.lock:
                buf.extend(chunk)

    def send(self, text: str) -> None:
        try:
            self.p.stdin.write(text.encode())
            self.p.stdin.flush()
        except (OSError, ValueError):       # already exited / stdin closed
            pass

    def lines(self) -> int:
        with self.lock:
            return self.out.count(b"\n")

    def finished(self) -> bool:
        return self.p.poll() is not None and not any(t.is_alive() for t in self.threads)

    def stop(self, eof: bool) -> Result:
        if self.p.poll() is None:
            if eof:
                self._close_stdin()
            else:
                # not SIGINT: Go keeps an inherited SIG_IGN for SIGINT (e.g. when the
                # harness runs as a background job), but always dies on SIGTERM
                self.p.send_signal(signal.SIGTERM)
        code: int | str
        try:
            code = self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(timeout=5)
            code = "HUNG (killed)"
        self._close_stdin()
        for t in self.threads:
            t.join(timeout=5)
        for f in (self.p.stdout, self.p.stderr):
            try:
                f.close()
            except OSError:
                pass
        if self.p in _PROCS:
            _PROCS.remove(self.p)
        with self.lock:
            return Result(code, self.out.decode("utf-8", "replace"),
                          self.err.decode("utf-8", "replace"))

    def peek(self) -> Result:
        """Exit code ("running" if still running) and the output so far."""
        code = self.p.poll()
        with self.lock:
            return Result("running" if code is None else code,
                          self.out.decode("utf-8", "replace"),
                          self.err.decode("utf-8", "replace"))

    def _close_stdin(self) -> None:
        try:
            self.p.stdin.close()
        except (OSError, ValueError):
            pass


def wait_lines(bp_ref: BgProc, bp_test: BgProc, n: int, test_late: bool) -> tuple[bool, bool]:
    """Wait until both watchers have printed n complete stdout lines (or exited;
    n < 0: until they exited).  The reference gets WAIT_TIMEOUT; the server under
    test as long, but at most WAIT_GRACE (WAIT_GRACE_LATE if test_late) after the
    reference was done.  Returns whether each side reached n lines (exited)."""
    def reached(bp: BgProc) -> bool:
        return bp.finished() if n < 0 else bp.lines() >= n

    now = time.time()
    deadline = now + WAIT_TIMEOUT
    grace = WAIT_GRACE_LATE if test_late else WAIT_GRACE
    ref_done_at: float | None = None
    while True:
        now = time.time()
        if ref_done_at is None and (reached(bp_ref) or bp_ref.finished() or now > deadline):
            ref_done_at = now
        test_done = (reached(bp_test) or bp_test.finished() or now > deadline
                     or (ref_done_at is not None and now > ref_done_at + grace))
        if ref_done_at is not None and test_done:
            return reached(bp_ref), reached(bp_test)
        time.sleep(0.01)


def run_pair(ctl: Ctl, ep_a: str, argv_a, stdin_a, ep_b: str, argv_b, stdin_b,
             timeout: float = STEP_TIMEOUT) -> tuple[Result, Result]:
    """Run one etcdctl invocation against each server concurrently."""
    pa = ctl.start(ep_a, argv_a, stdin_a)
    pb = ctl.start(ep_b, argv_b, stdin_b)
    deadline = time.time() + timeout
    return ctl.finish(pa, stdin_a, deadline), ctl.finish(pb, stdin_b, deadline)


def wait_ready(ctl: Ctl, cluster: Cluster, deadline: float) -> str | None:
    """Poll `endpoint health` and a linearizable `get` on every member."""
    pending = list(cluster.endpoints)
    last = ""
    while pending:
        dead = cluster.dead()
        if dead:
            return dead
        ep = pending[0]
        r = ctl.run(ep, ["--command-timeout=2s", "endpoint", "health"], timeout=5)
        if r.code == 0:
            r = ctl.run(ep, ["--command-timeout=2s", "get", "/__ready_probe"], timeout=5)
        if r.code == 0:
            pending.pop(0)
            continue
        last = (r.stdout + r.stderr).strip()[-500:]
        if time.time() > deadline:
            return f"{cluster.label} not ready after {READY_TIMEOUT:.0f}s ({ep}): {last}"
        time.sleep(0.2)
    return None


# --------------------------------------------------------------------------
# Normalization
# --------------------------------------------------------------------------

_GRPC_ERR = re.compile(r'"error":"((?:[^"\\]|\\.)*)"')
_SUBS = [
    (re.compile(r'"(cluster_id|member_id|raft_term)":[1-9][0-9]*'), r'"\1":<\1>'),
    (re.compile(r'"(ClusterID|MemberID|RaftTerm)" : [1-9][0-9]*'), r'"\1" : <\1>'),
    (re.compile(r'"(lease|ID|id)":[1-9][0-9]*'), r'"\1":<LEASE?>'),
    (re.compile(r'"(Lease|ID|PrevLease)" : [1-9][0-9]*'), r'"\1" : <LEASE?>'),
    (re.compile(r'(127\.0\.0\.1|localhost):[0-9]+'), r'<ENDPOINT>'),
]
_HEXID = re.compile(r'(?<![0-9A-Za-z])[0-9a-f]{16}(?![0-9A-Za-z])')


def normalize(text: str, leases: dict[str, str], keep_grpc: bool, is_stderr: bool,
              lock_re: re.Pattern | None = None, hidden: frozenset = frozenset()) -> str:
    # lock/election keys NAME/<lease id in hex> (lock_, elect_ scenarios)
    if lock_re is not None:
        by_value = {int(h, 16): name for name, h in leases.items()}
        text = lock_re.sub(lambda m: m.group(1) + (
            f"<LEASE:{by_value[int(m.group(2), 16)]}>" if int(m.group(2), 16) in by_value
            else "<LEASE?>"), text)
    # known lease ids: every representation -> <LEASE:name>
    for name, hexid in leases.items():
        if name in hidden:
            continue
        v = int(hexid, 16)
        for rep in sorted({hexid, f"{v:016x}", f"{v:x}", str(v)}, key=len, reverse=True):
            text = re.sub(r'(?<![0-9A-Za-z])' + re.escape(rep) + r'(?![0-9A-Za-z])',
                          f"<LEASE:{name}>", text)
    out: list[str] = []
    seen_grpc: set[str] = set()
    for line in text.split("\n"):
        if line.startswith('{"level":'):
            if keep_grpc and is_stderr:
                m = _GRPC_ERR.search(line)
                if m:
                    err = json.loads('"' + m.group(1) + '"')
                    if err not in seen_grpc:
                        seen_grpc.add(err)
                        out.append(f"<grpc-error {err}>")
            continue
        for rx, rep in _SUBS:
            line = rx.sub(rep, line)
        if not line.lstrip().startswith("{"):
            line = _HEXID.sub("<HEXID>", line)
        out.append(line)
    text = "\n".join(out)
    return text if is_stderr else canon_ttl(text)


# `lease timetolive`: the remaining TTL N is time-dependent; accept any
# G-REMAINING_SLACK <= N <= G for the granted TTL G.  Attached keys come in
# whatever order the server's lease keeps them (a Go map in etcd): sorted.
REMAINING_SLACK = 60
_TTL_SIMPLE = re.compile(r'granted with TTL\((-?[0-9]+)s\), remaining\((-?[0-9]+)s\)')
_TTL_JSON = re.compile(r'"ttl":(-?[0-9]+),"granted-ttl":(-?[0-9]+)')
_TTL_FIELDS = re.compile(r'"TTL" : (-?[0-9]+)\n"GrantedTTL" : (-?[0-9]+)')
_ATTACHED = re.compile(r'attached keys\(\[([^\]\n]*)\]\)')
_JSON_KEYS = re.compile(r'"keys":\[([^\]]*)\]')


def _remaining(n: str, g: str) -> str:
    return f"<={g}" if max(0, int(g) - REMAINING_SLACK) <= int(n) <= int(g) else n


def sort_runs(text: str, pred) -> str:
    """Sort every run of consecutive lines for which pred(line) holds."""
    lines = text.split("\n")
    out: list[str] = []
    run: list[str] = []
    for line in lines + [None]:
        if line is not None and pred(line):
            run.append(line)
            continue
        out.extend(sorted(run))
        run = []
        if line is not None:
            out.append(line)
    return "\n".join(out)


def canon_ttl(text: str) -> str:
    text = _TTL_SIMPLE.sub(lambda m: f"granted with TTL({m[1]}s), "
                           f"remaining({_remaining(m[2], m[1])}s)", text)
    text = _TTL_JSON.sub(lambda m: '"ttl":' + (lambda r: r if r == m[1] else f'"{r}"')(
        _remaining(m[1], m[2])) + f',"granted-ttl":{m[2]}', text)
    text = _TTL_FIELDS.sub(lambda m: f'"TTL" : {_remaining(m[1], m[2])}\n'
                           f'"GrantedTTL" : {m[2]}', text)
    text = _ATTACHED.sub(lambda m: "attached keys([" + " ".join(sorted(m[1].split(" "))) + "])",
                         text)
    text = _JSON_KEYS.sub(lambda m: '"keys":[' + ",".join(sorted(m[1].split(","))) + "]", text)
    return sort_runs(text, lambda line: line.startswith('"Key" : '))


_LEASE_TOKEN = re.compile(r'^(<LEASE[^>]*>|<HEXID>|[0-9a-f]{1,16})$')


def canon_leases(text: str) -> str:
    """`lease list`: the order of the leases is unspecified (etcd: by expiry)."""
    text = re.sub(r'"leases":\[([^\]]*)\]',
                  lambda m: '"leases":[' + ",".join(sorted(re.findall(r'\{[^{}]*\}', m[1])))
                  + "]", text)
    text = sort_runs(text, lambda line: bool(_LEASE_TOKEN.match(line)))
    return sort_runs(text, lambda line: line.startswith('"ID" : '))


def canon_uniq(text: str) -> str:
    """Collapse runs of identical lines (repeated keep-alive renewals)."""
    lines = text.split("\n")
    return "\n".join(line for i, line in enumerate(lines) if i == 0 or line != lines[i - 1])


def auto_canon(argv: list[str]) -> str | None:
    words = [a for a in argv if not a.startswith("-")]
    if words[:2] == ["lease", "list"]:
        return "leases"
    return None


_LINE_REV = re.compile(r'^progress notify: ([0-9]+)$|"Header":\{[^{}]*"revision":([0-9]+)')


def canon_by_revision(text: str) -> str:
    """Sort lines by (revision, text); a line without a revision (progress notify
    line or json response header) belongs to the revision of the line before."""
    lines = text.split("\n")
    tail = lines.pop()
    rev = 0
    keyed = []
    for line in lines:
        m = _LINE_REV.search(line)
        if m:
            rev = int(m.group(1) or m.group(2))
        keyed.append((rev, line))
    keyed.sort()
    return "".join(line + "\n" for _, line in keyed) + tail


def render(res: Result, ctx: SideCtx, keep_grpc, canon: str | None = None) -> str:
    hidden = frozenset(ctx.hidden)
    out = normalize(res.stdout, ctx.leases, keep_grpc, False, ctx.lock_re, hidden)
    if canon == "rev":
        out = canon_by_revision(out)
    elif canon == "uniq":
        out = canon_uniq(out)
    elif canon == "leases":
        out = canon_leases(out)
    err = normalize(res.stderr, ctx.leases, keep_grpc, True, ctx.lock_re, hidden)
    return (f"exit: {res.code}\n"
            f"--- stdout\n{out}\n"
            f"--- stderr\n{err}\n")


# --------------------------------------------------------------------------
# Running scenarios
# --------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{(P|R(?:[+-][0-9]+)?|L:\w+)\}")


@dataclass
class SideCtx:
    prefix: str
    rev: int
    leases: dict[str, str] = field(default_factory=dict)
    watchers: dict[str, BgProc] = field(default_factory=dict)
    lock_keys: bool = False      # lock_/elect_ scenario: learn NAME/<lease> keys
    hidden: set[str] = field(default_factory=set)   # learned ids too short to replace anywhere
    lock_re: re.Pattern | None = None

    def __post_init__(self) -> None:
        if self.lock_keys:
            self.lock_re = re.compile("(" + re.escape(self.prefix) + r'[^\s"\[\],]*/)'
                                      r"([0-9a-f]{1,16})(?![0-9A-Za-z])")

    def learn(self, text: str) -> None:
        """Name the lease ids of lock/election keys {P}.../<hex> K1, K2, ... in order
        of first appearance, so that they normalize to <LEASE:Kn> (and {L:Kn} works).
        Ids below 2^32 are only replaced inside such keys (their decimal form could
        be anything, e.g. a revision)."""
        if self.lock_re is None:
            return
        known = {int(h, 16) for h in self.leases.values()}
        for m in self.lock_re.finditer(text):
            v = int(m.group(2), 16)
            if v in known or v == 0:
                continue
            known.add(v)
            name = f"K{1 + sum(1 for n in self.leases if re.fullmatch(r'K[0-9]+', n))}"
            self.leases[name] = f"{v:016x}"
            if v < 1 << 32:
                self.hidden.add(name)

    def subst(self, s: str) -> str:
        def rep(m: re.Match) -> str:
            tok = m.group(1)
            if tok == "P":
                return self.prefix
            if tok.startswith("R"):
                return str(self.rev + int(tok[1:] or 0))
            name = tok[2:]
            return self.leases.get(name, f"<no-lease-{name}>")
        return _PLACEHOLDER.sub(rep, s)


def current_revision(ctl: Ctl, ep: str) -> int | None:
    r = ctl.run(ep, ["get", "/__rev_probe", "-w", "json"])
    if r.code != 0:
        return None
    try:
        return int(json.loads(r.stdout.strip().splitlines()[-1])["header"]["revision"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


class Runner:
    def __init__(self, ctl: Ctl, ref: Cluster, test: Cluster, keep_grpc: bool, verbose: bool):
        self.ctl = ctl
        self.ref = ref
        self.test = test
        self.keep_grpc = keep_grpc
        self.verbose = verbose
        self.rr = 0                     # round-robin counter over test members
        self.last_lin = 0               # member of the last non-serializable step
        self.watch_member: int | None = None   # member of this scenario's watchers
        self.test_late = False          # a test watcher missed a deadline in this scenario
        self.pads = 0
        self.unresponsive = 0           # consecutive steps the server under test timed out
        self.aborted: str | None = None

    def revisions(self) -> tuple[int | None, int | None]:
        return (current_revision(self.ctl, self.ref.endpoints[0]),
                current_revision(self.ctl, self.test.endpoints[self.last_lin]))

    def resync(self, ref_rev: int | None, test_rev: int | None) -> None:
        """Pad the lagging server with dummy puts so revisions line up again."""
        if ref_rev is None or test_rev is None or ref_rev == test_rev:
            return
        lag_ep = self.ref.endpoints[0] if ref_rev < test_rev else self.test.endpoints[0]
        for _ in range(min(abs(ref_rev - test_rev), 10000)):
            self.pads += 1
            if self.ctl.run(lag_ep, ["put", "/__pad", str(self.pads)]).code != 0:
                return

    def pick_member(self, step: Step) -> int:
        n = self.test.n
        if step.kind != "run" or step.command == "watch":
            # watches go to a member that the scenario's writes avoid
            if self.watch_member is None:
                self.watch_member = (self.last_lin + 1) % n
            if step.kind == "run":      # a watch that ends by itself: next member
                self.watch_member = (self.last_lin + 1) % n
            return self.watch_member
        serializable = "--consistency=s" in step.argv or any(
            a == "--consistency" and b == "s" for a, b in zip(step.argv, step.argv[1:]))
        if serializable:
            return self.last_lin
        member = self.rr % n
        self.rr += 1
        if n > 1 and member == self.watch_member:
            member = self.rr % n
            self.rr += 1
        self.last_lin = member
        return member

    def sync_member(self, member: int) -> None:
        """Linearizable read on a test member, so that it has applied every earlier
        write before a watch/progress request is sent to it."""
        if self.test.n > 1:
            self.ctl.run(self.test.endpoints[member], ["get", "/__sync_probe"])

    def stop_watchers(self, *ctxs: SideCtx) -> None:
        for ctx in ctxs:
            for bp in ctx.watchers.values():
                bp.stop(eof=False)
            ctx.watchers.clear()

    def run(self, sc: Scenario, start: tuple[int | None, int | None]) -> tuple[bool, str, tuple]:
        ref_rev, test_rev = start
        if ref_rev is None or test_rev is None:
            return False, f"  cannot read current revision (reference: {ref_rev}, under test: {test_rev})", \
                self.revisions()
        lock_keys = sc.name.startswith(("lock_", "elect_"))
        ctx_ref = SideCtx(sc.prefix, ref_rev, lock_keys=lock_keys)
        ctx_test = SideCtx(sc.prefix, test_rev, lock_keys=lock_keys)
        self.watch_member = None
        self.test_late = False
        try:
            return self._run(sc, ctx_ref, ctx_test)
        finally:
            self.stop_watchers(ctx_ref, ctx_test)
            self.watch_member = None

    def _run(self, sc: Scenario, ctx_ref: SideCtx, ctx_test: SideCtx) -> tuple[bool, str, tuple]:
        failure = ""
        for i, step in enumerate(sc.steps, 1):
            member = self.pick_member(step)
            argv_ref = [ctx_ref.subst(a) for a in step.argv]
            argv_test = [ctx_test.subst(a) for a in step.argv]
            stdin_ref = ctx_ref.subst(step.stdin) if step.stdin is not None else None
            stdin_test = ctx_test.subst(step.stdin) if step.stdin is not None else None
            canon = auto_canon(step.argv)
            if step.kind != "run":
                r_ref, r_test, shown = self.bg_step(sc, step, member, ctx_ref, ctx_test,
                                                    argv_ref, argv_test, stdin_ref, stdin_test)
                if r_ref is None:
                    continue
                stdin_ref = None
                canon = step.canon
            else:
                if step.command == "watch":
                    self.sync_member(member)
                r_ref, r_test = run_pair(self.ctl, self.ref.endpoints[0], argv_ref, stdin_ref,
                                         self.test.endpoints[member], argv_test, stdin_test,
                                         step.timeout)
                shown = "etcdctl " + " ".join(shlex.quote(x) for x in argv_ref)
                if step.capture:
                    for ctx, r in ((ctx_ref, r_ref), (ctx_test, r_test)):
                        m = re.search(r"lease ([0-9a-f]+) granted", r.stdout)
                        if m:
                            ctx.leases[step.capture] = m.group(1)
                        else:
                            m = re.search(r'"ID" ?: ?([0-9]+)', r.stdout)
                            if m:
                                ctx.leases[step.capture] = f"{int(m.group(1)):016x}"
                ctx_ref.learn(r_ref.stdout)
                ctx_test.learn(r_test.stdout)
                if r_test.code == "TIMEOUT" or "context deadline exceeded" in r_test.stderr:
                    self.unresponsive += 1
                else:
                    self.unresponsive = 0
            a = render(r_ref, ctx_ref, self.keep_grpc, canon)
            b = render(r_test, ctx_test, self.keep_grpc, canon)
            if self.verbose:
                print(f"  [{sc.name} {i}] {shown}" +
                      (f"  <<< {stdin_ref!r}" if stdin_ref is not None else ""))
                print("    " + a.rstrip("\n").replace("\n", "\n    "))
            if a != b and not failure:
                where = f" on member {member}" if self.test.n > 1 else ""
                diff = difflib.unified_diff(a.splitlines(), b.splitlines(),
                                            "reference etcd", "server under test", lineterm="")
                failure = (f"  step {i}/{len(sc.steps)}{where}: {shown}"
                           + (f"\n  stdin: {stdin_ref!r}" if stdin_ref is not None else "")
                           + "\n" + "\n".join("  " + line for line in diff))
            if self.unresponsive >= 5:
                self.aborted = "server under test unresponsive (5 timed-out steps in a row)"
                failure += f"\n  !!! {self.aborted}"
                return False, failure, (None, None)
        self.stop_watchers(ctx_ref, ctx_test)
        end = self.revisions()
        if not failure and end[0] != end[1]:
            failure = (f"  revision after scenario differs: reference {end[0]}, "
                       f"under test {end[1]}")
        if end[0] != end[1]:
            self.resync(*end)
            end = self.revisions()
        return not failure, failure, end

    def bg_step(self, sc: Scenario, step: Step, member: int, ctx_ref: SideCtx, ctx_test: SideCtx,
                argv_ref, argv_test, stdin_ref, stdin_test):
        """Run a bg/wait/send/stop step on both sides.  Returns (None, None, shown)
        for steps that are not compared, else the two results of a stopped watcher."""
        name = step.name
        label = f"[{sc.name}] watcher {name!r}"
        if step.kind == "bg":
            assert name not in ctx_ref.watchers, f"{label} started twice"
            self.sync_member(member)
            ctx_ref.watchers[name] = BgProc(self.ctl, self.ref.endpoints[0], argv_ref, stdin_ref)
            ctx_test.watchers[name] = BgProc(self.ctl, self.test.endpoints[member], argv_test,
                                             stdin_test)
            shown = "etcdctl " + " ".join(shlex.quote(x) for x in argv_ref)
            if self.verbose:
                print(f"  [{sc.name}] start watcher {name!r}: {shown}" +
                      (f"  <<< {stdin_ref!r}" if stdin_ref is not None else ""))
            return None, None, shown
        bp_ref, bp_test = ctx_ref.watchers[name], ctx_test.watchers[name]
        shown = "etcdctl " + " ".join(shlex.quote(x) for x in bp_ref.argv)
        if step.kind == "send":
            self.sync_member(member)
            bp_ref.send(stdin_ref)
            bp_test.send(stdin_test)
            if self.verbose:
                print(f"  [{sc.name}] watcher {name!r} <<< {stdin_ref!r}")
            return None, None, shown
        if step.kind == "peek":
            time.sleep(STOP_SETTLE)
            r_ref, r_test = bp_ref.peek(), bp_test.peek()
            ctx_ref.learn(r_ref.stdout)
            ctx_test.learn(r_test.stdout)
            return r_ref, r_test, f"{shown}  (background, output so far)"
        ok_ref, ok_test = wait_lines(bp_ref, bp_test, step.lines, self.test_late)
        ctx_ref.learn(bp_ref.peek().stdout)
        ctx_test.learn(bp_test.peek().stdout)
        if not ok_test:
            self.test_late = True
        if not ok_ref:
            expected = "to exit" if step.lines < 0 else f"{step.lines} lines"
            print(f"# warning: {label} of the reference etcd printed {bp_ref.lines()} "
                  f"lines, expected {expected} (etcdctl {self.ctl.version})", file=sys.stderr)
        if step.kind == "wait":
            if self.verbose:
                print(f"  [{sc.name}] watcher {name!r}: {bp_ref.lines()}/{step.lines} lines")
            return None, None, shown
        if step.lines >= 0:
            time.sleep(STOP_SETTLE)
        r_ref, r_test = bp_ref.stop(step.eof), bp_test.stop(step.eof)
        ctx_ref.learn(r_ref.stdout)
        ctx_test.learn(r_test.stdout)
        del ctx_ref.watchers[name], ctx_test.watchers[name]
        how = "EOF on stdin" if step.eof else "SIGTERM"
        if step.lines < 0:
            return r_ref, r_test, f"{shown}  (background, exits by itself)"
        return r_ref, r_test, f"{shown}  (background, {how} after {step.lines} stdout lines)"


def run_with_ctl(ctl: Ctl, args, scenarios: list[Scenario]) -> tuple[int, int]:
    tag = f"(etcdctl {ctl.version})"
    workdir = tempfile.mkdtemp(prefix="difftest-")
    _TMPDIRS.append(workdir)
    passed = failed = 0
    t0 = time.time()
    ref = test = None
    try:
        for attempt in range(1, 4):
            sub = os.path.join(workdir, f"try{attempt}")
            os.makedirs(sub)
            ref = Cluster("ref", os.path.join(args.etcd_dir, "etcd"), 1, sub)
            test = Cluster("test", args.server, args.cluster, sub)
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
        if not _KEEP:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"# etcdctl {ctl.version} ({ctl.path}): {passed} passed, {failed} failed "
          f"in {time.time() - t0:.1f}s", file=sys.stderr)
    return passed, failed


def main() -> int:
    global _KEEP
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
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (data, logs)")
    ap.add_argument("--list", action="store_true", help="list scenario names and exit")
    args = ap.parse_args()
    _KEEP = args.keep
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

    total_pass = total_fail = 0
    try:
        for path in ctl_paths:
            p, f = run_with_ctl(Ctl(path), args, scenarios)
            total_pass += p
            total_fail += f
    finally:
        _cleanup()
    print(f"{total_pass} passed, {total_fail} failed")
    return 1 if total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
