"""Running scenarios: current_revision and Runner (one scenario on both servers)."""

from __future__ import annotations

import difflib
import json
import re
import shlex
import sys
import time

from .ctl import BgProc, Ctl, run_pair, wait_lines
from .dsl import STOP_SETTLE, Scenario, Step
from .normalize import SideCtx, auto_canon, render
from .procs import Cluster

# --------------------------------------------------------------------------
# Running scenarios
# --------------------------------------------------------------------------

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
