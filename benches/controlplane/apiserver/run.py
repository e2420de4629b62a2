#!/usr/bin/env python3
"""A real kube-apiserver serving a control plane's load from Concord and from etcd, one server
at a time, same machine, same run.

For each `--server NAME=BINARY[:MEMBERS]` (Concord or etcd; one member unless MEMBERS says
otherwise): members over TLS with client certificates as kubeadm sets them up, kube-apiserver
1.37 on them (built by k8s-tests/apiserver/build.sh; its compactor every --compact-every), then
`apiserver-load` (this directory, a package of the control-plane benchmark's Go module, built
here) against it: ConfigMaps of 2-8 KiB,
namespace watches, updates with resourceVersion preconditions, paginated lists of every
ConfigMap, Events under leases, and at the end the check that every acknowledged update is in
storage and every watch saw every update of its namespace once. Prints a table and each JSON
report; exits 1 if a check failed on any server.

    benches/controlplane/apiserver/run.py --server concord=target/release/concord \\
        --server etcd-3.6=.etcd-ref/bin/etcd-3.6/etcd [--kube-dir ~/.cache/concord-kube] \\
        [--profile-dir DIR] [-- apiserver-load flags, e.g. --objects 10000 --duration 30s]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "..", "k8s-tests", "apiserver"))
from apiserver_test import TOKEN, APIServer, Cluster, make_certs  # noqa: E402


def measure(name, binary, members, kube_dir, load_bin, load_args, compact_every, work):
    """Runs the load on a fresh cluster of `binary`; returns the load's report (with the
    server's name) and whether its checks passed."""
    d = tempfile.mkdtemp(prefix=f"apiserver-load-{name}-", dir=work)
    certs = make_certs(d)
    cluster = Cluster(os.path.abspath(binary), members, d, certs)
    api = None
    try:
        cluster.wait_healthy()
        api = APIServer(kube_dir, cluster, d, extra=["--etcd-compaction-interval", compact_every])
        api.wait_ready()
        out = subprocess.run([load_bin, "--url", api.url, "--token", TOKEN,
                              "--server-pids", ",".join(str(p.pid) for p in cluster.procs),
                              "--apiserver-pid", str(api.proc.pid), *load_args],
                             capture_output=True, text=True)
        lines = out.stdout.strip().splitlines()
        report = json.loads(lines[-1]) if lines else {"failed": out.stderr[-2000:]}
        report["server"], report["members"] = name, members
        return report, out.returncode == 0
    finally:
        if api:
            api.stop()
        cluster.stop()
        shutil.rmtree(d, ignore_errors=True)


def table(reports):
    def ms(r, kind, q):
        return f"{r.get(kind, {}).get(q, 0):.1f}"

    lines = ["| server | members | list p50 / p99 (ms) | update p50 / p99 (ms) | watch delivery "
             "p50 / p99 (ms) | Event p99 (ms) | events delivered / expected | lost updates | "
             "server CPU (cores) | server RSS (MiB) | kube-apiserver CPU (cores) |",
             "|---|---:|---|---|---|---:|---|---:|---:|---:|---:|"]
    for r in reports:
        if "failed" in r:
            lines.append(f"| {r['server']} | {r['members']} | failed: {r['failed'][:200]} |")
            continue
        lines.append(
            f"| {r['server']} | {r['members']} | {ms(r, 'list', 'p50_ms')} / {ms(r, 'list', 'p99_ms')} | "
            f"{ms(r, 'update', 'p50_ms')} / {ms(r, 'update', 'p99_ms')} | "
            f"{ms(r, 'watch', 'p50_ms')} / {ms(r, 'watch', 'p99_ms')} | {ms(r, 'event', 'p99_ms')} | "
            f"{r['watch_delivered']} / {r['watch_expected']} | {r['lost_updates']} | "
            f"{r['server_cpu_cores']:.2f} | {r['server_rss_mib']:.0f} | {r['apiserver_cpu_cores']:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", action="append", required=True, help="NAME=BINARY[:MEMBERS]")
    ap.add_argument("--kube-dir", default=os.environ.get(
        "CONCORD_KUBE_DIR", os.path.expanduser("~/.cache/concord-kube")))
    ap.add_argument("--compact-every", default="10s", help="kube-apiserver's --etcd-compaction-interval")
    ap.add_argument("--work", default="/var/tmp")
    ap.add_argument("--markdown", help="also write the table (and the reports) to this file")
    ap.add_argument("--profile-dir", help="write kube-apiserver's CPU profile of each server's load "
                    "window here (NAME.pprof; compare with `go tool pprof -top -diff_base A B`)")
    ap.add_argument("load_args", nargs="*", help="after --: apiserver-load's flags")
    a = ap.parse_args()
    load_bin = os.path.join(a.work, "apiserver-load")
    subprocess.run(["go", "build", "-o", load_bin, "./apiserver"], cwd=os.path.dirname(here), check=True)
    reports, ok = [], True
    for spec in a.server:
        name, _, rest = spec.partition("=")
        binary, _, members = rest.partition(":")
        load_args = list(a.load_args)
        if a.profile_dir:
            os.makedirs(a.profile_dir, exist_ok=True)
            load_args += ["--profile", os.path.abspath(os.path.join(a.profile_dir, f"{name}.pprof"))]
        report, passed = measure(name, binary, int(members or 1), a.kube_dir, load_bin,
                                 load_args, a.compact_every, a.work)
        print(json.dumps(report), flush=True)
        reports.append(report)
        ok = ok and passed
    text = table(reports)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n```json\n" + "\n".join(json.dumps(r) for r in reports) + "\n```\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
