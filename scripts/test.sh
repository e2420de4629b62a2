#!/usr/bin/env bash
# Runs every test: formatting and lints, unit and integration tests (real processes, a 3-member
# cluster with kill -9), the differential etcdctl tests against reference etcd 3.5.1 with
# etcdctl 3.5 and 3.4 (auth included), on one member and on three, and over TLS with etcdctl 3.5
# (openssl-made certificates and client-cert auth on three members, --auto-tls on one), random
# raw KV and lease requests compared with etcd 3.5.1's answers, the
# operator commands on three members, the benchmark tools with and without auth, and the fault
# suite's failover check and short mode (every fault kind against a 3-member cluster in network
# namespaces; needs root), and the Helm chart (linted, schema-checked, and the pods it renders
# run as processes), and Kubernetes' own storage tests (k8s.io/apiserver's etcd3 store and watch
# cache) against Concord on one and three members and reference etcd 3.6, and a real
# kube-apiserver on three members when it has been built. Installs what it needs by itself (Go
# must be there: it builds etcd 3.6 and the Kubernetes tests).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
step() { echo "=== [$(((SECONDS - started) / 60))m$(((SECONDS - started) % 60))s] $*" >&2; }
ref=$(scripts/install-test-tools.sh)
step "lints"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
# The grpc-go 1.72.0 stress (run by hand, README "Kubernetes' own storage tests") still builds.
(cd k8s-tests/grpc172 && go vet .)
step "build"
cargo build --bins
step "cargo tests"
# Integration tests start real clusters (3 processes each, 500 ms election timeouts): two at a
# time on 2 cores; three at once starved members into missed elections in 2 of 4 CI runs.
cargo test -- --test-threads 2
# Kubernetes' storage tests mostly wait (every test starts fresh servers): they run in the
# background while the etcdctl tests below do, and are waited for before the fault suite.
step "Kubernetes storage tests started"
# (On three members apiserver's tests run by hand, and so do the watch cache's on etcd 3.6:
# README, "Kubernetes' own storage tests". Three members of each per test load CI's 2 cores.)
# Every client connection goes through wirecheck, which fails a test on an HTTP/2 flow-control
# overrun or a stream ended mid-message (`Internal: unexpected EOF` in grpc-go); concord-1-tls
# serves TLS with client certificates as kubeadm sets etcd up, and wirecheck ends TLS on both
# sides to read the frames.
STORAGE_SUITE_WIRECHECK=1 setsid k8s-tests/storage/run.sh concord-1=target/debug/concord \
  concord-3=target/debug/concord:3:largeobjects,controlplane \
  concord-1-tls=target/debug/concord:1:largeobjects,controlplane:tls \
  etcd-3.6="$ref/../etcd-3.6/etcd":1:etcd3,largeobjects,controlplane > target/k8s-storage.log 2>&1 &
storage=$!
# etcd -> Concord -> etcd through etcd's snapshot file, every revision kept, with etcd 3.5.1
# and 3.6 (50,000 objects by hand: README, "Migrate from etcd"); then the Helm chart: lint and
# Kubernetes 1.29-1.37 schemas of every values variant, the Dockerfile's checks, then the pods it
# renders run as real processes in network namespaces (defaults; TLS with auth, backups, defrag
# and a restore): install, helm test, scale 3 -> 5 -> 3, a lost volume. Also in the background:
# both are mostly process starts and waits.
setsid bash -c 'set -e
  python3 etcdctl-tests/migrate_test.py --server target/debug/concord --etcd-dir "$1" --objects 5000
  python3 etcdctl-tests/migrate_test.py --server target/debug/concord --etcd-dir "$1/../etcd-3.6" \
    --objects 1000 --members 1
  echo "=== Helm chart"
  k8s=$(scripts/install-k8s-tools.sh)
  "$k8s/python" charts/test/chart_test.py --tools "$k8s" --etcdctl "$1/etcdctl" \
    --concord target/debug/concord' _ "$ref" > target/migrate.log 2>&1 &
