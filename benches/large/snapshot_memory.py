#!/usr/bin/env python3
"""Large-state snapshots, Concord beside etcd on the same machine, one after the other.

For each server: one member with `--snapshot-count 2000` and a raised quota; `--keys` values of
`--value-size` bytes loaded by 16 clients (concord-bench `load`); then `etcdctl snapshot save`;
then a second member added (`member add`, started with `--initial-cluster-state existing`),
which must be sent a snapshot. Reported: load time, resident memory (RSS) after the load, the
size of the data dir, the time to serve again after a restart (SIGTERM, start, until `etcdctl
endpoint health` succeeds) and the RSS then, the peak RSS above that while the snapshot is
saved, time for the new member to catch up, the sender's and the newcomer's peak RSS
meanwhile (sampled every 20 ms from /proc), and the newcomer's RSS 5 s after it caught up, the
peak of the disk space in use on the machine meanwhile above what was in use before it started
(sender's and newcomer's files, unlinked ones included) and the newcomer's data dir after. `--name` names the result files (the 8 GiB profile:
`--keys 4194304 --value-size 2048 --name large-profile-8g`). For a state the disk cannot hold
twice: `--stream-snapshot` (the snapshot streamed and its digest checked, nothing kept),
`--no-snapshot` (no save at all) and `--no-join`;
`--defrag` adds paced puts and ranges, first alone, then during a defrag; `--cold-restart` drops
the kernel's page cache before the restart (as a reboot would).

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

from maintenance_stall import paced_load, under_load
from members import arguments, load, member, rss_mib, save, servers, status, stop, wait_healthy


class Sampler:
    """Calls `sample` (a dict of numbers) every 20 ms on a thread until stopped; keeps the
    largest value seen of each of its keys."""

    def __init__(self, sample):
        self.sample = sample
        self.peaks = sample()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            for k, v in self.sample().items():
                self.peaks[k] = max(self.peaks[k], v)
            time.sleep(0.02)

    def done(self):
        self.stop.set()
        self.thread.join()
        return self.peaks


def rss_peaks(pids):
    """The peak RSS of each of `pids`, sampled every 20 ms (`.done()` returns them by pid)."""
    return Sampler(lambda: {p: rss_mib(p) for p in pids})


def disk_used(path):
    """Bytes in use on the file system holding `path` (files unlinked while open included,
    which `du` does not see)."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def dir_bytes(path):
    """Apparent size of the files under `path` (what `du -sb` counts), skipping files that
    go while it looks (etcd renames and removes its WAL's temporary files: `du` then fails)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass
    return total


def drop_page_cache():
    """Writes back and drops the kernel's page cache (root): what is read next comes from disk."""
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run(label, server, etcdctl, bench, keys, value_size, work, opts):
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
        disk = dir_bytes(f"{d}/m0")
        stop([m0])
        if opts.cold_restart:
            drop_page_cache()
        started = time.time()
        m0, ep0 = member(server, "m0", port, f"{d}/m0", extra=snapshots, log=f"{d}/m0.log")
        procs = [m0]
        wait_healthy(etcdctl, ep0, within=1200)
        restart_s = time.time() - started
        time.sleep(2)
        steady = rss_mib(m0.pid)
        peak = rss_peaks([m0.pid])
        started = time.time()
        first_message_s = None
        if opts.no_snapshot:
            size = None
        elif opts.stream_snapshot:
            # Streamed and thrown away (digest checked): for states the disk cannot hold twice.
            out = subprocess.run([bench, "snapshot", "--endpoints", ep0, "--conns", "1"],
                                 check=True, capture_output=True, text=True)
            streamed = json.loads(out.stdout.strip().splitlines()[-1])
            size = streamed["bytes"]
            first_message_s = streamed.get("first_message_s")
        else:
            subprocess.run([etcdctl, "--endpoints", ep0, "snapshot", "save", f"{d}/backup.db"],
                           check=True, capture_output=True)
            size = os.path.getsize(f"{d}/backup.db")
            os.unlink(f"{d}/backup.db")
        save_s = None if opts.no_snapshot else round(time.time() - started, 1)
        save_peak = peak.done()[m0.pid]
        row = {
            "server": label, "keys": keys, "value_bytes": value_size,
            "load_s": round(load_s, 1), "rss_after_load_mib": round(rss_after_load),
            "disk_gib": round(disk / 2**30, 2), "restart_s": round(restart_s, 2),
            "rss_after_restart_mib": round(steady),
            "snapshot_bytes": size, "snapshot_save_s": save_s,
            "snapshot_first_message_s": first_message_s,
            "snapshot_save_rss_above_mib": None if opts.no_snapshot else round(save_peak - steady),
        }
        if opts.defrag:
            if opts.cold_cache:
                # As on a state larger than memory: the paced ranges read their values from disk.
                drop_page_cache()
            row.update(defrag_under_load(etcdctl, bench, ep0, keys, value_size))
        if opts.no_join:
            return row
        # A second member: it must be sent a snapshot (the log was compacted long ago).
        peer1 = f"http://127.0.0.1:{port + 11}"
        subprocess.run([etcdctl, "--endpoints", ep0, "member", "add", "m1", f"--peer-urls={peer1}"],
                       check=True, capture_output=True)
        steady0 = rss_mib(m0.pid)
        disk_base = disk_used(d)
        disk_peak = Sampler(lambda: {"used": disk_used(d)})
        started = time.time()
        m1, ep1 = member(server, "m1", port + 10, f"{d}/m1", f"{cluster},m1={peer1}", "existing",
                         extra=snapshots, log=f"{d}/m1.log")
        procs.append(m1)
        time.sleep(0.05)
        peak = rss_peaks([m0.pid, m1.pid])
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
        join_disk = round((disk_peak.done()["used"] - disk_base) / 2**30, 2)
        newcomer_disk = dir_bytes(f"{d}/m1")
        # The newcomer's own steady memory, to set its peak against (the target: at
        # most 256 MiB above it).
        time.sleep(5)
        newcomer_steady = rss_mib(m1.pid)
        newcomer_anon = rss_mib(m1.pid, "RssAnon")
        return row | {
            "new_member_caught_up_s": round(join_s, 1),
            "sender_rss_above_mib": round(peaks[m0.pid] - steady0),
            "newcomer_peak_rss_mib": round(peaks[m1.pid]),
            "newcomer_rss_after_mib": round(newcomer_steady),
            "newcomer_anon_after_mib": round(newcomer_anon),
            "join_disk_peak_above_gib": join_disk,
            "newcomer_disk_gib": round(newcomer_disk / 2**30, 2),
        }
    finally:
        stop(procs)
        shutil.rmtree(d, ignore_errors=True)


