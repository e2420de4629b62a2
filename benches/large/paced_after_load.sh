#!/bin/bash
# Paced puts and ranges on a loaded member, each slow operation printed with when it was meant
# to start (concord-bench --slow-ms), to find where a run's stalls lie.
#
#   benches/large/paced_after_load.sh SERVER_BINARY TAG
#
# One member (`--snapshot-count 2000`, 16 GiB quota, ports 23790-23791) in /var/tmp/paced-TAG;
# 131,072 values of 16 KiB (2 GiB) loaded by 16 clients; a restart; the page cache dropped (root;
# WARM=1 keeps it); then 12 s of puts and single-key ranges at 1,000/s each (8 clients over 4
# connections each, as snapshot_memory.py's paced phases). Prints each side's result line
# (JSON); the slow operations (over SLOW_MS, default 50; times from the end of the 1 s warm-up)
# are in put.slow and range.slow in the work dir, with anything else the tool printed.
# Run it from the repository's top; BENCH names concord-bench (default
# target/release/concord-bench). KEYS sets the number of values (default 131072; 2097152 is
# 32 GiB), VALUE_SIZE their size (default 16384; the 8 GiB profile: KEYS=4194304
# VALUE_SIZE=2048), QUOTA_GIB the quota (default 16). REUSE=1 keeps a work dir loaded by an earlier run
# with the same KEYS (no load: the restart and the paced phase only), to repeat the phase on a
# state that takes long to load. DEFRAG=1 also defragments the member 4 s into the paced phase
# (ETCDCTL, default .etcd-ref/bin/etcd-ref/etcdctl) and prints how long it took. LOAD_ONLY=1
# stops after the load; TRACE=1 records the server's context switches with their stacks over the
# paced phase (perf, root) into the work dir's perf.data, to read with `perf script`. SYSMON=1
# samples the whole machine over the paced phase (system_monitor.py, into the work dir's
# system.mon) and prints the intervals in which the machine ran nothing (the monitor froze),
# to tell the server's stalls from the machine's.
set -euo pipefail
BIN=$1
TAG=$2
BENCH=${BENCH:-target/release/concord-bench}
KEYS=${KEYS:-131072}
VALUE_SIZE=${VALUE_SIZE:-16384}
D=/var/tmp/paced-$TAG
EP=http://127.0.0.1:23790
MONITOR=$(cd "$(dirname "$0")" && pwd)/system_monitor.py
if [ -z "${REUSE:-}" ]; then
  rm -rf "$D"
fi
mkdir -p "$D"
start() {
  "$BIN" --name m0 --data-dir "$D/m0" --listen-client-urls $EP --advertise-client-urls $EP \
    --listen-peer-urls http://127.0.0.1:23791 --initial-advertise-peer-urls http://127.0.0.1:23791 \
    --initial-cluster m0=http://127.0.0.1:23791 --initial-cluster-state new \
    --quota-backend-bytes $((${QUOTA_GIB:-16} << 30)) --snapshot-count 2000 >> "$D/m0.log" 2>&1 &
  SERVER=$!
  sleep 1
}
SERVER=
trap '[ -n "$SERVER" ] && kill $SERVER 2>/dev/null' EXIT
if [ -z "${REUSE:-}" ]; then
  start
  LOAD_START=$(date +%s.%N)
  "$BENCH" load --endpoints $EP --clients 16 --conns 4 --key-space "$KEYS" --value-size "$VALUE_SIZE" > /dev/null
  echo "load: $(awk "BEGIN { print $(date +%s.%N) - $LOAD_START }") s for $KEYS values of $VALUE_SIZE bytes"
  sleep 2
  kill $SERVER
  wait $SERVER || true
  if [ -n "${LOAD_ONLY:-}" ]; then
    SERVER=
    exit 0
  fi
fi
start
# Serving (a large state takes seconds to open) before the page cache goes and the clock starts.
for _ in $(seq 600); do
  curl -sf $EP/health > /dev/null && break
  sleep 0.2
done
sleep 1
if [ -z "${WARM:-}" ]; then
  sync
  echo 3 > /proc/sys/vm/drop_caches
fi
if [ -n "${TRACE:-}" ]; then
  perf record -e sched:sched_switch --call-graph dwarf,8192 -p $SERVER -o "$D/perf.data" \
    > "$D/perf.out" 2>&1 &
  PERF=$!
  sleep 1
fi
paced() {
  "$BENCH" "$1" --endpoints $EP --clients 8 --conns 4 --rate 1000 --duration 12s \
    --value-size "$VALUE_SIZE" --key-space "$KEYS" --json --slow-ms "${SLOW_MS:-50}" "${@:2}" \
    > "$D/$1.json" 2> "$D/$1.slow"
}
if [ -n "${SYSMON:-}" ]; then
  (cd "$D" && python3 "$MONITOR" 14 system.mon > system.frozen) &
  MON=$!
fi
paced put &
PUT=$!
paced range --no-prefill &
RANGE=$!
if [ -n "${DEFRAG:-}" ]; then
  sleep 4
  DEFRAG_START=$(date +%s.%N)
  "${ETCDCTL:-.etcd-ref/bin/etcd-ref/etcdctl}" --endpoints $EP --command-timeout 600s defrag \
    > "$D/defrag.out" 2>&1
  echo "defrag: $(awk "BEGIN { print $(date +%s.%N) - $DEFRAG_START }") s, from 4 s into the phase"
fi
wait $PUT
wait $RANGE
if [ -n "${SYSMON:-}" ]; then
  wait $MON || true
  cat "$D/system.frozen"
fi
if [ -n "${TRACE:-}" ]; then
  kill -INT $PERF
  wait $PERF || true
fi
kill $SERVER
wait $SERVER || true
SERVER=
for w in put range; do
  echo "$w: $(tail -1 "$D/$w.json")"
done
