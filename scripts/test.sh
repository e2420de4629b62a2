#!/usr/bin/env bash
# Runs every test: formatting and lints, unit and integration tests (real processes, a 3-member
# cluster with kill -9), the differential etcdctl tests against reference etcd 3.5.1 with
# etcdctl 3.5 and 3.4 (auth included), on one member and on three, and over TLS with etcdctl 3.5
# (openssl-made certificates and client-cert auth on three members, --auto-tls on one), the
# operator commands on three members, the benchmark tools with and without auth, and the fault
# suite's failover check and short mode (every fault kind against a 3-member cluster in network
# namespaces; needs root), and the Helm chart (linted, schema-checked, and the pods it renders
# run as processes). Installs what it needs by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=$(scripts/install-test-tools.sh)
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo build --bins
# Integration tests start real clusters (3 processes each, 500 ms election timeouts): two at a
# time on 2 cores; three at once starved members into missed elections in 2 of 4 CI runs.
cargo test -- --test-threads 2
ctls=(--etcdctl "$ref/etcdctl")
[[ -x /usr/bin/etcdctl ]] && ctls+=(--etcdctl /usr/bin/etcdctl)
scripts/fencing-example.sh
python3 etcdctl-tests/difftest.py --server target/debug/concord --etcd-dir "$ref" --cluster 1 "${ctls[@]}"
python3 etcdctl-tests/difftest.py --server target/debug/concord --etcd-dir "$ref" --cluster 3 "${ctls[@]}"
python3 etcdctl-tests/difftest.py --server target/debug/concord --etcd-dir "$ref" --cluster 3 --tls certs --etcdctl "$ref/etcdctl"
python3 etcdctl-tests/difftest.py --server target/debug/concord --etcd-dir "$ref" --cluster 1 --tls auto --etcdctl "$ref/etcdctl"
# Operator commands (member, endpoint, alarm, defrag, snapshot, move-leader) on 3 members each.
python3 etcdctl-tests/opstest.py --server target/debug/concord --etcd-dir "$ref"
[[ -x /usr/bin/etcdctl ]] && python3 etcdctl-tests/opstest.py --server target/debug/concord --etcd-dir "$ref" --etcdctl /usr/bin/etcdctl
# The load tool and the comparison script still work (one short round; numbers are meaningless
# on a debug build, see benches/RESULTS.md for real ones).
python3 benches/compare.py --smoke --etcd-dir "$ref" --concord target/debug/concord --bench target/debug/concord-bench
python3 benches/compare.py --smoke --auth --etcd-dir "$ref" --concord target/debug/concord --bench target/debug/concord-bench
# Failover: a SIGSTOPped or partitioned-away leader is replaced (and writes succeed on the other
# members) while it is still silent; a follower back from a partition does not depose the leader.
target/debug/concord-faults --mode failover
# Fault injection: kill -9, SIGSTOP, partitions, full crash, slow disk; histories checked.
target/debug/concord-faults --mode short
# The Helm chart: lint and Kubernetes 1.29-1.37 schemas of every values variant, the Dockerfile's
# checks, then the pods it renders run as real processes in network namespaces (defaults; TLS
# with auth, backups, defrag and a restore): install, helm test, scale 3 -> 5 -> 3, a lost volume.
k8s=$(scripts/install-k8s-tools.sh)
"$k8s/python" charts/test/chart_test.py --tools "$k8s" --etcdctl "$ref/etcdctl" --concord target/debug/concord
