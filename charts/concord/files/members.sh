#!/bin/sh
# Pre-upgrade hook: before the StatefulSet shrinks to CHART_REPLICAS pods, removes the members
# of the ordinals it drops (highest first), so the cluster's quorum never counts a deleted pod.
# Members that a scale-up adds join by themselves (start.sh).
set -eu
. /opt/concord/chart/lib.sh
: "${CHART_REPLICAS:?}"
eps=$(endpoints "$CHART_REPLICAS")
list=$(ctl --endpoints "$eps" --command-timeout=10s member list) || {
  log "cannot list the members at $eps"
  exit 1
}
printf '%s\n' "$list" | while IFS= read -r line; do
  id=${line%%,*}
  url=$(printf '%s\n' "$line" | cut -d, -f4 | tr -d ' ')
  case "$url" in
  "$CHART_PEER_SCHEME://$CHART_BASE-"*".$CHART_DOMAIN:$CHART_PEER_PORT") ;;
  *) continue ;;
  esac
  ordinal=${url#"$CHART_PEER_SCHEME://$CHART_BASE-"}
  ordinal=${ordinal%%.*}
  printf '%s %s\n' "$ordinal" "$id"
done | sort -rn | while read -r ordinal id; do
  if [ "$ordinal" -ge "$CHART_REPLICAS" ]; then
    log "removing member $id ($CHART_BASE-$ordinal): the StatefulSet shrinks to $CHART_REPLICAS"
    ctl --endpoints "$eps" --command-timeout=30s member remove "$id"
  fi
done
