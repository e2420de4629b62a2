#!/usr/bin/env python3
"""Validates charts/concord and runs what it renders (needs root, `ip netns`, helm,
kubernetes-validate; `scripts/install-k8s-tools.sh` installs the last two).

1. `helm lint --strict` and `helm template` for the defaults and every values file in
   charts/concord/ci/, each manifest checked by `kubernetes-validate --strict` against
   Kubernetes 1.29 to 1.37 (custom resources, cert-manager's and Prometheus Operator's, have no
   bundled schema and are skipped by it with a warning).
2. For the defaults and for TLS with auth: the StatefulSet's pods started as real processes
   (charts/test/pods.py) must form a cluster; the post-install hooks and the `helm test` pod must
   pass; keys are written; a scale-up to 5 and back to 3 through the chart's own hooks and start
   script keeps every key; a member that lost its volume rejoins; the backup CronJob's job saves
   a snapshot, and a new release restored from it (restore.enabled) serves the same keys.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pods  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(ROOT, "charts", "concord")
NAMESPACE = "default"
KUBE_VERSIONS = [f"1.{m}.0" for m in range(29, 38)]


def helm(tools, *args):
    out = subprocess.run([f"{tools}/helm", *args], text=True, capture_output=True)
    if out.returncode != 0:
        raise SystemExit(f"helm {' '.join(args)} failed:\n{out.stdout}{out.stderr}")
    return out.stdout


def render(tools, release, values_files=(), sets=(), upgrade=False):
    """`helm template` as a dict (kind, name) -> object, hooks and tests included; as for an
    upgrade (`.Release.IsInstall` false) when `upgrade`."""
    args = ["template", release, CHART, "--namespace", NAMESPACE]
    if upgrade:
        args.append("--is-upgrade")
    for f in values_files:
        args += ["-f", f]
    for s in sets:
        args += ["--set", s]
    docs = [d for d in yaml.safe_load_all(helm(tools, *args)) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def validate(tools):
    """Lint and schema checks of every values variant."""
    variants = [[]] + [[f] for f in sorted(glob.glob(f"{CHART}/ci/*-values.yaml"))]
    for v in variants:
        label = os.path.basename(v[0]) if v else "defaults"
        args = [a for f in v for a in ("-f", f)]
        helm(tools, "lint", "--strict", CHART, *args)
        manifest = helm(tools, "template", "r", CHART, "--namespace", NAMESPACE, *args)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(manifest)
        try:
            for kv in KUBE_VERSIONS:
                out = subprocess.run(
                    [f"{tools}/kubernetes-validate", "--strict", "--quiet", "-k", kv, f.name],
                    text=True, capture_output=True)
                if out.returncode != 0:
                    raise SystemExit(f"{label}: invalid for Kubernetes {kv}:\n{out.stdout}{out.stderr}")
        finally:
            os.unlink(f.name)
        kinds = sorted({d["kind"] for d in yaml.safe_load_all(manifest) if d})
        print(f"chart: {label}: lint and schemas (Kubernetes 1.29-1.37) ok: {', '.join(kinds)}")
    # Bad values fail at install: the schema is enforced.
    for bad in ["replicaCount=0", "replicaCount=two", "podAntiAffinity=always", "bogus=1",
                "restore.enabled=true", "extraArgs[0]=no-dashes", "tls.certManager.enabled=true"]:
        out = subprocess.run([f"{tools}/helm", "template", "r", CHART, "--set", bad],
                             text=True, capture_output=True)
        if out.returncode == 0:
            raise SystemExit(f"values.schema.json let {bad} through")
    print("chart: values.schema.json refuses bad values")
    # The chart's README lists every value.
    readme = open(f"{CHART}/README.md").read()
    missing = [p for p in value_paths(yaml.safe_load(open(f"{CHART}/values.yaml")))
               if f"| `{p}` |" not in readme]
    if missing:
        raise SystemExit(f"charts/concord/README.md does not list the values {missing}")
    print("chart: README lists every value")


# Values documented as a whole, not key by key.
WHOLE_VALUES = {"flags", "resources", "podSecurityContext", "securityContext"}


def value_paths(values, prefix=""):
    """Every value's dotted path (maps are descended into, except WHOLE_VALUES and empty ones)."""
    for k, v in values.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v and path not in WHOLE_VALUES:
            yield from value_paths(v, path)
        else:
            yield path


