#!/bin/sh
# Starts one member of the StatefulSet; the container's arguments are the member's flags.
#
# The cluster's `member list` decides, read from the other members. A member's line there is
# "<id>, <started|unstarted>, <name>, <peer URLs>, <client URLs>, <is learner>"; it has run once
# it has published its client URLs (the name alone comes from --initial-cluster).
#
# - Data on the volume: the member restarts on it, as `existing` if it never ran (a first start
#   that stopped before it joined). If the cluster answers and no longer lists it, it was
#   removed by a scale-down: it waits to be deleted rather than fail in a loop.
# - No data, first install, no member answers: members 0..replicas-1 bootstrap the cluster
#   together (--initial-cluster-state new); with restore on, member 0 alone bootstraps it from
#   the snapshot and the others join it. Concord itself refuses to bootstrap a member that its
#   peers say has run before.
# - No data and the cluster answers: the member joins (`existing`), after `etcdctl member add`
#   unless the cluster lists it already (a member of the first start that came late). A member
#   that ran before but lost its data, or was left a learner by a failed add, is removed and
#   added anew: a Raft member must never forget its log and votes.
set -eu
. /opt/concord/chart/lib.sh
: "${POD_NAME:?}" "${ETCD_DATA_DIR:?}"
# Until concord replaces this shell, a pod deletion must not wait out the grace period.
trap 'exit 0' TERM INT
ordinal=${POD_NAME##*-}
replicas=$(cat /opt/concord/chart/replicas)
first_install=$(cat /opt/concord/chart/first-install)
size=$replicas
[ "$ordinal" -lt "$size" ] || size=$((ordinal + 1))
me=$(peer_url "$ordinal")
others=$(endpoints "$size" "$ordinal")
export ETCD_INITIAL_CLUSTER="${ETCD_INITIAL_CLUSTER:-$(initial_cluster "$size")}"

# This member's line of `member list` in $line (empty if not listed); returns 2 when no member
# answers. A line with this member's name but another peer URL is an error: the chart's naming
# values (TLS, ports, domain, names) changed under a running cluster.
find_self() {
  line=""
  [ -n "$others" ] || return 2
  list=$(ctl --endpoints "$others" --command-timeout=5s member list 2>/dev/null) || return 2
  line=$(printf '%s\n' "$list" | grep -F ", $me," || true)
  if [ -z "$line" ] && printf '%s\n' "$list" | grep -qF ", $POD_NAME, "; then
    log "the cluster lists $POD_NAME with other peer URLs than $me: the peer scheme, port," \
      "domain or names changed; change them back (they cannot change under a running cluster)"
    exit 1
  fi
}

# Whether $line's member has run (published its client URLs).
has_run() {
  [ -n "$(printf '%s\n' "$line" | cut -d, -f5 | tr -d ' ')" ]
}

if [ -n "$(ls -A "$ETCD_DATA_DIR" 2>/dev/null)" ]; then
  status=0
  find_self || status=$?
  if [ "$status" = 0 ] && [ -z "$line" ]; then
    log "$POD_NAME has data but the cluster no longer lists it (removed by a scale-down):" \
      "waiting to be deleted; to bring it back, delete its data (its PVC) and restart it"
    while :; do sleep 5; done
  fi
  if [ "$status" = 0 ] && ! has_run; then
    export ETCD_INITIAL_CLUSTER_STATE=existing
  fi
  exec concord "$@"
fi

for try in 1 2 3; do
  status=0
  find_self && break || status=$?
  sleep 1
done
if [ "$status" = 2 ]; then
  if [ "$first_install" != true ]; then
    log "no member answers and this is not the first install: waiting for the cluster"
    exit 1
  fi
  [ "$ordinal" -lt "$replicas" ] || { log "no member answers and $POD_NAME is not a founder"; exit 1; }
  export ETCD_INITIAL_CLUSTER_STATE=new
  if [ -n "${CHART_RESTORE_FILE:-}" ]; then
    if [ "$ordinal" != 0 ]; then
      log "restore: waiting for member 0 to bootstrap from the snapshot, then joining it"
      exit 1
    fi
    snapshot="/opt/concord/restore/$CHART_RESTORE_FILE"
    [ -f "$snapshot" ] || { log "restore: $snapshot does not exist"; exit 1; }
    export ETCD_INITIAL_CLUSTER="$POD_NAME=$me"
    rmdir "$ETCD_DATA_DIR" 2>/dev/null || true
    log "restoring $snapshot into $ETCD_DATA_DIR"
    concord snapshot restore "$snapshot" --name "$POD_NAME" \
      --initial-cluster "$ETCD_INITIAL_CLUSTER" --initial-cluster-token "$ETCD_INITIAL_CLUSTER_TOKEN" \
      --initial-advertise-peer-urls "$me" --data-dir "$ETCD_DATA_DIR"
  fi
  log "bootstrapping a new cluster: $ETCD_INITIAL_CLUSTER"
  exec concord "$@"
fi

if [ -n "$line" ] && { has_run || [ "$(printf '%s\n' "$line" | cut -d, -f6 | tr -d ' ')" = true ]; }; then
  id=${line%%,*}
  log "the cluster lists $POD_NAME ($id) as having run, or as a learner, but its data dir is" \
    "empty: removing it and adding it anew"
  ctl --endpoints "$others" member remove "$id"
  line=""
fi
# Added, start at once: a cluster of one that just added this member has no quorum (and can
# list nothing) until this member runs.
while [ -z "$line" ]; do
  if out=$(ctl --endpoints "$others" member add "$POD_NAME" --peer-urls="$me" 2>&1); then
    log "added $POD_NAME to the cluster"
    break
  fi
  case "$out" in
  *"Peer URLs already exists"*)
    log "$POD_NAME was added already"
    break
    ;;
  esac
  log "member add: $out"
  sleep 2
  find_self || true
done
export ETCD_INITIAL_CLUSTER_STATE=existing
log "joining the running cluster"
exec concord "$@"
