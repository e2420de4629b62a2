#!/usr/bin/env python3
"""A real kube-apiserver (Kubernetes 1.37, built by build.sh) on a cluster of Concord members,
driven with kubectl as an operator would. The same script runs it on reference etcd.

    apiserver_test.py --server BINARY --kube-dir DIR [--members 3] [--plain] [--work DIR]

BINARY is Concord or etcd (both take etcd's flags); DIR holds kube-apiserver and kubectl. As
kubeadm sets it up, the members serve clients and peers over TLS with client certificates
required (openssl-made CA and certificates), and kube-apiserver connects with
--etcd-cafile/--etcd-certfile/--etcd-keyfile; --plain uses http instead.
Checks, in order: /readyz with its etcd check; namespaces, ConfigMaps, Secrets, a Deployment and
a ReplicaSet (no controller-manager runs, so no pods); a CustomResourceDefinition that becomes
Established and objects of it; server-side apply by two field managers; paginated lists
(`limit` and `continue`); an Event stored under a lease with the event TTL; then a
`kubectl get --watch` that lives through a SIGKILL of the leading member, with /readyz and
writes working again after it. Prints each check; exits 1 at the first failure.
"""

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

TOKEN = "concord-test-admin-token"


def free_ports(n):
    """n TCP ports that were free a moment ago."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def make_certs(work):
    """A CA, a member certificate (server and client use) for 127.0.0.1, and kube-apiserver's
    etcd client certificate, made with openssl; returns their paths by name."""
    d = os.path.join(work, "pki")
    os.makedirs(d)

    def openssl(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=etcd-ca")
    for name, cn, ext in (("member", "member", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                           "extendedKeyUsage=serverAuth,clientAuth\n"),
                          ("apiserver-etcd-client", "kube-apiserver-etcd-client",
                           "extendedKeyUsage=clientAuth\n")):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return {n: os.path.join(d, n) for n in ("ca.crt", "member.crt", "member.key",
                                              "apiserver-etcd-client.crt", "apiserver-etcd-client.key")}


class Cluster:
    """Members of BINARY started with etcd's flags, each with its own data dir and log; over
    TLS with client certificates required when given certs."""

    def __init__(self, binary, members, work, certs):
        ports = free_ports(2 * members)
        scheme = "https" if certs else "http"
        self.certs = certs
        self.clients = [f"{scheme}://127.0.0.1:{ports[2 * i]}" for i in range(members)]
        peers = ",".join(f"m{i}={scheme}://127.0.0.1:{ports[2 * i + 1]}" for i in range(members))
        tls = []
        if certs:
            tls = ["--cert-file", certs["member.crt"], "--key-file", certs["member.key"],
                   "--client-cert-auth", "--trusted-ca-file", certs["ca.crt"],
                   "--peer-cert-file", certs["member.crt"], "--peer-key-file", certs["member.key"],
                   "--peer-client-cert-auth", "--peer-trusted-ca-file", certs["ca.crt"]]
            self.context = ssl.create_default_context(cafile=certs["ca.crt"])
            self.context.load_cert_chain(certs["apiserver-etcd-client.crt"], certs["apiserver-etcd-client.key"])
        else:
            self.context = None
        self.procs = []
        for i in range(members):
            peer = f"{scheme}://127.0.0.1:{ports[2 * i + 1]}"
            log = open(os.path.join(work, f"m{i}.log"), "w")
            self.procs.append(subprocess.Popen([
                binary, "--name", f"m{i}", "--data-dir", os.path.join(work, f"m{i}"),
                "--listen-client-urls", self.clients[i], "--advertise-client-urls", self.clients[i],
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", peers, "--initial-cluster-state", "new",
                "--initial-cluster-token", "kube-test", "--log-level", "warn", *tls],
                stdout=log, stderr=subprocess.STDOUT))

    def gateway(self, i, path, body):
        """POSTs body to member i's JSON gateway; returns the decoded answer."""
        req = urllib.request.Request(self.clients[i] + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5, context=self.context) as resp:
            return json.load(resp)

    def wait_healthy(self, timeout=60):
        deadline = time.time() + timeout
        for url in self.clients:
            while True:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2, context=self.context) as resp:
                        if json.load(resp).get("health") == "true":
                            break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise SystemExit(f"{url} not healthy within {timeout} s")
                time.sleep(0.2)

    def leader(self):
        """Index of the member that leads (asked of the members still running)."""
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                continue
            status = self.gateway(i, "/v3/maintenance/status", {})
            if status["header"]["member_id"] == status["leader"]:
                return i
        raise SystemExit("no member leads")

    def kill(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


class APIServer:
    """kube-apiserver on the cluster, with a static admin token, and kubectl pointed at it;
    `extra` are more kube-apiserver flags."""

    def __init__(self, kube_dir, cluster, work, extra=()):
        self.kubectl_bin = os.path.join(kube_dir, "kubectl")
        (port,) = free_ports(1)
        self.url = f"https://127.0.0.1:{port}"
        key = os.path.join(work, "sa.key")
        subprocess.run(["openssl", "genrsa", "-out", key, "2048"], check=True, capture_output=True)
        tokens = os.path.join(work, "tokens.csv")
        with open(tokens, "w") as f:
            f.write(f'{TOKEN},admin,admin,"system:masters"\n')
        self.log = open(os.path.join(work, "kube-apiserver.log"), "w")
        etcd_tls = []
        if cluster.certs:
            etcd_tls = ["--etcd-cafile", cluster.certs["ca.crt"],
                        "--etcd-certfile", cluster.certs["apiserver-etcd-client.crt"],
                        "--etcd-keyfile", cluster.certs["apiserver-etcd-client.key"]]
        self.proc = subprocess.Popen([
            os.path.join(kube_dir, "kube-apiserver"),
            "--etcd-servers", ",".join(cluster.clients), *etcd_tls,
            "--secure-port", str(port), "--bind-address", "127.0.0.1",
            "--advertise-address", "127.0.0.1", "--endpoint-reconciler-type", "none",
            "--cert-dir", os.path.join(work, "certs"),
            "--token-auth-file", tokens, "--authorization-mode", "RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", key, "--service-account-signing-key-file", key,
            "--service-cluster-ip-range", "10.96.0.0/24", "--event-ttl", "1h", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.kubeconfig = os.path.join(work, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            json.dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": TOKEN}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}, f)
        self.tls = ssl.create_default_context()
        self.tls.check_hostname = False
        self.tls.verify_mode = ssl.CERT_NONE

    def get(self, path):
        """GETs path with the admin token: (status, body text)."""
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {TOKEN}"})
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.tls) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_ready(self, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit("kube-apiserver exited; see kube-apiserver.log")
            try:
                status, body = self.get("/readyz?verbose")
                if status == 200:
                    return body
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"kube-apiserver not ready within {timeout} s:\n{self.get('/readyz?verbose')}")

    def kubectl(self, *args, stdin=None, check=True):
        out = subprocess.run([self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args],
                             input=stdin, capture_output=True, text=True, timeout=60)
        if check and out.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""))
    if not ok:
        raise SystemExit(1)


def retry(fn, timeout=30):
    """Calls fn until it returns without SystemExit (kubectl failing while a leader is elected)."""
    deadline = time.time() + timeout
    while True:
        try:
            return fn()
        except SystemExit:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {"group": "example.com", "scope": "Namespaced",
             "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "properties": {"spec": {"type": "object", "properties": {
                     "size": {"type": "integer"}}}}}}}]},
}


