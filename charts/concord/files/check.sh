#!/bin/sh
# `helm test`: every member healthy, then a write read back through every member, then removed.
set -eu
. /opt/concord/chart/lib.sh
: "${CHART_REPLICAS:?}"
eps=$(endpoints "$CHART_REPLICAS")
# Every member by name rather than `--cluster`: etcdctl before 3.5.29 asks for the member list
# without credentials there, which etcd 3.5.28 and Concord refuse while auth is on.
ctl --endpoints "$eps" endpoint health
key="/concord-chart-test/$(date -u +%s)-$$"
ctl --endpoints "$eps" put "$key" ok
i=0
while [ "$i" -lt "$CHART_REPLICAS" ]; do
  got=$(ctl --endpoints "$(client_url "$i")" get "$key" --print-value-only)
  [ "$got" = ok ] || { log "member $i read '$got' for $key"; exit 1; }
  i=$((i + 1))
done
ctl --endpoints "$eps" del "$key" >/dev/null
ctl --endpoints "$eps" endpoint status -w table
log "healthy: $CHART_REPLICAS members answered and agreed"
