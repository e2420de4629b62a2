# Shared by the chart's scripts (POSIX sh): where the members are and how to ask them.
# Needs CHART_BASE, CHART_DOMAIN, CHART_{CLIENT,PEER}_{SCHEME,PORT}; CHART_ROOT_PASSWORD with auth.

# The peer URL of member <ordinal>.
peer_url() {
  echo "$CHART_PEER_SCHEME://$CHART_BASE-$1.$CHART_DOMAIN:$CHART_PEER_PORT"
}

# The client URL of member <ordinal>.
client_url() {
  echo "$CHART_CLIENT_SCHEME://$CHART_BASE-$1.$CHART_DOMAIN:$CHART_CLIENT_PORT"
}

# --initial-cluster for members 0..<count>-1.
initial_cluster() {
  i=0 out=""
  while [ "$i" -lt "$1" ]; do
    out="$out${out:+,}$CHART_BASE-$i=$(peer_url "$i")"
    i=$((i + 1))
  done
  echo "$out"
}

# Client URLs of members 0..<count>-1, except member <skip> (comma-separated).
endpoints() {
  i=0 out=""
  while [ "$i" -lt "$1" ]; do
    [ "$i" = "${2:-}" ] || out="$out${out:+,}$(client_url "$i")"
    i=$((i + 1))
  done
  echo "$out"
}

# etcdctl with root's credentials when auth is on (etcdctl ignores them while auth is off);
# through the environment, so that the password is in no process's command line.
ctl() {
  if [ -n "${CHART_ROOT_PASSWORD:-}" ]; then
    ETCDCTL_USER="root:$CHART_ROOT_PASSWORD" etcdctl "$@"
  else
    etcdctl "$@"
  fi
}

log() {
  echo "concord-chart: $*" >&2
}