def scenario(api, cluster):
    ready = api.wait_ready()
    check("readyz, with its etcd check", "[+]etcd ok" in ready, ready)
    api.kubectl("create", "namespace", "demo")
    for i in range(12):
        api.kubectl("create", "configmap", f"cm-{i:02d}", "-n", "demo", f"--from-literal=n={i}")
    names = api.kubectl("get", "configmaps", "-n", "demo", "--chunk-size=5", "-o", "name").split()
    check("12 ConfigMaps listed in chunks of 5", len([n for n in names if "cm-" in n]) == 12, names)

    pages, cont, items = 0, "", []
    while True:
        status, body = api.get("/api/v1/namespaces/demo/configmaps?limit=5" + (f"&continue={cont}" if cont else ""))
        page = json.loads(body)
        items += [i["metadata"]["name"] for i in page["items"]]
        pages += 1
        cont = page["metadata"].get("continue", "")
        if not cont:
            break
    check("paginated list: limit and continue", pages >= 3 and sorted(set(items)) == sorted(items)
          and len([n for n in items if n.startswith("cm-")]) == 12, f"{pages} pages, {items}")

    api.kubectl("create", "secret", "generic", "s1", "-n", "demo", "--from-literal=password=hunter2")
    secret = json.loads(api.kubectl("get", "secret", "s1", "-n", "demo", "-o", "json"))
    check("Secret round trip", base64.b64decode(secret["data"]["password"]) == b"hunter2")

    api.kubectl("create", "deployment", "web", "-n", "demo", "--image=registry.k8s.io/pause:3.10", "--replicas=2")
    replicaset = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web-rs", "namespace": "demo"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "rs"}},
                           "template": {"metadata": {"labels": {"app": "rs"}},
                                        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}
    api.kubectl("apply", "-f", "-", stdin=json.dumps(replicaset))
    api.kubectl("scale", "deployment", "web", "-n", "demo", "--replicas=3")
    deploy = json.loads(api.kubectl("get", "deployment", "web", "-n", "demo", "-o", "json"))
    rs = json.loads(api.kubectl("get", "replicaset", "web-rs", "-n", "demo", "-o", "json"))
    check("Deployment created and scaled, ReplicaSet applied",
          deploy["spec"]["replicas"] == 3 and deploy["metadata"]["generation"] == 2 and rs["spec"]["replicas"] == 1)

    api.kubectl("apply", "-f", "-", stdin=json.dumps(CRD))
    api.kubectl("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=60s")
    for i in range(3):
        widget = {"apiVersion": "example.com/v1", "kind": "Widget",
                  "metadata": {"name": f"w{i}", "namespace": "demo"}, "spec": {"size": i}}
        retry(lambda: api.kubectl("apply", "-f", "-", stdin=json.dumps(widget)))
    widgets = json.loads(api.kubectl("get", "widgets", "-n", "demo", "-o", "json"))["items"]
    check("CRD Established, its objects stored and listed",
          [w["spec"]["size"] for w in widgets] == [0, 1, 2], widgets)

    first = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa", "namespace": "demo"},
             "data": {"a": "1"}}
    second = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa", "namespace": "demo"},
              "data": {"b": "2"}}
    api.kubectl("apply", "--server-side", "--field-manager=alice", "-f", "-", stdin=json.dumps(first))
    api.kubectl("apply", "--server-side", "--field-manager=bob", "-f", "-", stdin=json.dumps(second))
    ssa = json.loads(api.kubectl("get", "configmap", "ssa", "-n", "demo", "-o", "json", "--show-managed-fields"))
    managers = sorted(m["manager"] for m in ssa["metadata"]["managedFields"])
    check("server-side apply by two field managers", ssa["data"] == {"a": "1", "b": "2"}
          and managers == ["alice", "bob"], ssa)

    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "ev1", "namespace": "demo"},
             "involvedObject": {"kind": "ConfigMap", "name": "cm-00", "namespace": "demo"},
             "reason": "Test", "message": "stored with a TTL", "type": "Normal"}
    api.kubectl("create", "-f", "-", stdin=json.dumps(event))
    key = base64.b64encode(b"/registry/events/demo/ev1").decode()
    kvs = cluster.gateway(cluster.leader(), "/v3/kv/range", {"key": key}).get("kvs", [])
    lease = int(kvs[0].get("lease", 0)) if kvs else 0
    ttl = cluster.gateway(cluster.leader(), "/v3/lease/timetolive", {"ID": lease}) if lease else {}
    check("Event stored under a lease with the event TTL (1h)", lease != 0 and 3000 < int(ttl.get("TTL", 0)) <= 3660,
          f"kvs={kvs} ttl={ttl}")

    watch = subprocess.Popen([api.kubectl_bin, "--kubeconfig", api.kubeconfig, "get", "configmaps", "-n", "demo",
                              "--watch-only", "-o", "name"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    leader = cluster.leader()
    cluster.kill(leader)
    print(f"     killed member {leader}, the leader")
    for i in range(5):
        retry(lambda: api.kubectl("create", "configmap", f"after-kill-{i}", "-n", "demo"))
    deadline, seen = time.time() + 30, set()
    os.set_blocking(watch.stdout.fileno(), False)
    while time.time() < deadline and len(seen) < 5:
        line = watch.stdout.readline()
        if line:
            if "after-kill-" in line:
                seen.add(line.strip())
        else:
            if watch.poll() is not None:
                break
            time.sleep(0.1)
    alive = watch.poll() is None
    watch.kill()
    check("kubectl get --watch lives through the leader's kill and sees every new ConfigMap",
          alive and len(seen) == 5, f"alive={alive} seen={sorted(seen)} stderr={watch.stderr.read()[-500:]}")
    ready = retry(api.wait_ready)
    check("readyz after the kill", "[+]etcd ok" in ready, ready)
    api.kubectl("delete", "configmap", "cm-00", "-n", "demo")
    gone = api.kubectl("get", "configmap", "cm-00", "-n", "demo", "--ignore-not-found", "-o", "name")
    check("delete after the kill", gone.strip() == "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--kube-dir", required=True)
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--plain", action="store_true", help="http between everyone, no certificates")
    ap.add_argument("--work")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="kube-apiserver-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    certs = None if args.plain else make_certs(work)
    cluster = Cluster(os.path.abspath(args.server), args.members, work, certs)
    api = None
    failed = True
    try:
        cluster.wait_healthy()
        api = APIServer(os.path.abspath(args.kube_dir), cluster, work)
        scenario(api, cluster)
        failed = False
    finally:
        if api:
            api.stop()
        cluster.stop()
        if failed:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
