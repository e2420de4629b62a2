"""Runs the pods a rendered chart describes as real processes, the way a kubelet would.

No container runtime here, so each pod is its container's exact command, arguments and
environment (Kubernetes' `$(VAR)` expansion and the downward API's values), started in a
network namespace of its own with its own address on a bridge, its DNS name in that
namespace's /etc/hosts (`ip netns exec` mounts /etc/netns/<ns>/hosts there), its volumes
bind-mounted at their mount paths in a private mount namespace (a read-only root file system
when the pod asks for one), as the pod's user, restarted when it exits (restartPolicy Always).
The image's /usr/local/bin is the release's `concord` and etcdctl.
"""

import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

BRIDGE = "kcbr0"
SUBNET = "10.78.0"
# The mount points the chart uses: created on the host if missing (empty directories; what is
# mounted on them stays inside each pod's mount namespace), removed again at the end.
MOUNT_POINTS = [
    "/var/lib/concord",
    "/opt/concord/chart",
    "/opt/concord/restore",
    "/etc/concord/client-tls",
    "/etc/concord/peer-tls",
    "/backups",
]


CREATED_MOUNT_POINTS = []


def remove_mount_points():
    """Removes the mount points this run created (empty directories on the host)."""
    for p in reversed(CREATED_MOUNT_POINTS):
        try:
            os.removedirs(p)
        except OSError:
            pass
    CREATED_MOUNT_POINTS.clear()


def run(*cmd, check=True, **kw):
    """Runs a host command (root)."""
    return subprocess.run(cmd, check=check, text=True, capture_output=True, **kw)


def expand(text, env):
    """Kubernetes' `$(VAR)` expansion: defined variables replaced, `$$` an escaped `$`,
    undefined references left as they are."""

    def one(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, text)


class Network:
    """A bridge and one network namespace per pod, with the pods' names in every hosts file."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.addresses = {}  # namespace -> IP
        self.names = {}  # DNS name -> IP
        # What an interrupted run may have left behind: its namespaces, the pods still running
        # in them (they keep a deleted namespace alive), and the host ends of its veths (named
        # as this run will name its own).
        for line in run("ip", "netns", "list").stdout.splitlines():
            if line.startswith(prefix):
                ns = line.split()[0]
                for pid in run("ip", "netns", "pids", ns, check=False).stdout.split():
                    run("kill", "-9", pid, check=False)
                run("ip", "netns", "del", ns, check=False)
        for line in run("ip", "-o", "link", "show").stdout.splitlines():
            fields = line.split(":")
            name = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
            if re.fullmatch(r"kc\d+", name):
                run("ip", "link", "del", name, check=False)
        run("ip", "link", "del", BRIDGE, check=False)
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE, check=False)
        run("ip", "link", "set", BRIDGE, "up")

    def add(self, name, host_index, dns_names):
        """A namespace `name` with address SUBNET.<host_index>, reachable as `dns_names`."""
        ns = f"{self.prefix}{name}"
        ip = f"{SUBNET}.{host_index}"
        if ns not in self.addresses:
            veth = f"kc{host_index}"
            run("ip", "netns", "add", ns)
            run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            run("ip", "link", "set", veth, "master", BRIDGE, "up")
            run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            self.addresses[ns] = ip
        for n in dns_names:
            self.names[n] = ip
        self.write_hosts()
        return ns, ip

    def write_hosts(self):
        lines = ["127.0.0.1 localhost"] + [f"{ip} {n}" for n, ip in sorted(self.names.items())]
        for ns in self.addresses:
            d = f"/etc/netns/{ns}"
            os.makedirs(d, exist_ok=True)
            with open(f"{d}/hosts", "w") as f:
                f.write("\n".join(lines) + "\n")

    def close(self):
        for ns in self.addresses:
            run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        run("ip", "link", "del", BRIDGE, check=False)


class Kubelet:
    """Starts pods from rendered pod specs; owns their volumes under `work`."""

    def __init__(self, work, network, objects, bin_dir, secrets):
        self.work = work
        self.net = network
        self.objects = objects  # (kind, name) -> rendered object
        self.bin_dir = bin_dir
        self.secrets = secrets  # extra Secrets (name -> {key: bytes}) the test provides
        for p in MOUNT_POINTS:
            if not os.path.exists(p):
                os.makedirs(p)
                CREATED_MOUNT_POINTS.append(p)

    def set_objects(self, objects):
        """A new rendering (an upgrade): ConfigMaps seen by running pods are updated in place,
        as the kubelet refreshes mounted ConfigMaps."""
        self.objects = objects
        for (kind, name), obj in objects.items():
            if kind == "ConfigMap":
                d = f"{self.work}/configmaps/{name}"
                if os.path.isdir(d):
                    self.write_configmap(obj, d)

    def write_configmap(self, obj, d):
        os.makedirs(d, exist_ok=True)
        for k, v in (obj.get("data") or {}).items():
            with open(f"{d}/{k}", "w") as f:
                f.write(v)
            os.chmod(f"{d}/{k}", 0o555)

    def secret_data(self, name):
        if name in self.secrets:
            return self.secrets[name]
        obj = self.objects.get(("Secret", name))
        if obj is None:
            raise KeyError(f"Secret {name} is neither rendered nor given by the test")
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}

    def volume_dir(self, pod, vol, claims):
        """The host directory that backs volume `vol` of `pod`."""
        name = vol["name"]
        if "configMap" in vol:
            cm = vol["configMap"]["name"]
            d = f"{self.work}/configmaps/{cm}"
            self.write_configmap(self.objects[("ConfigMap", cm)], d)
            return d
        if "secret" in vol:
            d = f"{self.work}/secrets/{pod}/{name}"
            os.makedirs(d, exist_ok=True)
            for k, v in self.secret_data(vol["secret"]["secretName"]).items():
                with open(f"{d}/{k}", "wb") as f:
                    f.write(v)
            return d
        if "emptyDir" in vol:
            d = f"{self.work}/empty/{pod}/{name}"
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            return d
        if "persistentVolumeClaim" in vol:
            return self.claim(vol["persistentVolumeClaim"]["claimName"])
        if name in claims:
            return self.claim(f"{name}-{pod}")
        raise ValueError(f"volume {name} of {pod}: unsupported kind {vol}")

    def claim(self, claim):
        d = f"{self.work}/pvc/{claim}"
        os.makedirs(d, exist_ok=True)
        return d

    def delete_claim(self, claim):
        shutil.rmtree(f"{self.work}/pvc/{claim}", ignore_errors=True)

    def env(self, pod, ip, namespace, container):
        """The container's environment as the kubelet builds it, in order."""
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOSTNAME": pod, "HOME": "/"}
        fields = {"metadata.name": pod, "metadata.namespace": namespace, "status.podIP": ip}
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = expand(str(e["value"]), env)
            elif "fieldRef" in e["valueFrom"]:
                env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in e["valueFrom"]:
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = self.secret_data(ref["name"])[ref["key"]].decode()
            else:
                raise ValueError(f"unsupported env source {e}")
        return env

    def start(self, pod, spec, namespace, netns, host_index, dns_names, claims=(), restart=True):
        """Starts `pod` (its first container) in network namespace `netns` and returns it."""
        ns, ip = self.net.add(netns, host_index, dns_names)
        return Pod(self, pod, spec, namespace, ns, ip, claims, restart)


