"""What the large-state benchmarks share: starting a member (etcd or Concord, etcd's flags),
waiting for it, stopping members, loading keys, and writing the results."""

import argparse
import json
import os
import signal
import subprocess
import time

# `--quota-backend-bytes` for both servers (`--quota-gib`, 16 by default): room for an 8 GiB
# state on Concord; etcd's bbolt needs about twice the values with 2 KiB values.
QUOTA = str(16 << 30)


def member(server, name, port, data, cluster=None, state="new", extra=(), log=None):
    """Starts member `name` of `server` with clients on `port` and peers on `port + 1`; a new
    one-member cluster unless `cluster` (`--initial-cluster`) and `state` say otherwise.
    Returns the process and its client URL."""
    client, peer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
    out = open(log, "w") if log else subprocess.DEVNULL
    p = subprocess.Popen([server, "--name", name, "--data-dir", data,
                          "--listen-client-urls", client, "--advertise-client-urls", client,
                          "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                          "--initial-cluster", cluster or f"{name}={peer}",
                          "--initial-cluster-state", state, "--quota-backend-bytes", QUOTA, *extra],
                         stdout=out, stderr=out)
    return p, client


def wait_healthy(etcdctl, endpoint, within=60, poll=0.2):
    """Returns once `endpoint health` succeeds (asked every `poll` s); stops after `within` s."""
    deadline = time.time() + within
    while time.time() < deadline:
        if subprocess.run([etcdctl, "--endpoints", endpoint, "endpoint", "health"],
                          capture_output=True).returncode == 0:
            return
        time.sleep(poll)
    raise SystemExit(f"{endpoint} never became healthy")


def status(etcdctl, endpoint):
    """`endpoint status` as etcdctl's JSON has it, or None if the member does not answer."""
    out = subprocess.run([etcdctl, "--endpoints", endpoint, "endpoint", "status", "-w", "json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)[0]["Status"]


def load(bench, endpoint, keys, value_size):
    """Writes every one of `keys` keys once (concord-bench `load`, 16 clients); on a failure,
    stops with what the load tool said."""
    env = {k: v for k, v in os.environ.items() if k != "RUST_BACKTRACE"}
    out = subprocess.run([bench, "load", "--endpoints", endpoint, "--clients", "16", "--conns",
                          "4", "--key-space", str(keys), "--value-size", str(value_size)],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"loading {endpoint} failed: {(out.stdout + out.stderr)[:2000]}")


def stop(procs):
    """SIGTERM, then SIGKILL after 30 s."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def save(out, name, rows, table):
    """`<out>/<name>-<date>.json` and `.md`."""
    os.makedirs(out, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d")
    with open(f"{out}/{name}-{stamp}.json", "w") as f:
        json.dump(rows, f, indent=1)
    with open(f"{out}/{name}-{stamp}.md", "w") as f:
        f.write(table)


def rss_mib(pid, field="VmRSS"):
    """The resident memory of process `pid` in MiB (0 once it is gone); `field="VmHWM"` gives
    its peak since it started."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def arguments(doc):
    """The command line every large-state benchmark takes (the binaries, a work dir, where the
    results go, one server only); each script adds its own sizes."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--etcd-dir", required=True)
    ap.add_argument("--concord", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--work", default="/var/tmp")
    ap.add_argument("--out")
    ap.add_argument("--only", choices=["etcd", "concord"], help="run one server only")
    ap.add_argument("--quota-gib", type=int, default=16, help="--quota-backend-bytes, in GiB")
    ap.add_argument("--etcd36-dir", help="also etcd 3.6 (built by benches/etcd36/build.sh)")
    ap.add_argument("--concord-before", help="also another Concord build, labelled "
                    "'Concord before' (an A/B of a change), compared as the etcds are")
    return ap


def servers(a):
    """(label, binary) of the servers to run: etcd 3.5.1's (and 3.6's with `--etcd36-dir`) and
    Concord's, or those `--only` names.
    Also sets the quota every member is started with."""
    global QUOTA
    QUOTA = str(a.quota_gib << 30)
    every = [("etcd 3.5.1", os.path.join(a.etcd_dir, "etcd"))]
    if getattr(a, "etcd36_dir", None):
        every.append(("etcd 3.6", os.path.join(a.etcd36_dir, "etcd")))
    if getattr(a, "concord_before", None):
        every.append(("Concord before", a.concord_before))
    every.append(("Concord", a.concord))
    return [(label, binary) for label, binary in every
            if not a.only or label.lower().startswith(a.only)]
