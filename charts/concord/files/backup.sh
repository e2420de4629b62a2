#!/bin/sh
# Backup CronJob: `etcdctl snapshot save` into /backups, keeping the newest CHART_BACKUP_KEEP.
set -eu
. /opt/concord/chart/lib.sh
: "${CHART_REPLICAS:?}" "${CHART_BACKUP_KEEP:?}"
name="$CHART_BASE-$(date -u +%Y%m%dT%H%M%SZ).db"
# snapshot save takes one endpoint: the first member that answers.
i=0
while [ "$i" -lt "$CHART_REPLICAS" ]; do
  # etcdctl writes <name>.part and renames it when the snapshot is whole.
  if ctl --endpoints "$(client_url "$i")" snapshot save "/backups/$name" >&2; then
    log "saved /backups/$name"
    ls -1 /backups/"$CHART_BASE"-2*.db | sort -r | tail -n +"$((CHART_BACKUP_KEEP + 1))" |
      while IFS= read -r old; do
        rm -f -- "$old"
        log "removed $old"
      done
    exit 0
  fi
  rm -f "/backups/$name.part"
  i=$((i + 1))
done
log "no member could save a snapshot"
exit 1
