"""etcdctl invocation: Result, Ctl, BgProc (background watchers), run_pair, wait_ready."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from .dsl import READY_TIMEOUT, STEP_TIMEOUT, WAIT_GRACE, WAIT_GRACE_LATE, WAIT_TIMEOUT
from .procs import _PROCS, Cluster


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
        self.flags: list[str] = []      # global flags for every invocation (TLS)

    def has_flag(self, flag: str) -> bool:
        """Whether `etcdctl --help` lists the global flag (e.g. --insecure-skip-tls-verify)."""
        r = subprocess.run([self.path, "--help"], env=self.env, capture_output=True, text=True,
                           timeout=STEP_TIMEOUT)
        return re.search(re.escape(flag) + r"\b", r.stdout + r.stderr) is not None

    def start(self, endpoint: str, argv: list[str], stdin: str | None) -> subprocess.Popen:
        return subprocess.Popen([self.path, f"--endpoints={endpoint}", *self.flags, *argv],
                                env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
