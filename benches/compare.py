#!/usr/bin/env python3
"""Concord against reference etcd 3.5.1 (and etcd 3.6), side by side on this machine, with concord-bench.

For each topology (one node; three nodes on loopback), each client count and each workload,
fresh clusters of every server are started with the same flags and fresh data dirs on disk, and
the workload runs on them alternately (etcd, Concord, etcd, Concord, ...: `--rounds` rounds) so
that the machine's drift hits all alike. The table shows the medians, the ratios Concord/etcd,
each server's CPU time per operation (from /proc, over the run) and the load generator's own
CPU per operation against each; a second table turns them into a CPU budget (how busy each run
kept the machine, and the ratio the CPU per operation allows when both runs use every CPU: on
a machine the generator shares, its CPU is in both). Then, at a fixed offered
load (half of etcd 3.5.1's measured throughput at the last client count), the p99 latency of
each. Then, unless `--memory-keys 0`: resident memory after loading that many 256-byte keys,
the size on disk, and the time to restart a member holding them until it serves a
linearizable read (`/health`).

Client counts (`--clients 1,16,64`) come with their connections: one client over one
connection, 16 over 4, 64 (and more) over 8. `put` overwrites keys of a 10,000-key space;
`put-new` draws keys from a billion, so nearly every put creates its key. `watch` is one writer
and `--watchers` watchers of one prefix (every event to every watcher); `watch-keys` gives each
watcher a key of its own and has every client put to random watchers' keys (every event to one
watcher).
`--etcd36-dir DIR` adds etcd 3.6 (the version Kubernetes ships), built by
`benches/etcd36/build.sh`.

Usage:
  benches/compare.py [--etcd-dir DIR] [--etcd36-dir DIR] [--concord BIN] [--bench BIN]
                     [--duration 10s] [--rounds 2] [--clients 1,16,64] [--topologies 1,3]
                     [--workloads put,put-new,range,...] [--no-fixed]
                     [--memory-keys 1000000] [--markdown FILE] [--smoke]

`--keep-servers` runs everything against one cluster per server and topology, so that the state
grows from run to run as in a server that has been up for a while (the LSM's flushes and
compactions, bbolt's growing file); by default every run gets fresh clusters.

Both servers fsync every acknowledged write on a quorum (neither is given a flag that weakens
that). --smoke: one short round of a few workloads on one node, to check that the tools work.
--tls: both servers serve clients and peers over TLS with client-certificate auth (kubeadm's
setup: a CA, server and peer certificates, a client certificate; made here with openssl), and
concord-bench connects with the client certificate.
--auth: both servers with auth on (root, and a user with READWRITE on the bench's key prefix);
concord-bench logs in as that user and sends the token with every request.
--pin SERVER_CPUS:BENCH_CPUS (e.g. `0:1`): every server process runs on the first CPU list and
concord-bench on the second (`taskset -c`), so the load generator takes none of the servers'
CPU time; each server sizes its threads to what it is given (Go's GOMAXPROCS, tokio's workers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import ssl
import time
import urllib.request

# Set by --tls: {"dir": ..., "ca": ..., "cert": ..., "key": ...}
TLS: dict[str, str] = {}
# With --pin: the CPU lists ("server", "bench") the servers and the load generator run on.
PIN: dict[str, str] = {}


def pinned(role: str) -> list[str]:
    """The `taskset` prefix of `role`'s commands, or nothing when not pinned."""
    return ["taskset", "-c", PIN[role]] if role in PIN else []