class Pod:
    """One pod: its container restarted (with the kubelet's backoff) while `restart` holds."""

    def __init__(self, kubelet, name, spec, namespace, ns, ip, claims, restart):
        self.name, self.ns, self.ip = name, ns, ip
        self.log_path = f"{kubelet.work}/logs/{name}.log"
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        self.restarts = 0
        self.stopped = False
        self.proc = None
        self.exit_codes = []
        c = spec["containers"][0]
        pod_sc = spec.get("securityContext") or {}
        sc = c.get("securityContext") or {}
        env = kubelet.env(name, ip, namespace, c)
        argv = [expand(a, env) for a in (c.get("command") or [])]
        argv += [expand(a, env) for a in (c.get("args") or [])]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts = [(kubelet.bin_dir, "/usr/local/bin", True)]
        for m in c.get("volumeMounts") or []:
            src = kubelet.volume_dir(name, volumes.get(m["name"], {"name": m["name"]}), claims)
            mounts.append((src, m["mountPath"], m.get("readOnly", False)))
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        gid = sc.get("runAsGroup", pod_sc.get("runAsGroup", uid))
        fs_group = pod_sc.get("fsGroup")
        for src, _, ro in mounts[1:]:
            if fs_group is not None and not ro:
                subprocess.run(["chown", "-R", f"{uid or 0}:{fs_group}", src], check=True)
        lines = ["set -e"]
        for src, dst, ro in mounts:
            lines.append(f"mount --bind {shlex.quote(src)} {shlex.quote(dst)}")
            if ro:
                lines.append(f"mount -o remount,bind,ro {shlex.quote(dst)}")
        if sc.get("readOnlyRootFilesystem"):
            lines.append("mount -o remount,bind,ro /")
        user = []
        if uid is not None:
            groups = f"--groups={fs_group}" if fs_group is not None else "--clear-groups"
            user = ["setpriv", f"--reuid={uid}", f"--regid={gid}", groups]
        envs = [f"{k}={v}" for k, v in env.items()]
        lines.append("exec " + shlex.join(user + ["env", "-i", *envs, *argv]))
        self.script = "\n".join(lines)
        self.argv = argv
        self.env = env
        self.restart = restart
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.supervise, daemon=True)
        self.thread.start()

    def supervise(self):
        backoff = 1.0
        while not self.stopped:
            with open(self.log_path, "a") as log:
                log.write(f"--- start {self.restarts} {time.strftime('%H:%M:%S')}\n")
                log.flush()
                self.proc = subprocess.Popen(
                    ["ip", "netns", "exec", self.ns, "sh", "-c", self.script],
                    stdout=log, stderr=log, start_new_session=True)
            code = self.proc.wait()
            self.exit_codes.append(code)
            if self.stopped or not self.restart:
                break
            self.restarts += 1
            time.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
        self.done.set()

    def wait(self, timeout):
        """Waits for a run-once pod (a job or test); returns its exit code."""
        if not self.done.wait(timeout):
            self.stop()
            raise TimeoutError(f"{self.name} still running after {timeout} s:\n{self.log()}")
        return self.exit_codes[-1]

    def http_ok(self, port, path):
        try:
            with urllib.request.urlopen(f"http://{self.ip}:{port}{path}", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self, sig=signal.SIGTERM, grace=30):
        """Deletes the pod: SIGTERM to its processes, SIGKILL after the grace period."""
        self.stopped = True
        p = self.proc
        if p is not None and p.poll() is None:
            os.killpg(p.pid, sig)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.thread.join(5)

    def log(self, tail=60):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-tail:])
        except OSError:
            return ""

    def describe(self):
        return json.dumps({"pod": self.name, "ip": self.ip, "argv": self.argv,
                           "restarts": self.restarts}, indent=1)
