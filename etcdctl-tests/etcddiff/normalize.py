"""Output normalization and canonicalisation, render, and SideCtx (per-server state)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from .ctl import BgProc, Result

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
# Per-server scenario state
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
