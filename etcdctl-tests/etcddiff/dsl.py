"""Scenario DSL: timeouts, Step, Scenario, the SCENARIOS registry and step builders."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

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
