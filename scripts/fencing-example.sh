#!/usr/bin/env bash
# Runs examples/fencing.rs against a fresh single-member Concord and checks that the paused
# holder's late write was rejected.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --bins --example fencing
dir=$(mktemp -d)
port=$((20000 + RANDOM % 10000))
target/debug/concord --data-dir "$dir/data" --log-level warn \
  --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
  --initial-cluster "default=http://127.0.0.1:$((port + 1))" 2>"$dir/log" &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.2
done
out=$(timeout 60 target/debug/examples/fencing "http://127.0.0.1:$port")
echo "$out"
grep -q "late write rejected" <<<"$out"
echo "fencing example: 1 passed, 0 failed"