def check_dockerfile(concord):
    """What can be checked of the image without building it: the toolchain is the one the
    tests use, it copies the release build and etcdctl, runs as the chart's user with the
    chart's ports, and its default command starts a working member."""
    text = open(f"{ROOT}/Dockerfile").read().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    rustc = subprocess.run(["rustc", "--version"], text=True, capture_output=True).stdout.split()[1]
    want = f"FROM rust:{'.'.join(rustc.split('.')[:2])}-"
    problems = []
    if not any(line.startswith(want) for line in lines):
        problems.append(f"the build stage is not on rustc {rustc} ({want}...)")
    if "RUN cargo build --release --locked --bin concord" not in lines:
        problems.append("the image does not build the release binary")
    if not any(line.startswith("COPY --from=build /src/target/release/concord /usr/local/bin/concord")
               for line in lines):
        problems.append("the image does not copy the release binary to /usr/local/bin")
    if not any(line.endswith("/usr/local/bin/etcdctl /usr/local/bin/etcdctl") for line in lines):
        problems.append("the image has no etcdctl (the chart's scripts need it)")
    values = yaml.safe_load(open(f"{CHART}/values.yaml"))
    uid = values["podSecurityContext"]["runAsUser"]
    if f"USER {uid}:{uid}" not in lines:
        problems.append(f"the image's user is not the chart's ({uid})")
    ports = " ".join(str(values["ports"][k]) for k in ("client", "peer", "metrics"))
    if f"EXPOSE {ports}" not in lines:
        problems.append(f"the image does not expose the chart's ports {ports}")
    entry = next(json.loads(line[len("ENTRYPOINT"):]) for line in lines if line.startswith("ENTRYPOINT"))
    cmd = next(json.loads(line[len("CMD"):]) for line in lines if line.startswith("CMD"))
    if entry != ["concord"]:
        problems.append(f"the entrypoint is {entry}, not concord")
    if problems:
        raise SystemExit("Dockerfile: " + "; ".join(problems))
    # The default command, with its data dir and ports moved to a scratch folder and free ports.
    with tempfile.TemporaryDirectory() as d:
        args = [a.replace("/var/lib/concord", d).replace(":2379", ":32379").replace(":2380", ":32380")
                .replace(":2381", ":32381") for a in cmd]
        p = subprocess.Popen([concord, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(100):
                try:
                    with urllib.request.urlopen("http://127.0.0.1:32381/readyz", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.2)
            else:
                raise SystemExit(f"Dockerfile: the default command {cmd} did not start a ready member")
        finally:
            p.terminate()
            p.wait()
    print(f"chart: Dockerfile: rustc {rustc}, release build, etcdctl, user {uid}, ports {ports}; "
          "its default command starts a ready member")


def make_certs(work, domain, service):
    """A CA and one certificate (server and client use, CN root) for every member name."""
    d = f"{work}/certs"
    os.makedirs(d)
    san = f"DNS:*.{domain},DNS:{service},DNS:localhost,IP:127.0.0.1"

    def ssl(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)

    ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=chart-test-ca")
    ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=root")
    with open(f"{d}/ext.cnf", "w") as f:
        f.write(f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n")
    ssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "tls.crt", "-days", "2", "-extfile", "ext.cnf")
    os.chmod(f"{d}/tls.key", 0o644)
    return {k: open(f"{d}/{k}", "rb").read() for k in ("ca.crt", "tls.crt", "tls.key")}


class Release:
    """One release's pods, jobs and volumes, driven the way Kubernetes would drive them."""

    def __init__(self, tools, work, net, bin_dir, name, values, secrets):
        self.tools, self.work, self.net, self.name = tools, work, net, name
        self.values = values  # --set strings
        self.objects = render(tools, name, sets=values)
        self.kubelet = pods.Kubelet(work, net, self.objects, bin_dir, secrets)
        self.members = {}
        self.jobs = 0

    @property
    def sts(self):
        return next(o for (k, _), o in self.objects.items() if k == "StatefulSet")

    def replicas(self):
        return self.sts["spec"]["replicas"]

    def pod_dns(self, pod):
        return f"{pod}.{self.sts['spec']['serviceName']}.{NAMESPACE}.svc.cluster.local"

    def start_member(self, ordinal):
        pod = f"{self.sts['metadata']['name']}-{ordinal}"
        claims = [c["metadata"]["name"] for c in self.sts["spec"].get("volumeClaimTemplates", [])]
        self.members[ordinal] = self.kubelet.start(
            pod, self.sts["spec"]["template"]["spec"], NAMESPACE, pod, 10 + ordinal,
            [self.pod_dns(pod), pod], claims=claims)

    def wait_ready(self, ordinals, timeout=120):
        port = self.sts["spec"]["template"]["spec"]["containers"][0]["ports"][2]["containerPort"]
        path = self.sts["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"]
        deadline = time.time() + timeout
        while time.time() < deadline:
            if all(self.members[o].http_ok(port, path) for o in ordinals):
                return
            time.sleep(0.5)
        self.fail(f"members {ordinals} not ready within {timeout} s")

    def run_pod(self, spec, what, timeout=180):
        """Runs a job's or test's pod to completion; retries as restartPolicy OnFailure would."""
        self.jobs += 1
        attempts = 1 if spec.get("restartPolicy") == "Never" else 4
        for attempt in range(attempts):
            pod = f"{what}-{self.jobs}-{attempt}".replace(" ", "-")
            p = self.kubelet.start(pod, spec, NAMESPACE, "jobs", 5, [], restart=False)
            code = p.wait(timeout)
            if code == 0:
                print(f"chart: {what}: ok\n{indent(p.log(20))}")
                return p
            print(f"chart: {what}: exit {code}, attempt {attempt + 1}\n{indent(p.log())}")
        self.fail(f"{what} failed")

    def hooked(self, kind, phase):
        """The rendered objects of `kind` that Helm runs at hook `phase`, in name order."""
        for (k, name), o in sorted(self.objects.items()):
            hook = (o["metadata"].get("annotations") or {}).get("helm.sh/hook", "")
            if k == kind and phase in hook.split(","):
                yield name, o

    def hooks(self, phase):
        for name, o in self.hooked("Job", phase):
            self.run_pod(o["spec"]["template"]["spec"], f"{phase} hook {name}")

    def helm_test(self):
        for name, o in self.hooked("Pod", "test"):
            self.run_pod(o["spec"], f"helm test {name}")

    def client_pod(self, script, without_env=()):
        """The `helm test` pod (the jobs' environment, scripts and certificates) running
        `script` instead, less the variables named in `without_env`."""
        spec = self.objects[("Pod", f"{self.sts['metadata']['name']}-test")]["spec"]
        spec = yaml.safe_load(yaml.safe_dump(spec))
        c = spec["containers"][0]
        c["env"] = [e for e in c["env"] if e["name"] not in without_env]
        c["command"] = ["/bin/sh", "-c", ". /opt/concord/chart/lib.sh && " + script]
        return spec

    def cron_job(self, component):
        o = self.objects[("CronJob", f"{self.sts['metadata']['name']}-{component}")]
        return self.run_pod(o["spec"]["jobTemplate"]["spec"]["template"]["spec"], f"cronjob {component}")

    def install(self):
        for o in range(self.replicas()):
            self.start_member(o)
        self.wait_ready(range(self.replicas()))
        self.hooks("post-install")
        print(f"chart: {self.name}: {self.replicas()} members ready")

    def upgrade(self, sets):
        """`helm upgrade`: pre-upgrade hooks, then the new objects (ConfigMaps refreshed in
        place), the StatefulSet scaled (removed ordinals deleted with their volumes when the
        retention policy says so), post-upgrade hooks."""
        old = self.sts
        self.values = self.values + sets
        self.objects = render(self.tools, self.name, sets=self.values, upgrade=True)
        self.hooks("pre-upgrade")
        self.kubelet.set_objects(self.objects)
        if old["spec"]["template"] != self.sts["spec"]["template"]:
            self.fail("a scale changed the pod template: every member would restart")
        n = self.replicas()
        policy = (self.sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}).get("whenScaled")
        for o in sorted(self.members, reverse=True):
            if o >= n:
                pod = self.members.pop(o)
                pod.stop()
                if policy == "Delete":
                    self.kubelet.delete_claim(f"data-{pod.name}")
        for o in range(n):
            if o not in self.members:
                self.start_member(o)
        self.wait_ready(range(n))
        self.hooks("post-upgrade")
        print(f"chart: {self.name}: upgraded to {n} members")

    def lose_volume(self, ordinal):
        """A member's pod and volume are lost (a node gone); the StatefulSet recreates it."""
        pod = self.members.pop(ordinal)
        pod.stop(grace=0)
        self.kubelet.delete_claim(f"data-{pod.name}")
        self.start_member(ordinal)
        self.wait_ready(range(self.replicas()))
        print(f"chart: {self.name}: {pod.name} rejoined after losing its volume")

    def ctl(self, *args):
        """etcdctl from a client pod's view: the jobs' environment and certificates."""
        script = "ctl --endpoints \"$(endpoints \"$CHART_REPLICAS\")\" " + " ".join(f"'{a}'" for a in args)
        p = self.run_pod(self.client_pod(script), f"etcdctl {args[0]}", timeout=60)
        return p.log(100000).split("\n", 1)[1]

    def fail(self, why):
        for pod in self.members.values():
            print(f"--- {pod.describe()}\n{pod.log()}")
        raise SystemExit(f"chart: {self.name}: {why}")

    def close(self):
        for p in self.members.values():
            p.stop(grace=5)
        self.members = {}


def indent(text):
    return "".join(f"    {line}\n" for line in text.strip().splitlines()[-20:])


def check_keys(rel, keys):
    out = rel.ctl("get", "--prefix", "/chart/")
    got = {}
    lines = [line for line in out.splitlines() if not line.startswith("---")]
    for k, v in zip(lines[0::2], lines[1::2]):
        got[k] = v
    missing = {k: v for k, v in keys.items() if got.get(k) != v}
    if missing:
        rel.fail(f"{len(missing)} of {len(keys)} keys lost or changed, e.g. {list(missing)[:3]}")
    print(f"chart: {rel.name}: all {len(keys)} keys read back")


def put_keys(rel, keys, start, count):
    """Writes /chart/<i> = v<i> for i in [start, start + count), 25 puts per client pod."""
    for i in range(start, start + count):
        keys[f"/chart/{i:04}"] = f"v{i}"
    for i in range(start, start + count, 25):
        batch = " ".join(f"/chart/{j:04}=v{j}" for j in range(i, min(i + 25, start + count)))
        script = ("eps=$(endpoints \"$CHART_REPLICAS\") && "
                  f"for kv in {batch}; do ctl --endpoints \"$eps\" put \"${{kv%%=*}}\" \"${{kv#*=}}\" >/dev/null; done")
        rel.run_pod(rel.client_pod(script), f"put {i}", timeout=60)


def check_auth_enforced(rel):
    """With auth on, a client without root's password is refused, and root's works."""
    script = ("out=$(etcdctl --endpoints \"$(endpoints \"$CHART_REPLICAS\")\" put /chart/anonymous x 2>&1); "
              "echo \"$out\"; case \"$out\" in *'Error: etcdserver: user name is empty'*) exit 0;; esac; exit 1")
    spec = rel.client_pod(script, without_env=["CHART_ROOT_PASSWORD"])
    rel.run_pod(spec, "anonymous put refused", timeout=60)
    if "Authentication Status: true" not in rel.ctl("auth", "status"):
        rel.fail("auth is not on after the post-install hook")
    print(f"chart: {rel.name}: auth is on; a client without the password is refused")


def wait_members(rel, n, timeout=60):
    """Waits until `member list` shows exactly n members, all started (a joined member
    publishes its name just after it turns ready)."""
    deadline = time.time() + timeout
    while True:
        lines = [line for line in rel.ctl("member", "list").splitlines() if ", " in line]
        started = [line for line in lines if ", started, " in line]
        if len(lines) == n and len(started) == n:
            print(f"chart: {rel.name}: {n} members, all started")
            return
        if time.time() > deadline:
            rel.fail(f"wanted {n} started members, member list says:\n" + "\n".join(lines))
        time.sleep(2)


def scenario(tools, work, bin_dir, label, sets, secrets):
    net = pods.Network("kc")
    rel = Release(tools, f"{work}/{label}", net, bin_dir, "r", sets, secrets)
    restored = None
    try:
        rel.install()
        rel.helm_test()
        if "auth.enabled=true" in sets:
            check_auth_enforced(rel)
        keys = {}
        put_keys(rel, keys, 0, 50)
        rel.upgrade(["replicaCount=5"])
        wait_members(rel, 5)
        rel.helm_test()
        put_keys(rel, keys, 50, 25)
        rel.upgrade(["replicaCount=3"])
        wait_members(rel, 3)
        rel.helm_test()
        check_keys(rel, keys)
        rel.lose_volume(1)
        check_keys(rel, keys)
        if "backup.enabled=true" in sets:
            rel.cron_job("defrag")
            for _ in range(3):
                rel.cron_job("backup")
                time.sleep(1)
            backups = sorted(glob.glob(f"{rel.work}/pvc/r-concord-backups/*"))
            if len(backups) != 2 or not all(b.endswith(".db") for b in backups):
                rel.fail(f"3 backups with keep=2 left {backups}")
            rel.close()
            net.close()
            net = pods.Network("kd")
            restored = Release(tools, f"{work}/{label}-restored", net, bin_dir, "r",
                               sets + ["restore.enabled=true", "restore.existingClaim=from-backup",
                                       "restore.file=snapshot.db"], secrets)
            os.makedirs(f"{restored.work}/pvc/from-backup")
            # The backup keeps its owner (the jobs' user) as a volume moved to the new release would.
            st = os.stat(backups[-1])
            shutil.copy2(backups[-1], f"{restored.work}/pvc/from-backup/snapshot.db")
            os.chown(f"{restored.work}/pvc/from-backup/snapshot.db", st.st_uid, st.st_gid)
            restored.install()
            restored.helm_test()
            check_keys(restored, keys)
        print(f"chart: {label}: ok")
    finally:
        rel.close()
        if restored:
            restored.close()
        net.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools", required=True, help="folder with helm and kubernetes-validate")
    ap.add_argument("--concord", default=f"{ROOT}/target/debug/concord")
    ap.add_argument("--etcdctl", required=True, help="etcdctl 3.5 (the image's)")
    ap.add_argument("--validate-only", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, volumes)")
    a = ap.parse_args()
    validate(a.tools)
    check_dockerfile(a.concord)
    if a.validate_only:
        return
    # Not under /tmp: the pods mount an emptyDir there, which would hide their volumes' sources.
    work = tempfile.mkdtemp(prefix="chart-test-", dir="/var/tmp")
    os.chmod(work, 0o755)
    bin_dir = f"{work}/bin"
    os.makedirs(bin_dir)
    for b in (a.concord, a.etcdctl):
        shutil.copy(os.path.realpath(b), bin_dir)
    try:
        scenario(a.tools, work, bin_dir, "defaults", [], {})
        domain = f"r-concord-headless.{NAMESPACE}.svc.cluster.local"
        cert = make_certs(work, domain, f"r-concord.{NAMESPACE}.svc.cluster.local")
        scenario(a.tools, work, bin_dir, "tls-auth-backup",
                 # Without client-cert-auth, so that auth goes by root's password, not the CN.
                 ["tls.client.enabled=true", "tls.client.clientCertAuth=false", "tls.peer.enabled=true",
                  "auth.enabled=true",
                  "auth.rootPassword=chart-Test-pw", "backup.enabled=true", "backup.keep=2",
                  "defrag.enabled=true"],
                 {"r-concord-client-tls": cert, "r-concord-peer-tls": cert})
    finally:
        if a.keep:
            print(f"chart: work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
        pods.remove_mount_points()


if __name__ == "__main__":
    main()