def make_certs(root: str) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 (serverAuth and clientAuth, used for peers too)
    and a client certificate, as kubeadm makes them."""
    d = tempfile.mkdtemp(prefix="bench-pki-", dir=root)

    def run(*cmd: str) -> None:
        subprocess.run(cmd, cwd=d, check=True, capture_output=True)

    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
        "-out", "ca.crt", "-days", "2", "-subj", "/CN=bench-ca")
    for name, cn, eku in (("server", "node", "serverAuth,clientAuth"),
                          ("client", "root", "clientAuth")):
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage={eku}\n")
        run("openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return {"dir": d, "ca": os.path.join(d, "ca.crt"), "cert": os.path.join(d, "client.crt"),
            "key": os.path.join(d, "client.key"), "server": os.path.join(d, "server")}

ALL_WORKLOADS = ["put", "put-new", "range", "range-ser", "range-prefix", "txn-cas", "mixed", "lease",
                 "lease-keepalive", "lock", "lock-contended", "watch", "watch-keys"]


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class Cluster:
    """n members of one binary, data under `root`."""

    def __init__(self, binary: str, n: int, root: str, label: str):
        self.binary, self.n, self.label = binary, n, label
        self.dir = tempfile.mkdtemp(prefix=f"{label}-", dir=root)
        ports = free_ports(2 * n)
        scheme = "https" if TLS else "http"
        self.client = [f"{scheme}://127.0.0.1:{p}" for p in ports[:n]]
        self.peer = [f"{scheme}://127.0.0.1:{p}" for p in ports[n:]]
        self.procs: list[subprocess.Popen | None] = [None] * n

    def argv(self, i: int) -> list[str]:
        initial = ",".join(f"m{j}={u}" for j, u in enumerate(self.peer))
        return [*pinned("server"), self.binary, "--name", f"m{i}", "--data-dir", os.path.join(self.dir, f"m{i}"),
                "--listen-client-urls", self.client[i], "--advertise-client-urls", self.client[i],
                "--listen-peer-urls", self.peer[i], "--initial-advertise-peer-urls", self.peer[i],
                "--initial-cluster", initial, "--log-level", "error", *tls_flags()]

    def start(self, i: int | None = None) -> None:
        for j in ([i] if i is not None else range(self.n)):
            self.procs[j] = subprocess.Popen(self.argv(j), stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True)

    def healthy(self, i: int) -> bool:
        ctx = None
        if TLS:
            ctx = ssl.create_default_context(cafile=TLS["ca"])
            ctx.load_cert_chain(TLS["cert"], TLS["key"])
        try:
            with urllib.request.urlopen(self.client[i] + "/health", timeout=2, context=ctx) as r:
                return r.status == 200 and b'"true"' in r.read()
        except Exception:
            return False

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if all(self.healthy(i) for i in range(self.n)):
                return
            time.sleep(0.1)
        raise SystemExit(f"{self.label}: not healthy in {timeout}s")

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    def stop(self, i: int | None = None) -> None:
        for j in ([i] if i is not None else range(self.n)):
            p = self.procs[j]
            if p is None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            self.procs[j] = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def tls_flags() -> list[str]:
    """The same TLS flags for etcd and Concord: clients and peers verified by the CA."""
    if not TLS:
        return []
    srv = TLS["server"]
    return [f"--cert-file={srv}.crt", f"--key-file={srv}.key", f"--trusted-ca-file={TLS['ca']}",
            "--client-cert-auth=true", f"--peer-cert-file={srv}.crt", f"--peer-key-file={srv}.key",
            f"--peer-trusted-ca-file={TLS['ca']}", "--peer-client-cert-auth=true"]


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def bench(args, cluster: Cluster, workload: str, extra: list[str]) -> dict:
    flags = []
    if workload == "range-ser":
        workload, flags = "range", ["--serializable"]
    if workload == "put-new":
        # Keys drawn from a billion: nearly every put creates its key.
        workload, flags = "put", ["--key-space", "1000000000"]
    cmd = [*pinned("bench"), args.bench, workload, "--endpoints", ",".join(cluster.client), "--json",
           "--duration", args.duration, "--server-pids", ",".join(map(str, cluster.pids())), *flags, *extra]
    if workload in ("watch", "watch-keys"):
        cmd += ["--watchers", str(args.watchers)]
    if TLS:
        cmd += ["--cacert", TLS["ca"], "--cert", TLS["cert"], "--key", TLS["key"]]
    if args.plain:
        cmd += ["--plain"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"concord-bench failed: {' '.join(cmd)}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# The user --auth benchmarks as: READWRITE on the prefix the workloads use.
AUTH_USER = "bench:benchpw"


def enable_auth(args, cluster: Cluster) -> None:
    """root, and user `bench` with READWRITE on `bench/`, then auth on (with etcdctl 3.5.1)."""
    ctl = [os.path.join(args.etcd_dir, "etcdctl"), "--endpoints", cluster.client[0]]
    for cmd in (["user", "add", "root:rootpw"], ["user", "add", AUTH_USER],
                ["role", "add", "bench"],
                ["role", "grant-permission", "bench", "readwrite", "bench/", "--prefix"],
                ["user", "grant-role", "bench", "bench"], ["auth", "enable"]):
        subprocess.run(ctl + cmd, check=True, capture_output=True, timeout=60)


# With --keep-servers: the running cluster of each (binary, size), reused by every run.
KEPT: dict[tuple[str, int], Cluster] = {}


def one_run(args, binary: str, label: str, n: int, workload: str, extra: list[str]) -> dict:
    kept = KEPT.get((binary, n))
    if args.keep_servers and kept is not None:
        if args.auth:
            extra = [*extra, "--user", AUTH_USER]
        return bench(args, kept, workload, extra)
    c = Cluster(binary, n, args.root, label)
    try:
        c.start()
        c.wait_ready()
        if args.auth:
            enable_auth(args, c)
            extra = [*extra, "--user", AUTH_USER]
        if args.keep_servers:
            KEPT[(binary, n)] = c
        return bench(args, c, workload, extra)
    finally:
        if not args.keep_servers:
            c.remove()


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def conns_for(clients: int) -> int:
    """Connections for a number of clients: 1 for 1, 4 for 16, 8 for 64 and more."""
    return 1 if clients <= 1 else min(8, max(1, clients // 4))


CPUS = os.cpu_count() or 1


def cpus_in(cpu_list: str) -> int:
    """How many CPUs a `taskset -c` list names ("0", "0-3", "0,2")."""
    n = 0
    for part in cpu_list.split(","):
        low, _, high = part.partition("-")
        n += int(high or low) - int(low) + 1
    return n


def cpu_budget(w: str, clients: int, conns: int, servers, refs, med: dict) -> str:
    """One row of the CPU budget: how busy each run kept the machine's CPUs (server and load
    generator together) and the throughput ratio to each reference that the CPU per operation
    allows when both use every CPU. A run well below 100 % busy waited on something else (the
    disk's fsync, one writer)."""
    total = {label: med[label]["cpu_us"] + med[label]["client_us"] for label, _ in servers}
    if PIN:
        # Pinned: how busy each side kept its own CPUs, server + generator.
        def side(label: str, key: str, role: str) -> str:
            return f"{med[label]['ops_per_sec'] * med[label][key] / 1e6 / cpus_in(PIN[role]) * 100:.0f}"
        busy = [f"{side(label, 'cpu_us', 'server')}+{side(label, 'client_us', 'bench')}"
                for label, _ in servers]
    else:
        busy = [f"{med[label]['ops_per_sec'] * total[label] / 1e6 / CPUS * 100:.0f}" for label, _ in servers]
    cells = [w, f"{clients}/{conns}", " / ".join(busy) + " %",
             " / ".join(f"{total[label]:.1f}" for label, _ in servers)]
    cells += [ratio(total[r], total["concord"]) for r in refs]
    return "| " + " | ".join(cells) + " |"


def medians(runs: list[dict]) -> dict:
    """Medians of ops/s, p50, p99, peak RSS and server CPU per operation (µs) over runs."""
    m = {k: statistics.median(r[k] for r in runs)
         for k in ("ops_per_sec", "p50_ms", "p99_ms", "server_peak_rss_bytes")}
    m["cpu_us"] = statistics.median(r["server_cpu_seconds"] / r["ops"] * 1e6 if r["ops"] else 0
                                    for r in runs)
    # The load generator's own CPU per operation (it shares the machine's cores with the server).
    m["client_us"] = statistics.median((r.get("client_cpu_seconds") or 0) / r["ops"] * 1e6
                                       if r["ops"] else 0 for r in runs)
    return m


# How each server is named in the tables.
NAMES = {"etcd": "etcd 3.5.1", "etcd36": "etcd 3.6", "concord": "Concord"}


def servers_of(args) -> tuple[list[tuple[str, str]], list[str]]:
    """The servers compared, (label, binary), Concord last; and the labels of the references."""
    servers = [("etcd", args.etcd)] + ([("etcd36", args.etcd36)] if args.etcd36 else []) + \
        [("concord", args.concord)]
    return servers, [label for label, _ in servers[:-1]]


def compare(args, out: list[str]) -> None:
    servers, refs = servers_of(args)
    for n in args.topologies:
        out.append(f"\n### {n} node{'s' if n > 1 else ''}: throughput (median of {args.rounds})\n")
        head = ["workload", "clients/conns"]
        head += [f"{NAMES[label]} ops/s" for label, _ in servers]
        head += [f"ratio to {NAMES[r]}" for r in refs]
        head += [f"{NAMES[label]} p99 ms" for label, _ in servers]
        head += [f"{NAMES[label]} CPU µs/op" for label, _ in servers]
        head += [f"CPU ratio to {NAMES[r]}" for r in refs]
        head += [f"load generator CPU µs/op vs {NAMES[label]}" for label, _ in servers]
        head += ["Concord peak RSS MiB"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        saturation = {}
        p50s: list[str] = []
        budget: list[str] = []
        for clients in args.clients:
            conns = conns_for(clients)
            for w in args.workloads:
                runs: dict[str, list[dict]] = {label: [] for label, _ in servers}
                for _ in range(args.rounds):
                    for label, binary in servers:
                        runs[label].append(one_run(args, binary, label, n, w,
                                                   ["--clients", str(clients), "--conns", str(conns)]))
                med = {label: medians(v) for label, v in runs.items()}
                saturation[(clients, w)] = med["etcd"]["ops_per_sec"]
                c = med["concord"]
                cells = [w, f"{clients}/{conns}"]
                cells += [f"{med[label]['ops_per_sec']:.0f}" for label, _ in servers]
                cells += [ratio(c["ops_per_sec"], med[r]["ops_per_sec"]) for r in refs]
                cells += [f"{med[label]['p99_ms']:.2f}" for label, _ in servers]
                cells += [f"{med[label]['cpu_us']:.1f}" for label, _ in servers]
                cells += [ratio(c["cpu_us"], med[r]["cpu_us"]) for r in refs]
                cells += [f"{med[label]['client_us']:.1f}" for label, _ in servers]
                cells += [f"{c['server_peak_rss_bytes'] / 2**20:.0f}"]
                line = "| " + " | ".join(cells) + " |"
                out.append(line)
                print(line, flush=True)
                budget.append(cpu_budget(w, clients, conns, servers, refs, med))
                if clients == 1:
                    p50s.append(f"- {w}, one client: p50 " + ", ".join(
                        f"{NAMES[label]} {med[label]['p50_ms']:.3f} ms" for label, _ in servers))
        if p50s:
            out.append("\n" + "\n".join(p50s))
            print("\n".join(p50s), flush=True)
        out.append(f"\n### {n} node{'s' if n > 1 else ''}: the same runs as a CPU budget\n")
        if PIN:
            out.append(f"Pinned: busy is server + generator, each over its own CPUs "
                       f"({PIN['server']} and {PIN['bench']}); a server near 100 % is the "
                       "bound. The ceiling column still adds the two CPU costs.\n")
        else:
            out.append(f"Machine CPU busy: ops/s x (server + load generator CPU per op) / {CPUS} CPUs. "
                       "CPU-bound ceiling: a reference's server + generator CPU per op over "
                       "Concord's, the ratio two runs would give that both used every CPU.\n")
        head = ["workload", "clients/conns", "machine CPU busy " + " / ".join(NAMES[l] for l, _ in servers),
                "server + generator µs/op " + " / ".join(NAMES[l] for l, _ in servers)]
        head += [f"CPU-bound ceiling vs {NAMES[r]}" for r in refs]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        out.extend(budget)
        fixed = [w for w in ("put", "range", "txn-cas", "mixed", "watch") if w in args.workloads]
        clients = args.clients[-1]
        if not fixed or args.no_fixed:
            continue
        out.append(f"\n### {n} node{'s' if n > 1 else ''}: p99 at a fixed offered load (half of etcd 3.5.1's throughput, {clients} clients)\n")
        out.append("| workload | offered ops/s | " + " | ".join(f"{NAMES[label]} p99 ms" for label, _ in servers)
                   + " | " + " | ".join(f"ratio to {NAMES[r]}" for r in refs) + " |")
        out.append("|" + "---|" * (2 + len(servers) + len(refs)))
        for w in fixed:
            # watch: --rate paces the one writer's puts, and each put is one event per watcher
            per_op = args.watchers if w == "watch" else 1
            rate = max(1, int(saturation[(clients, w)] / 2 / per_op))
            runs = {label: [] for label, _ in servers}
            for _ in range(args.rounds):
                for label, binary in servers:
                    runs[label].append(one_run(args, binary, label, n, w, [
                        "--rate", str(rate), "--clients", str(clients), "--conns", str(conns_for(clients))]))
            p99 = {label: statistics.median(r["p99_ms"] for r in v) for label, v in runs.items()}
            line = (f"| {w} | {rate * per_op} | " + " | ".join(f"{p99[label]:.2f}" for label, _ in servers)
                    + " | " + " | ".join(ratio(p99["concord"], p99[r]) for r in refs) + " |")
            out.append(line)
            print(line, flush=True)


def memory(args, out: list[str]) -> None:
    keys = args.memory_keys
    servers, refs = servers_of(args)
    out.append(f"\n### One node holding {keys} keys of 256 B\n")
    out.append("| | " + " | ".join(NAMES[label] for label, _ in servers) + " | "
               + " | ".join(f"ratio to {NAMES[r]}" for r in refs) + " |")
    out.append("|---|" + "---|" * (len(servers) + len(refs)))
    results = {}
    for label, binary in servers:
        c = Cluster(binary, 1, args.root, label)
        try:
            c.start()
            c.wait_ready()
            subprocess.run([args.bench, "load", "--endpoints", c.client[0], "--key-space", str(keys),
                            "--clients", "128", "--conns", "8", "--json"], check=True,
                           capture_output=True, timeout=3600)
            time.sleep(2)
            resident = rss(c.pids()[0])
            c.stop()
            disk = du(c.dir)
            started = time.time()
            c.start()
            c.wait_ready(timeout=600)
            restart = time.time() - started
            results[label] = (resident, disk, restart)
        finally:
            c.remove()
    for i, (name, fmt) in enumerate([("resident memory MiB", lambda v: f"{v / 2**20:.0f}"),
                                     ("on disk MiB", lambda v: f"{v / 2**20:.0f}"),
                                     ("restart to serving s", lambda v: f"{v:.2f}")]):
        mine = results["concord"][i]
        line = (f"| {name} | " + " | ".join(fmt(results[label][i]) for label, _ in servers) + " | "
                + " | ".join(ratio(mine, results[r][i]) for r in refs) + " |")
        out.append(line)
        print(line, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--etcd-dir", default=os.path.join(root, ".etcd-ref/bin/etcd-ref"))
    ap.add_argument("--concord", default=os.path.join(root, "target/release/concord"))
    ap.add_argument("--bench", default=os.path.join(root, "target/release/concord-bench"))
    ap.add_argument("--duration", default="10s")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", default="64",
                    help="client counts, comma-separated (connections: 1 for 1, 4 for 16, 8 for 64)")
    ap.add_argument("--etcd36-dir", help="also etcd 3.6 from this dir (benches/etcd36/build.sh)")
    ap.add_argument("--plain", action="store_true",
                    help="concord-bench connects as an ordinary tonic client (see its --plain)")
    ap.add_argument("--keep-servers", action="store_true",
                    help="one cluster per server and topology for all runs: the state grows "
                         "from run to run, as in a server that has been up for a while")
    ap.add_argument("--no-fixed", action="store_true", help="skip the fixed-load p99 tables")
    ap.add_argument("--watchers", type=int, default=1000)
    ap.add_argument("--topologies", default="1,3")
    ap.add_argument("--workloads", default=None,
                    help=f"comma-separated (default all: {','.join(ALL_WORKLOADS)}; --smoke: a few)")
    ap.add_argument("--memory-keys", type=int, default=1_000_000)
    ap.add_argument("--memory-only", action="store_true", help="only the memory/disk/restart table")
    ap.add_argument("--markdown")
    ap.add_argument("--root", default=os.environ.get("BENCH_DIR", "/tmp"),
                    help="where the data dirs go (a real disk)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--tls", action="store_true", help="clients and peers over TLS (both servers)")
    ap.add_argument("--auth", action="store_true",
                    help="auth on (both servers): the bench logs in as a user with READWRITE on "
                         "its key prefix and every request carries the token")
    ap.add_argument("--pin", metavar="SERVER_CPUS:BENCH_CPUS",
                    help="run the servers on one set of CPUs and concord-bench on another, e.g. 0:1")
    args = ap.parse_args()
    if args.pin:
        server_cpus, _, bench_cpus = args.pin.partition(":")
        if not server_cpus or not bench_cpus:
            raise SystemExit("--pin wants SERVER_CPUS:BENCH_CPUS, e.g. 0:1")
        PIN.update(server=server_cpus, bench=bench_cpus)
    if args.auth and args.tls:
        raise SystemExit("--auth and --tls: one at a time")
    if args.tls:
        TLS.update(make_certs(args.root))
    if args.smoke:
        args.duration, args.rounds, args.topologies = "1s", 1, "1"
        args.workloads = args.workloads or "put,range,txn-cas,lock,watch"
        args.memory_keys, args.watchers = 0, 10
    args.etcd = os.path.join(args.etcd_dir, "etcd")
    args.etcd36 = os.path.join(args.etcd36_dir, "etcd") if args.etcd36_dir else None
    args.clients = [int(c) for c in args.clients.split(",")]
    args.topologies = [int(t) for t in args.topologies.split(",")]
    args.workloads = (args.workloads or ",".join(ALL_WORKLOADS)).split(",")
    pin_note = (f"; servers pinned to CPUs {PIN['server']}, concord-bench to CPUs {PIN['bench']}"
                if PIN else "")
    out = [f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}; "
           f"data on {args.root}; clients/connections {', '.join(f'{c}/{conns_for(c)}' for c in args.clients)}, "
           f"{args.duration} per run after 1 s warm-up; 256 B values"
           f"{'; TLS for clients and peers, client certificates required' if args.tls else ''}"
           f"{'; auth on, a user with READWRITE on the bench prefix, a token on every request' if args.auth else ''}"
           f"{pin_note}"
           f"{'; servers kept running across all runs (state growing)' if args.keep_servers else ''}"
           f"{'; plain tonic client connections (END_STREAM in a frame of its own, no write coalescing)' if args.plain else ''}."]
    if not args.memory_only:
        try:
            compare(args, out)
        finally:
            for c in KEPT.values():
                c.remove()
    if args.memory_keys > 0:
        memory(args, out)
    text = "\n".join(out) + "\n"
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
