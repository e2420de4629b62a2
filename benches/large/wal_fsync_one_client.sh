#!/bin/bash
# The Raft log's fsync time while one client puts, on a member whose log snapshots have already
# cut (so a build that reuses purged segments writes over them), for an A/B of two builds.
#
#   benches/large/wal_fsync_one_client.sh SERVER_BINARY TAG
#
# One member (`--snapshot-count 10000`, 16 GiB quota, ports 24790-24791) in /var/tmp/walfs-TAG;
# 20 s of 16-client puts of 100 KiB values; then, for 16 KiB and 100 KiB values, 8 s of puts by
# one client, each printed with its puts/s, p50 and the mean of
# etcd_disk_wal_fsync_duration_seconds over the phase (from /metrics). BENCH names concord-bench.
set -euo pipefail
BIN=$1
TAG=$2
BENCH=${BENCH:-target/release/concord-bench}
D=/var/tmp/walfs-$TAG
EP=http://127.0.0.1:24790
rm -rf "$D"
mkdir -p "$D"
"$BIN" --name m0 --data-dir "$D/m0" --listen-client-urls $EP --advertise-client-urls $EP \
  --listen-peer-urls http://127.0.0.1:24791 --initial-advertise-peer-urls http://127.0.0.1:24791 \
  --initial-cluster m0=http://127.0.0.1:24791 --quota-backend-bytes $((16 << 30)) \
  --snapshot-count 10000 > "$D/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -rf "$D"' EXIT
for _ in $(seq 100); do
  curl -sf $EP/health > /dev/null && break
  sleep 0.2
done
fsyncs() {
  curl -s $EP/metrics | awk '/^etcd_disk_wal_fsync_duration_seconds_(sum|count)/ { printf "%s ", $2 }'
}
"$BENCH" put --endpoints $EP --clients 16 --conns 4 --duration 20s --value-size 102400 \
  --key-space 1000 > /dev/null
for size in 16384 102400; do
  before=$(fsyncs)
  result=$("$BENCH" put --endpoints $EP --clients 1 --conns 1 --duration 8s --value-size $size \
    --key-space 1000 --json | tail -1)
  after=$(fsyncs)
  python3 - "$TAG" $size "$before" "$after" "$result" <<'PY'
import json, sys
tag, size, before, after, result = sys.argv[1:]
(s0, n0), (s1, n1) = [map(float, x.split()) for x in (before, after)]
r = json.loads(result)
print(f"{tag} {int(size) // 1024} KiB: {r['ops_per_sec']:.0f} puts/s, p50 {r['p50_ms']:.3f} ms, "
      f"log fsync mean {(s1 - s0) / (n1 - n0) * 1e3:.3f} ms over {n1 - n0:.0f}")
PY
done
