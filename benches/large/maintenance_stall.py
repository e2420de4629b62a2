#!/usr/bin/env python3
"""Does defragmentation or a big compaction stop traffic? Concord beside etcd, same machine.

For each server: one member; `--keys` keys of `--value-size` bytes written `--versions` times
(so the compaction has revisions to drop and the defragmentation space to reclaim); then three
runs of the same paced load, puts and single-key ranges side by side (concord-bench `put` and
`range` with `--rate`, 8 clients each): quiet, while a compaction of every revision but the last
is applied (`etcdctl compaction --physical`), and while `etcdctl defrag` runs. Reported: p99,
p99.9 and the slowest put and range of each run, and how long the compaction and the
defragmentation took. `--keep` keeps the data dir; `--reuse DIR` runs the phases again on
such a dir without loading it, to compare two builds on one state.

    benches/large/maintenance_stall.py --etcd-dir .etcd-ref/bin/etcd-ref \\
        --concord target/release/concord --bench target/release/concord-bench --out benches/large/
"""

import json
import shutil
import subprocess
import tempfile
import threading
import time

from members import arguments, load, member, save, servers, status, stop, wait_healthy



def ctl(etcdctl, endpoint, *args, check=True):
    return subprocess.run([etcdctl, "--endpoints", endpoint, "--command-timeout", "600s", *args],
                          capture_output=True, text=True, check=check)


def paced(bench, workload, endpoint, seconds, rate, value_size, keys):
    out = subprocess.run([bench, workload, "--endpoints", endpoint, "--clients", "8", "--conns", "4",
                          "--rate", str(rate), "--duration", f"{seconds}s", "--value-size",
                          str(value_size), "--key-space", str(keys), "--json",
                          # The keys were loaded: ranges read them, not write them first.
                          *(["--no-prefill"] if workload == "range" else [])],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def paced_load(bench, endpoint, seconds, rate, value_size, keys):
    """Paced puts and paced ranges at the same time: {"put": ..., "range": ...}."""
    results = {}

    def one(workload):
        results[workload] = paced(bench, workload, endpoint, seconds, rate, value_size, keys)

    threads = [threading.Thread(target=one, args=(w,)) for w in ("put", "range")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def under_load(etcdctl, bench, endpoint, args, rate, value_size, keys):
    """`etcdctl <args>` started 2 s into 12 s of paced puts and ranges: (its seconds, the
    paced results)."""
    took = {}

    def maintenance():
        time.sleep(2)
        started = time.time()
        ctl(etcdctl, endpoint, *args)
        took["s"] = round(time.time() - started, 2)

    t = threading.Thread(target=maintenance)
    t.start()
    during = paced_load(bench, endpoint, 12, rate, value_size, keys)
    t.join()
    return took.get("s"), during


def summary(result):
    return {k: result[k] for k in ("p99_ms", "p999_ms", "max_ms", "errors")}


def run(label, server, etcdctl, bench, keys, value_size, versions, rate, work, keep=False,
        reuse=None):
    d = reuse or tempfile.mkdtemp(prefix=f"stall-{label.split()[0]}-", dir=work)
    proc, ep = member(server, "m0", 25790, f"{d}/m0", log=f"{d}/server.log")
    try:
        wait_healthy(etcdctl, ep, within=1200)
        for _ in range(0 if reuse else versions):
            load(bench, ep, keys, value_size)
        rev = status(etcdctl, ep)["header"]["revision"]
        row = {"server": label, "keys": keys, "value_bytes": value_size, "revisions": rev}
        quiet = paced_load(bench, ep, 10, rate, value_size, keys)
        row["quiet"] = summary(quiet["put"])
        row["quiet_range"] = summary(quiet["range"])
        for name, args in (("compaction", ["compaction", "--physical", str(rev)]),
                           ("defrag", ["defrag"])):
            took_s, during = under_load(etcdctl, bench, ep, args, rate, value_size, keys)
            row[name] = summary(during["put"])
            row[name]["took_s"] = took_s
            row[f"{name}_range"] = summary(during["range"])
        return row
    finally:
        stop([proc])
        if keep or reuse:
            print("kept", d, flush=True)
        else:
            shutil.rmtree(d, ignore_errors=True)


def main():
    ap = arguments(__doc__)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--value-size", type=int, default=1024)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--keep", action="store_true", help="keep the data dir (printed at the end)")
    ap.add_argument("--reuse", metavar="DIR",
                    help="a data dir kept by --keep: no load, its state as it is (one server)")
    a = ap.parse_args()
    etcdctl = f"{a.etcd_dir}/etcdctl"
    rows = []
    for label, server in servers(a):
        rows.append(run(label, server, etcdctl, a.bench, a.keys, a.value_size, a.versions, a.rate,
                        a.work, a.keep, a.reuse))
        print(json.dumps(rows[-1]), flush=True)
    table = ("| server | phase | took (s) | put p99 (ms) | p99.9 (ms) | slowest put (ms) | "
             "range p99 (ms) | p99.9 (ms) | slowest range (ms) | errors |\n"
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        for phase in ("quiet", "compaction", "defrag"):
            p, q = r[phase], r[f"{phase}_range"]
            table += (f"| {r['server']} | {phase} | {p.get('took_s', '')} | {p['p99_ms']:.1f} | "
                      f"{p['p999_ms']:.1f} | {p['max_ms']:.1f} | {q['p99_ms']:.1f} | "
                      f"{q['p999_ms']:.1f} | {q['max_ms']:.1f} | {p['errors'] + q['errors']} |\n")
    print(table)
    if a.out:
        save(a.out, "maintenance-stall", rows, table)

if __name__ == "__main__":
    main()
