"""TLS modes (--tls off|certs|auto): certificates made with openssl, server and etcdctl flags."""

from __future__ import annotations

import os
import secrets
import subprocess

MODES = ("off", "certs", "auto")

# Extensions as kubeadm gives etcd's certificates (cmd/kubeadm/app/util/pkiutil): a CA for
# signing only; server and peer certificates for both ends of a TLS connection, valid for
# localhost and 127.0.0.1; a client certificate for clientAuth only.
_EXTENSIONS = {
    "ca": ("basicConstraints=critical,CA:TRUE\n"
           "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign\n"
           "subjectKeyIdentifier=hash\n"),
    "server": ("basicConstraints=critical,CA:FALSE\n"
               "keyUsage=critical,digitalSignature,keyEncipherment\n"
               "extendedKeyUsage=serverAuth,clientAuth\n"
               "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
               "authorityKeyIdentifier=keyid\n"),
    "client": ("basicConstraints=critical,CA:FALSE\n"
               "keyUsage=critical,digitalSignature,keyEncipherment\n"
               "extendedKeyUsage=clientAuth\n"
               "authorityKeyIdentifier=keyid\n"),
}
# file name -> (common name, extensions)
_CERTS = {"server": ("node", "server"), "peer": ("node", "server"), "client": ("root", "client")}


def _openssl(d: str, *args: str) -> None:
    r = subprocess.run(["openssl", *args], cwd=d, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed (exit {r.returncode}): "
                           f"{(r.stdout + r.stderr).strip()}")


def _sign(d: str, name: str, cn: str, ext: str, ca: bool = False) -> None:
    """NAME.key (RSA 2048, PKCS#1 like kubeadm's) and NAME.crt for CN=cn, signed by
    ca.key (self-signed if ca) with the extensions _EXTENSIONS[ext] only."""
    _openssl(d, "genrsa", "-traditional", "-out", f"{name}.key", "2048")
    _openssl(d, "req", "-new", "-key", f"{name}.key", "-subj", f"/CN={cn}", "-out", f"{name}.csr")
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write(_EXTENSIONS[ext])
    signer = ["-signkey", "ca.key"] if ca else ["-CA", "ca.crt", "-CAkey", "ca.key"]
    _openssl(d, "x509", "-req", "-in", f"{name}.csr", *signer, "-days", "365",
             "-set_serial", str(secrets.randbits(63)), "-extfile", f"{name}.ext",
             "-out", f"{name}.crt")


def make_certs(d: str) -> None:
    """ca.{crt,key}, and server, peer (CN node) and client (CN root) certificates
    signed by it, in folder d."""
    os.makedirs(d, exist_ok=True)
    _sign(d, "ca", "etcd-ca", "ca", ca=True)
    for name, (cn, ext) in _CERTS.items():
        _sign(d, name, cn, ext)


class Tls:
    """The TLS setup of one run: with mode certs, the certificates are made in
    WORKDIR/tls; with auto, the servers make their own (--auto-tls, --peer-auto-tls)
    and etcdctl does not verify them."""

    def __init__(self, mode: str, workdir: str):
        assert mode in MODES, mode
        self.mode = mode
        self.dir = os.path.join(workdir, "tls")
        if mode == "certs":
            make_certs(self.dir)

    @property
    def scheme(self) -> str:
        return "http" if self.mode == "off" else "https"

    def _file(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def server_flags(self) -> list[str]:
        if self.mode == "certs":
            return ["--cert-file", self._file("server.crt"),
                    "--key-file", self._file("server.key"),
                    "--trusted-ca-file", self._file("ca.crt"),
                    "--client-cert-auth=true",
                    "--peer-cert-file", self._file("peer.crt"),
                    "--peer-key-file", self._file("peer.key"),
                    "--peer-trusted-ca-file", self._file("ca.crt"),
                    "--peer-client-cert-auth=true"]
        if self.mode == "auto":
            return ["--auto-tls", "--peer-auto-tls"]
        return []

    def ctl_flags(self) -> list[str]:
        if self.mode == "certs":
            return [f"--cacert={self._file('ca.crt')}", f"--cert={self._file('client.crt')}",
                    f"--key={self._file('client.key')}"]
        if self.mode == "auto":
            # without --cacert/--cert/--key, etcdctl ignores --insecure-skip-tls-verify unless
            # --insecure-transport=false (the https endpoint then gets a verifying TLS config)
            return ["--insecure-transport=false", "--insecure-skip-tls-verify"]
        return []