migrate=$!
# If a step below fails, its servers and tests go too (setsid made each a process group).
trap 'kill -- -"$storage" 2>/dev/null || true; kill -- -"$migrate" 2>/dev/null || true' EXIT
step "etcdctl tests"
ctls=(--etcdctl "$ref/etcdctl")
[[ -x /usr/bin/etcdctl ]] && ctls+=(--etcdctl /usr/bin/etcdctl)
scripts/fencing-example.sh
python3 etcdctl-tests/difftest.py --server target/debug/concord --etcd-dir "$ref" --cluster 1 "${ctls[@]}"
step "random requests against etcd"
# Random KV and lease requests, raw (every field), to etcd 3.5.1 and Concord, every answer, two
# watches' events, every revision kept and HashKV compared (more seeds by hand: --seeds 1-200).
(cd etcdctl-tests/kvfuzz && go vet . && go test . && go build -o ../../target/kvfuzz . &&
  ../../target/kvfuzz --etcd "$ref/etcd" --concord ../../target/debug/concord --seeds 1-15 --steps 500 &&
  ../../target/kvfuzz --etcd "$ref/etcd" --concord ../../target/debug/concord --seeds 1-4 --steps 500 --members 3)
step "etcdctl tests on three members"
# etcdctl 3.4 on one member only: what it adds is its own client side, not the cluster's.
# Three members run every scenario once, over TLS with client certificates (kubeadm's setup):
# the plain-text transport is what the one-member run above covers. --auto-tls gets a sample
# of each kind (its certificates are what differs, not the scenarios' server paths).
python3 etcdctl-tests/difftest.py --server target/debug/concord --etcd-dir "$ref" --cluster 3 --tls certs --etcdctl "$ref/etcdctl"
python3 etcdctl-tests/difftest.py --server target/debug/concord --etcd-dir "$ref" --cluster 1 --tls auto --etcdctl "$ref/etcdctl" \
  -k put_simple -k get_prefix -k txn_ops_inside -k watch_single_key -k lease_keepalive -k lock_contended -k elect_campaign -k auth_
step "operator commands"
# Operator commands (member, endpoint, alarm, defrag, snapshot, move-leader) on 3 members each.
python3 etcdctl-tests/opstest.py --server target/debug/concord --etcd-dir "$ref"
[[ -x /usr/bin/etcdctl ]] && python3 etcdctl-tests/opstest.py --server target/debug/concord --etcd-dir "$ref" --etcdctl /usr/bin/etcdctl
step "benchmark tools"
# The load tool and the comparison script still work (one short round; numbers are meaningless
# on a debug build, see benches/RESULTS.md for real ones).
python3 benches/compare.py --smoke --etcd-dir "$ref" --concord target/debug/concord --bench target/debug/concord-bench
python3 benches/compare.py --smoke --auth --workloads put,lock --no-fixed --etcd-dir "$ref" \
  --concord target/debug/concord --bench target/debug/concord-bench
(cd benches/controlplane && go vet ./... && go test ./... &&
  go run . --server concord=../../target/debug/concord --server etcd-3.6="$ref/../etcd-3.6/etcd" \
    --objects 500 --duration 2s --watches 10 --update-rate 20)
step "waiting for the Kubernetes storage, migration and Helm chart tests"
if ! wait "$storage"; then
  tail -n 200 target/k8s-storage.log
  exit 1
fi
if ! wait "$migrate"; then
  tail -n 200 target/migrate.log
  exit 1
fi
trap - EXIT
cat target/migrate.log
sed -n '/^| server/,$p' target/k8s-storage.log
# A real kube-apiserver 1.37 on three members over TLS, driven with kubectl and a short
# control-plane load (when it is built: k8s-tests/apiserver/build.sh, ~7 min once per machine).
step "kube-apiserver on Concord"
k8s-tests/apiserver/run.sh target/debug/concord
step "fault suite"
# Failover: a SIGSTOPped or partitioned-away leader is replaced (and writes succeed on the other
# members) while it is still silent; a follower back from a partition does not depose the leader.
target/debug/concord-faults --mode failover
# Fault injection: kill -9, SIGSTOP, partitions, full crash, slow disk; histories checked.
target/debug/concord-faults --mode short
step "all tests passed"
