#!/usr/bin/env python3
"""Large-state snapshots, Concord beside etcd on the same machine, one after the other.

For each server: one member with `--snapshot-count 2000` and a raised quota; `--keys` values of
`--value-size` bytes loaded by 16 clients (concord-bench `load`); then `etcdctl snapshot save`;
then a second member added (`member add`, started with `--initial-cluster-state existing`),
which must be sent a snapshot. Reported: load time, resident memory (RSS) after the load, the
size of the data dir, the time to serve again after a restart (SIGTERM, start, until `etcdctl
endpoint health` succeeds) and the RSS then, the peak RSS above that while the snapshot is
saved, time for the new member to catch up, the sender's and the newcomer's peak RSS
meanwhile (sampled every 20 ms from /proc), and the newcomer's RSS 5 s after it caught up. `--name` names the result files (the 8 GiB profile:
`--keys 4194304 --value-size 2048 --name large-profile-8g`).

    benches/large/snapshot_memory.py --etcd-dir .etcd-ref/bin/etcd-ref \\
        --concord target/release/concord --bench target/release/concord-bench --out benches/large/
"""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

from members import arguments, load, member, rss_mib, save, servers, status, stop, wait_healthy


class Peak:
    """Samples the RSS of some processes every 20 ms until stopped; keeps each one's peak."""

    def __init__(self, pids):
        self.pids = pids
        self.peaks = {p: rss_mib(p) for p in pids}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            for p in self.pids:
                self.peaks[p] = max(self.peaks[p], rss_mib(p))
            time.sleep(0.02)

    def done(self):
        self.stop.set()
        self.thread.join()
        return self.peaks



def run(label, server, etcdctl, bench, keys, value_size, work):
    d = tempfile.mkdtemp(prefix=f"large-{label}-", dir=work)
    port = 23790
    cluster = f"m0=http://127.0.0.1:{port + 1}"
    snapshots = ["--snapshot-count", "2000"]
    m0, ep0 = member(server, "m0", port, f"{d}/m0", extra=snapshots, log=f"{d}/m0.log")
    procs = [m0]
    try:
        wait_healthy(etcdctl, ep0)
        started = time.time()
        load(bench, ep0, keys, value_size)
        load_s = time.time() - started
        time.sleep(2)
        rss_after_load = rss_mib(m0.pid)
        disk = int(subprocess.run(["du", "-sb", f"{d}/m0"], capture_output=True, text=True,
                                  check=True).stdout.split()[0])
        stop([m0])
        started = time.time()
        m0, ep0 = member(server, "m0", port, f"{d}/m0", extra=snapshots, log=f"{d}/m0.log")
        procs = [m0]
        wait_healthy(etcdctl, ep0, within=1200)
        restart_s = time.time() - started
        time.sleep(2)
        steady = rss_mib(m0.pid)
        peak = Peak([m0.pid])
        started = time.time()
        subprocess.run([etcdctl, "--endpoints", ep0, "snapshot", "save", f"{d}/backup.db"],
                       check=True, capture_output=True)
        save_s = time.time() - started
        save_peak = peak.done()[m0.pid]
        size = os.path.getsize(f"{d}/backup.db")
        os.unlink(f"{d}/backup.db")
        # A second member: it must be sent a snapshot (the log was compacted long ago).
        peer1 = f"http://127.0.0.1:{port + 11}"
        subprocess.run([etcdctl, "--endpoints", ep0, "member", "add", "m1", f"--peer-urls={peer1}"],
                       check=True, capture_output=True)
        steady0 = rss_mib(m0.pid)
        started = time.time()
        m1, ep1 = member(server, "m1", port + 10, f"{d}/m1", f"{cluster},m1={peer1}", "existing",
                         extra=snapshots, log=f"{d}/m1.log")
        procs.append(m1)
        time.sleep(0.05)
        peak = Peak([m0.pid, m1.pid])
        target = status(etcdctl, ep0)["header"]["revision"]
        deadline = time.time() + 1800
        while True:
            s = status(etcdctl, ep1)
            if s and s["header"]["revision"] >= target:
                break
            if time.time() > deadline:
                raise SystemExit(f"{label}: the new member did not catch up in 1800 s")
            time.sleep(0.1)
        join_s = time.time() - started
        peaks = peak.done()
        # The newcomer's own steady memory, to set its peak against (the target: at
        # most 256 MiB above it).
        time.sleep(5)
        newcomer_steady = rss_mib(m1.pid)
        return {
            "server": label, "keys": keys, "value_bytes": value_size,
            "load_s": round(load_s, 1), "rss_after_load_mib": round(rss_after_load),
            "disk_gib": round(disk / 2**30, 2), "restart_s": round(restart_s, 2),
            "rss_after_restart_mib": round(steady),
            "snapshot_bytes": size, "snapshot_save_s": round(save_s, 1),
            "snapshot_save_rss_above_mib": round(save_peak - steady),
            "new_member_caught_up_s": round(join_s, 1),
            "sender_rss_above_mib": round(peaks[m0.pid] - steady0),
            "newcomer_peak_rss_mib": round(peaks[m1.pid]),
            "newcomer_rss_after_mib": round(newcomer_steady),
        }
    finally:
        stop(procs)
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = arguments(__doc__)
    ap.add_argument("--keys", type=int, default=65536)
    ap.add_argument("--value-size", type=int, default=16384)
    ap.add_argument("--name", default="snapshot-memory")
    a = ap.parse_args()
    etcdctl = f"{a.etcd_dir}/etcdctl"
    rows = []
    for label, server in servers(a):
        rows.append(run(label, server, etcdctl, a.bench, a.keys, a.value_size, a.work))
        print(json.dumps(rows[-1]), flush=True)
    cols = ["load_s", "rss_after_load_mib", "disk_gib", "restart_s", "rss_after_restart_mib",
            "snapshot_save_s", "snapshot_save_rss_above_mib",
            "new_member_caught_up_s", "sender_rss_above_mib", "newcomer_peak_rss_mib",
            "newcomer_rss_after_mib"]
    table = "| server | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols) + "\n"
    for r in rows:
        table += f"| {r['server']} | " + " | ".join(str(r[c]) for c in cols) + " |\n"
    print(table)
    if a.out:
        save(a.out, a.name, rows, table)


if __name__ == "__main__":
    main()
