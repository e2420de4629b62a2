#!/bin/sh
# Post-install/upgrade hook: creates user root with role root and turns auth on (once).
set -eu
. /opt/concord/chart/lib.sh
: "${CHART_REPLICAS:?}" "${CHART_ROOT_PASSWORD:?}"
eps=$(endpoints "$CHART_REPLICAS")
for try in $(seq 1 60); do
  if status=$(ctl --endpoints "$eps" auth status 2>/dev/null); then
    break
  fi
  sleep 2
done
case "${status:-}" in
*"Authentication Status: true"*)
  log "auth is already on"
  exit 0
  ;;
"")
  log "no member answers at $eps"
  exit 1
  ;;
esac
if ! etcdctl --endpoints "$eps" user get root >/dev/null 2>&1; then
  etcdctl --endpoints "$eps" user add root --new-user-password="$CHART_ROOT_PASSWORD" --interactive=false
fi
etcdctl --endpoints "$eps" user grant-role root root
etcdctl --endpoints "$eps" auth enable