def defrag_under_load(etcdctl, bench, endpoint, keys, value_size):
    """Paced puts and ranges (1,000/s each) for 12 s without maintenance, then again while
    `etcdctl defrag` runs, as in maintenance_stall.py: the defrag's time and each side's p99 and
    slowest request in both."""
    print("paced load starting", flush=True)
    quiet = paced_load(bench, endpoint, 12, 1000, value_size, keys)
    took_s, during = under_load(etcdctl, bench, endpoint, ["defrag"], 1000, value_size, keys)
    return {"quiet_put_p99_ms": quiet["put"]["p99_ms"],
            "quiet_put_max_ms": quiet["put"]["max_ms"],
            "quiet_range_p99_ms": quiet["range"]["p99_ms"],
            "quiet_range_max_ms": quiet["range"]["max_ms"],
            "defrag_s": took_s,
            "defrag_put_p99_ms": during["put"]["p99_ms"],
            "defrag_put_max_ms": during["put"]["max_ms"],
            "defrag_range_p99_ms": during["range"]["p99_ms"],
            "defrag_range_max_ms": during["range"]["max_ms"],
            "defrag_errors": during["put"]["errors"] + during["range"]["errors"]}


def main():
    ap = arguments(__doc__)
    ap.add_argument("--keys", type=int, default=65536)
    ap.add_argument("--value-size", type=int, default=16384)
    ap.add_argument("--name", default="snapshot-memory")
    ap.add_argument("--stream-snapshot", action="store_true",
                    help="stream the snapshot with concord-bench and keep nothing of it (for a "
                    "state the disk cannot hold twice), instead of etcdctl snapshot save")
    ap.add_argument("--no-snapshot", action="store_true",
                    help="no snapshot save at all")
    ap.add_argument("--no-join", action="store_true",
                    help="no second member (its copy of the state would not fit on the disk)")
    ap.add_argument("--cold-restart", action="store_true",
                    help="drop the kernel's page cache (root) before the restart, so that the "
                         "restart reads from disk what it reads, as after a reboot")
    ap.add_argument("--cold-cache", action="store_true",
                    help="with --defrag: drop the kernel's page cache (root) before the paced "
                    "phases, so that a state smaller than memory is read from disk as a larger one is")
    ap.add_argument("--defrag", action="store_true",
                    help="also paced puts and ranges during a defrag, after the snapshot")
    a = ap.parse_args()
    etcdctl = f"{a.etcd_dir}/etcdctl"
    rows = []
    for label, server in servers(a):
        rows.append(run(label, server, etcdctl, a.bench, a.keys, a.value_size, a.work, a))
        print(json.dumps(rows[-1]), flush=True)
    cols = ["load_s", "rss_after_load_mib", "disk_gib", "restart_s", "rss_after_restart_mib",
            "snapshot_save_s", "snapshot_first_message_s", "snapshot_save_rss_above_mib",
            "new_member_caught_up_s", "sender_rss_above_mib", "newcomer_peak_rss_mib",
            "newcomer_rss_after_mib", "join_disk_peak_above_gib", "newcomer_disk_gib"]
    cols += ["quiet_put_p99_ms", "quiet_put_max_ms", "quiet_range_p99_ms", "quiet_range_max_ms",
             "defrag_s", "defrag_put_p99_ms", "defrag_put_max_ms", "defrag_range_p99_ms",
             "defrag_range_max_ms", "defrag_errors"]
    cols = [c for c in cols if any(c in r for r in rows)]
    table = "| server | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols) + "\n"
    for r in rows:
        table += f"| {r['server']} | " + " | ".join(str(r.get(c, "")) for c in cols) + " |\n"
    print(table)
    if a.out:
        save(a.out, a.name, rows, table)


if __name__ == "__main__":
    main()
