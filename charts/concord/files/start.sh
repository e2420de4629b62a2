#!/bin/sh
# Starts one member of the StatefulSet; the container's arguments are the member's flags.
#
# - A data dir already written: the member restarts on it (unless the cluster answers and no
#   longer lists it: removed by a scale-down, it waits to be deleted rather than fail in a loop).
# - An empty data dir and no member answers: the first start of the cluster; members
#   0..replicas-1 bootstrap it together (--initial-cluster-state new), from the snapshot in
#   /opt/concord/restore when restore is on.
# - An empty data dir and the cluster answers: this member joins it (--initial-cluster-state
#   existing), after `etcdctl member add` unless the cluster already lists it (a member of the
#   first start that came late). A member that the cluster lists as started but that lost its
#   data is removed and added anew: a Raft member must not forget its log and votes.
set -eu
. /opt/concord/chart/lib.sh
: "${POD_NAME:?}" "${ETCD_DATA_DIR:?}"
ordinal=${POD_NAME##*-}
replicas=$(cat /opt/concord/chart/replicas)
size=$replicas
[ "$ordinal" -lt "$size" ] || size=$((ordinal + 1))
me=$(peer_url "$ordinal")
others=$(endpoints "$size" "$ordinal")
export ETCD_INITIAL_CLUSTER="${ETCD_INITIAL_CLUSTER:-$(initial_cluster "$size")}"

# This member's line of `member list` ("<id>, <started|unstarted>, <name>, <peer URLs>, ...")
# in $line; returns 2 when no member answers.
find_self() {
  [ -n "$others" ] || return 2
  list=$(ctl --endpoints "$others" --command-timeout=5s member list 2>/dev/null) || return 2
  line=$(printf '%s\n' "$list" | grep -F ", $me," || true)
}

if [ -n "$(ls -A "$ETCD_DATA_DIR" 2>/dev/null)" ]; then
  status=0
  find_self || status=$?
  if [ "$status" = 0 ] && [ -z "$line" ]; then
    log "$POD_NAME has data but the cluster no longer lists it (removed by a scale-down):" \
      "waiting to be deleted; to bring it back, delete its data (its PVC) and restart it"
    while :; do sleep 3600; done
  fi
  exec concord "$@"
fi

for try in 1 2 3; do
  status=0
  find_self && break || status=$?
  sleep 1
done
if [ "$status" = 2 ]; then
  [ "$ordinal" -lt "$replicas" ] || { log "no member answers and $POD_NAME is not a founder"; exit 1; }
  export ETCD_INITIAL_CLUSTER_STATE=new
  if [ -f "/opt/concord/restore/${CHART_RESTORE_FILE:-}" ] && [ -n "${CHART_RESTORE_FILE:-}" ]; then
    log "restoring $CHART_RESTORE_FILE into $ETCD_DATA_DIR"
    concord snapshot restore "/opt/concord/restore/$CHART_RESTORE_FILE" --name "$POD_NAME" \
      --initial-cluster "$ETCD_INITIAL_CLUSTER" --initial-cluster-token "$ETCD_INITIAL_CLUSTER_TOKEN" \
      --initial-advertise-peer-urls "$me" --data-dir "$ETCD_DATA_DIR"
  fi
  log "bootstrapping a new cluster: $ETCD_INITIAL_CLUSTER"
  exec concord "$@"
fi

case "$line" in
*", started, "*)
  id=${line%%,*}
  log "the cluster lists $POD_NAME as started ($id) but its data dir is empty: removing and adding it anew"
  ctl --endpoints "$others" member remove "$id"
  line=""
  ;;
esac
while [ -z "$line" ]; do
  if ctl --endpoints "$others" member add "$POD_NAME" --peer-urls="$me" >/dev/null; then
    log "added $POD_NAME to the cluster"
  fi
  find_self || true
  [ -n "$line" ] || sleep 2
done
export ETCD_INITIAL_CLUSTER_STATE=existing
log "joining the running cluster"
exec concord "$@"
