#!/usr/bin/env python3
"""Does defragmentation or a big compaction stop traffic? Concord beside etcd, same machine.

For each server: one member; `--keys` keys of `--value-size` bytes written `--versions` times
(so the compaction has revisions to drop and the defragmentation space to reclaim); then three
runs of the same paced put workload (concord-bench `put --rate`, 8 clients): quiet, while a
compaction of every revision but the last is applied (`etcdctl compaction --physical`), and
while `etcdctl defrag` runs. Reported: p99, p99.9 and the longest put of each run, and how long
the compaction and the defragmentation took.

    benches/large/maintenance_stall.py --etcd-dir .etcd-ref/bin/etcd-ref \\
        --concord target/release/concord --bench target/release/concord-bench --out benches/large/
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time


def start(server, d, port):
    client, peer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
    log = open(f"{d}/server.log", "w")
    p = subprocess.Popen([server, "--name", "m0", "--data-dir", f"{d}/m0",
                          "--listen-client-urls", client, "--advertise-client-urls", client,
                          "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                          "--initial-cluster", f"m0={peer}", "--quota-backend-bytes", str(8 << 30)],
                         stdout=log, stderr=log)
    return p, client


def ctl(etcdctl, endpoint, *args, check=True):
    return subprocess.run([etcdctl, "--endpoints", endpoint, "--command-timeout", "600s", *args],
                          capture_output=True, text=True, check=check)


def paced_puts(bench, endpoint, seconds, rate, value_size, keys):
    out = subprocess.run([bench, "put", "--endpoints", endpoint, "--clients", "8", "--conns", "4",
                          "--rate", str(rate), "--duration", f"{seconds}s", "--value-size",
                          str(value_size), "--key-space", str(keys), "--json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(label, server, etcdctl, bench, keys, value_size, versions, rate, work):
    d = tempfile.mkdtemp(prefix=f"stall-{label.split()[0]}-", dir=work)
    proc, ep = start(server, d, 25790)
    try:
        for _ in range(100):
            if ctl(etcdctl, ep, "endpoint", "health", check=False).returncode == 0:
                break
            time.sleep(0.2)
        for _ in range(versions):
            subprocess.run([bench, "load", "--endpoints", ep, "--clients", "16", "--conns", "4",
                            "--key-space", str(keys), "--value-size", str(value_size)],
                           check=True, capture_output=True)
        rev = json.loads(ctl(etcdctl, ep, "endpoint", "status", "-w", "json").stdout)[0]["Status"]["header"]["revision"]
        row = {"server": label, "keys": keys, "value_bytes": value_size, "revisions": rev}
        quiet = paced_puts(bench, ep, 10, rate, value_size, keys)
        row["quiet"] = {k: quiet[k] for k in ("p99_ms", "p999_ms", "max_ms", "errors")}
        for name, args in (("compaction", ["compaction", "--physical", str(rev)]),
                           ("defrag", ["defrag"])):
            took = {}

            def maintenance():
                time.sleep(2)
                started = time.time()
                ctl(etcdctl, ep, *args)
                took["s"] = round(time.time() - started, 2)

            t = threading.Thread(target=maintenance)
            t.start()
            during = paced_puts(bench, ep, 12, rate, value_size, keys)
            t.join()
            row[name] = {k: during[k] for k in ("p99_ms", "p999_ms", "max_ms", "errors")}
            row[name]["took_s"] = took.get("s")
        return row
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--etcd-dir", required=True)
    ap.add_argument("--concord", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--value-size", type=int, default=1024)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--work", default="/var/tmp")
    ap.add_argument("--out")
    a = ap.parse_args()
    etcdctl = f"{a.etcd_dir}/etcdctl"
    rows = []
    for label, server in (("etcd 3.5.1", f"{a.etcd_dir}/etcd"), ("Concord", a.concord)):
        rows.append(run(label, server, etcdctl, a.bench, a.keys, a.value_size, a.versions, a.rate, a.work))
        print(json.dumps(rows[-1]), flush=True)
    table = ("| server | phase | took (s) | put p99 (ms) | p99.9 (ms) | longest put (ms) | errors |\n"
             "|---|---|---:|---:|---:|---:|---:|\n")
    for r in rows:
        for phase in ("quiet", "compaction", "defrag"):
            p = r[phase]
            table += (f"| {r['server']} | {phase} | {p.get('took_s', '')} | {p['p99_ms']:.1f} | "
                      f"{p['p999_ms']:.1f} | {p['max_ms']:.1f} | {p['errors']} |\n")
    print(table)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d")
        with open(f"{a.out}/maintenance-stall-{stamp}.json", "w") as f:
            json.dump(rows, f, indent=1)
        with open(f"{a.out}/maintenance-stall-{stamp}.md", "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
