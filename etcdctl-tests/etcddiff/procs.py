"""Process and temp dir bookkeeping (cleanup at exit), free ports, and Cluster."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import time

# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------

_PROCS: list[subprocess.Popen] = []
_TMPDIRS: list[str] = []
KEEP = False                # --keep: leave the temp dirs; set by difftest.main


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
    if not KEEP:
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

    def __init__(self, label: str, binary: str, members: int, workdir: str,
                 scheme: str = "http", flags: list[str] | None = None):
        self.label = label
        self.binary = binary
        self.n = members
        self.workdir = workdir
        self.scheme = scheme            # of the client and peer URLs (https: --tls)
        self.flags = list(flags or [])  # extra server flags (TLS)
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []
        ports = free_ports(2 * members)
        self.client_ports = ports[:members]
        self.peer_ports = ports[members:]
        self.names = [f"{label}{i}" for i in range(members)]
        self.endpoints = [f"{scheme}://127.0.0.1:{p}" for p in self.client_ports]

    def peer_url(self, i: int) -> str:
        return f"{self.scheme}://127.0.0.1:{self.peer_ports[i]}"

    def start(self) -> None:
        initial = ",".join(f"{nm}={self.peer_url(i)}" for i, nm in enumerate(self.names))
        for i in range(self.n):
            ddir = os.path.join(self.workdir, f"{self.names[i]}.data")
            log = os.path.join(self.workdir, f"{self.names[i]}.log")
            self.logs.append(log)
            argv = [self.binary,
                    "--name", self.names[i],
                    "--data-dir", ddir,
                    "--listen-client-urls", self.endpoints[i],
                    "--advertise-client-urls", self.endpoints[i],
                    "--listen-peer-urls", self.peer_url(i),
                    "--initial-advertise-peer-urls", self.peer_url(i),
                    "--initial-cluster", initial,
                    "--initial-cluster-state", "new",
                    "--initial-cluster-token", f"difftest-{self.label}",
                    *self.flags]
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
