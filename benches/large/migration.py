#!/usr/bin/env python3
"""Migration at size: etcd 3.5.1 -> Concord -> etcd through etcd's snapshot file, timed.

One etcd member is loaded with `--keys` values of `--value-size` bytes (concord-bench `load`, 16
clients) and saved (`etcdctl snapshot save`). Then, each step timed and its peak memory taken:

  - `etcdutl snapshot restore` of etcd's file (the baseline: what a restore costs in etcd);
  - `concord snapshot restore` of etcd's file (peak RSS of the restore process, from wait4);
  - Concord started on it: time until `endpoint health` succeeds, HashKV equal to etcd's;
  - `etcdctl snapshot save` from Concord: time, and the server's peak RSS above its steady RSS
    (sampled every 20 ms);
  - `etcdutl snapshot restore` of Concord's file and etcd started on it: HashKV equal again.

    benches/large/migration.py --etcd-dir .etcd-ref/bin/etcd-ref \\
        --concord target/release/concord --bench target/release/concord-bench --out benches/large/
"""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

from members import arguments, load, member, rss_mib, save, stop, wait_healthy


def timed(argv):
    """Runs `argv`; returns (seconds, peak RSS in MiB). Stops on a failure."""
    start = time.time()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    took = time.time() - start
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if status != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err[-2000:]}")
    return took, usage.ru_maxrss / 1024


def hashkv(etcdctl, endpoint):
    out = subprocess.run([etcdctl, "--endpoints", endpoint, "endpoint", "hashkv", "-w", "json"],
                         capture_output=True, text=True, check=True)
    h = json.loads(out.stdout)[0]
    return h["HashKV"]["hash"], h["HashKV"]["header"]["revision"]


def peak_while(pid, action):
    """Runs `action()` while sampling `pid`'s RSS; returns (its result, the peak in MiB)."""
    peak = [rss_mib(pid)]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib(pid))
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        result = action()
    finally:
        done.set()
        t.join()
    return result, peak[0]


def serving(server, etcdctl, data, port, log):
    start = time.time()
    p, ep = member(server, "m0", port, data, log=log)
    wait_healthy(etcdctl, ep, within=600)
    return p, ep, time.time() - start


def main():
    ap = arguments(__doc__)
    ap.add_argument("--keys", type=int, default=524288)
    ap.add_argument("--value-size", type=int, default=2048)
    ap.add_argument("--name", default="migration")
    a = ap.parse_args()
    etcd, etcdctl, etcdutl = (os.path.join(a.etcd_dir, b) for b in ("etcd", "etcdctl", "etcdutl"))
    d = tempfile.mkdtemp(prefix="migration-", dir=a.work)
    port = 23790
    cluster = f"m0=http://127.0.0.1:{port + 1}"
    restore_flags = ["--name", "m0", "--initial-cluster", cluster,
                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{port + 1}"]
    row = {"keys": a.keys, "value_size": a.value_size}
    procs = []
    try:
        p, ep = member(etcd, "m0", port, f"{d}/etcd", log=f"{d}/etcd.log")
        procs = [p]
        wait_healthy(etcdctl, ep)
        start = time.time()
        load(a.bench, ep, a.keys, a.value_size)
        row["load_s"] = round(time.time() - start, 1)
        source = hashkv(etcdctl, ep)
        start = time.time()
        subprocess.run([etcdctl, "--endpoints", ep, "snapshot", "save", f"{d}/etcd.db"],
                       capture_output=True, check=True)
        row["etcd_save_s"] = round(time.time() - start, 1)
        row["file_mib"] = round(os.path.getsize(f"{d}/etcd.db") / 2**20)
        stop(procs)
        procs = []

        took, rss = timed([etcdutl, "snapshot", "restore", f"{d}/etcd.db", "--data-dir",
                           f"{d}/etcd-again", *restore_flags])
        row["etcdutl_restore_s"], row["etcdutl_restore_rss_mib"] = round(took, 1), round(rss)
        shutil.rmtree(f"{d}/etcd-again")
        took, rss = timed([a.concord, "snapshot", "restore", f"{d}/etcd.db", "--data-dir",
                           f"{d}/concord", *restore_flags])
        row["concord_restore_s"], row["concord_restore_rss_mib"] = round(took, 1), round(rss)

        p, ep, took = serving(a.concord, etcdctl, f"{d}/concord", port, f"{d}/concord.log")
        procs = [p]
        row["concord_serving_s"] = round(took, 1)
        row["concord_hashkv_equal"] = hashkv(etcdctl, ep) == source
        time.sleep(2)
        steady = rss_mib(p.pid)
        start = time.time()
        _, peak = peak_while(p.pid, lambda: subprocess.run(
            [etcdctl, "--endpoints", ep, "snapshot", "save", f"{d}/concord.db"],
            capture_output=True, check=True))
        row["concord_save_s"] = round(time.time() - start, 1)
        row["concord_rss_mib"] = round(steady)
        row["concord_save_rss_above_mib"] = round(peak - steady)
        stop(procs)
        procs = []

        took, rss = timed([etcdutl, "snapshot", "restore", f"{d}/concord.db", "--data-dir",
                           f"{d}/etcd-back", *restore_flags])
        row["etcdutl_restore_concord_file_s"] = round(took, 1)
        p, ep, took = serving(etcd, etcdctl, f"{d}/etcd-back", port, f"{d}/etcd-back.log")
        procs = [p]
        row["etcd_back_hashkv_equal"] = hashkv(etcdctl, ep) == source
    finally:
        stop(procs)
        shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(row, indent=1))
    lines = ["| measure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in row.items()]
    table = "\n".join(lines) + "\n"
    print(table)
    if a.out:
        save(a.out, a.name, [row], table)
    if not (row["concord_hashkv_equal"] and row["etcd_back_hashkv_equal"]):
        raise SystemExit("HashKV differs after a migration")


if __name__ == "__main__":
    main()
