#!/usr/bin/env python3
"""Restoring a member from etcd's snapshot file: Concord beside etcd.

One etcd 3.5.1 member is loaded with `--keys` values of `--value-size` bytes (concord-bench
`load`, 16 clients), its database saved with `etcdctl snapshot save` and the member stopped. Then,
`--rounds` times for each server (builds alternating): the file is restored into a new data dir
(`etcdutl snapshot restore` for the etcds, `concord snapshot restore` for Concord; the
SHA-256 checked), timed, with the restoring process's peak RSS (its `ru_maxrss`); the member is
started on that data dir and timed until `etcdctl endpoint health` succeeds (polled every
0.05 s), with its RSS then; and its `endpoint hashkv` must equal the saving member's.

    benches/large/restore_time.py --etcd-dir .etcd-ref/bin/etcd-ref \\
        --concord target/release/concord --bench target/release/concord-bench \\
        --keys 131072 --value-size 16384 --out benches/large/
"""

import json
import os
import shutil
import subprocess
import tempfile
import time

from members import arguments, load, member, rss_mib, save, servers, stop, wait_healthy


def hashkv(etcdctl, endpoint):
    """The member's `endpoint hashkv` hash at its current revision."""
    out = subprocess.run([etcdctl, "--endpoints", endpoint, "endpoint", "hashkv", "-w", "json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]["HashKV"]["hash"]


def saved(etcd, etcdctl, bench, keys, value_size, work):
    """(path of the saved snapshot, its HashKV) of an etcd member loaded with `keys` keys."""
    data = tempfile.mkdtemp(prefix="restore-src-", dir=work)
    path = os.path.join(work, f"restore-{keys}x{value_size}.db")
    try:
        p, ep = member(etcd, "src", 24890, data)
        try:
            wait_healthy(etcdctl, ep)
            load(bench, ep, keys, value_size)
            subprocess.run([etcdctl, "--endpoints", ep, "snapshot", "save", path],
                           capture_output=True, check=True)
            return path, hashkv(etcdctl, ep)
        finally:
            stop([p])
    finally:
        shutil.rmtree(data, ignore_errors=True)


def restore_command(label, binary, snapshot, data):
    """The command restoring `snapshot` into `data` for server `label`."""
    tool = os.path.join(os.path.dirname(binary), "etcdutl") if label.startswith("etcd") else binary
    return [tool, "snapshot", "restore", snapshot, "--data-dir", data,
            "--initial-cluster", "m=http://127.0.0.1:24791",
            "--initial-advertise-peer-urls", "http://127.0.0.1:24791", "--name", "m"]


def restored(label, binary, etcdctl, snapshot, work):
    """(restore s, restore peak RSS MiB, start-to-serving s, RSS serving MiB, HashKV)."""
    parent = tempfile.mkdtemp(prefix="restore-", dir=work)
    data = os.path.join(parent, "data")
    try:
        subprocess.run(["sync"], check=True)
        began = time.time()
        child = subprocess.Popen(restore_command(label, binary, snapshot, data),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        took = time.time() - began
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{label}: restore failed: {child.stderr.read()[:2000]!r}")
        began = time.time()
        p, ep = member(binary, "m", 24790, data)
        try:
            wait_healthy(etcdctl, ep, within=600, poll=0.05)
            serving = time.time() - began
            return took, usage.ru_maxrss / 1024, serving, rss_mib(p.pid), hashkv(etcdctl, ep)
        finally:
            stop([p])
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def main():
    ap = arguments(__doc__)
    ap.add_argument("--keys", type=int, default=131072)
    ap.add_argument("--value-size", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--name", default="restore-time")
    args = ap.parse_args()
    etcdctl = os.path.join(args.etcd_dir, "etcdctl")
    run = servers(args)
    snapshot, want = saved(os.path.join(args.etcd_dir, "etcd"), etcdctl, args.bench,
                           args.keys, args.value_size, args.work)
    size = os.path.getsize(snapshot)
    rows = []
    try:
        for r in range(args.rounds):
            for label, binary in run:
                took, peak, serving, rss, got = restored(label, binary, etcdctl, snapshot, args.work)
                if got != want:
                    raise SystemExit(f"{label}: HashKV {got} after the restore, {want} saved")
                rows.append({"server": label, "round": r + 1, "restore_s": round(took, 2),
                             "restore_peak_mib": round(peak), "serving_s": round(serving, 2),
                             "serving_rss_mib": round(rss)})
                print(rows[-1], flush=True)
    finally:
        os.remove(snapshot)
    table = (f"{args.keys} values of {args.value_size} B, etcd 3.5.1's snapshot file of "
             f"{size / 2**30:.2f} GiB; HashKV equal to the saving member's after every restore.\n\n"
             "| server | round | restore (s) | restore peak RSS (MiB) | start to serving (s) "
             "| RSS serving (MiB) |\n|---|---:|---:|---:|---:|---:|\n")
    for row in rows:
        table += (f"| {row['server']} | {row['round']} | {row['restore_s']} | "
                  f"{row['restore_peak_mib']} | {row['serving_s']} | {row['serving_rss_mib']} |\n")
    print(table)
    if args.out:
        save(args.out, args.name, rows, table)


if __name__ == "__main__":
    main()
