//! Test helpers for TLS: a CA issuing certificates (rcgen), TLS clients, member processes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::kv_client::KvClient;
use concord::pb::etcdserverpb::{PutRequest, RangeRequest};
use rustls::pki_types::ServerName;
use tonic::transport::{Channel, Endpoint};

pub(super) use crate::cluster::Procs;
use crate::cluster::TestResult;

/// A CA and the certificates it signed, as PEM files in a directory.
pub(crate) struct Pki {
    dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    pub(crate) fn new(dir: &Path) -> TestResult<Self> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "etcd-ca");
        let ca_key = rcgen::KeyPair::generate()?;
        let ca = params.self_signed(&ca_key)?;
        std::fs::write(dir.join("ca.crt"), ca.pem())?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca,
            ca_key,
        })
    }

    /// Writes `<name>.crt` and `<name>.key`, signed by the CA, for CN `cn`.
    pub(crate) fn issue(&self, name: &str, cn: &str, server: bool) -> TestResult {
        self.issue_valid(name, cn, server, true)
    }

    /// As [`Pki::issue`]; `valid: false` makes a certificate that expired yesterday.
    pub(super) fn issue_valid(
        &self,
        name: &str,
        cn: &str,
        server: bool,
        valid: bool,
    ) -> TestResult {
        let sans = if server {
            vec!["localhost".to_string(), "127.0.0.1".to_string()]
        } else {
            Vec::new()
        };
        let mut params = rcgen::CertificateParams::new(sans)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.serial_number = Some(serial(name));
        if !valid {
            let now = time::OffsetDateTime::now_utc();
            params.not_before = now - time::Duration::days(10);
            params.not_after = now - time::Duration::days(1);
        }
        if server {
            params
                .extended_key_usages
                .push(rcgen::ExtendedKeyUsagePurpose::ServerAuth);
        }
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca, &self.ca_key)?;
        // Replaced by rename, as a certificate manager does, so no reader sees half a file.
        for (ext, text) in [("key", key.serialize_pem()), ("crt", cert.pem())] {
            let tmp = self.dir.join(format!("{name}.{ext}.tmp"));
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, self.path(&format!("{name}.{ext}")))?;
        }
        Ok(())
    }

    /// Writes `crl.pem`: the CA revokes the certificates `names`.
    pub(super) fn revoke(&self, names: &[&str]) -> TestResult {
        let now = time::OffsetDateTime::now_utc();
        let crl = rcgen::CertificateRevocationListParams {
            this_update: now - time::Duration::hours(1),
            next_update: now + time::Duration::days(1),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: names
                .iter()
                .map(|n| rcgen::RevokedCertParams {
                    serial_number: serial(n),
                    revocation_time: now - time::Duration::hours(1),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&self.ca, &self.ca_key)?;
        std::fs::write(self.dir.join("crl.pem"), crl.pem()?)?;
        Ok(())
    }

    pub(crate) fn path(&self, file: &str) -> String {
        self.dir.join(file).to_string_lossy().into_owned()
    }

    /// A client configuration trusting the CA, presenting `<name>.crt` if given.
    pub(crate) fn client(&self, name: Option<&str>) -> TestResult<Arc<rustls::ClientConfig>> {
        self.client_as(name.map(|n| (self, n)))
    }

    /// A client configuration trusting this CA, presenting `<name>.crt` of `pki` if given.
    pub(super) fn client_as(
        &self,
        cert: Option<(&Pki, &str)>,
    ) -> TestResult<Arc<rustls::ClientConfig>> {
        let ca = self.dir.join("ca.crt");
        let files = cert.map(|(pki, n)| {
            (
                pki.dir.join(format!("{n}.crt")),
                pki.dir.join(format!("{n}.key")),
            )
        });
        let cert = files.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
        Ok(concord::tls::client_config(Some(&ca), cert)?)
    }
}

/// The serial number of the certificate issued as `name`.
pub(super) fn serial(name: &str) -> rcgen::SerialNumber {
    let n = name
        .bytes()
        .fold(1u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    rcgen::SerialNumber::from(n & 0x7fff_ffff_ffff_ffff)
}

/// A KV client over TLS to `127.0.0.1:port`.
pub(super) async fn kv(port: u16, tls: Arc<rustls::ClientConfig>) -> TestResult<KvClient<Channel>> {
    let connector = concord::transport::connector(Duration::from_secs(5), None, Some(tls));
    let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
        .connect_with_connector(connector)
        .await?;
    Ok(KvClient::new(channel))
}

pub(super) async fn put(kv: &mut KvClient<Channel>, key: &str, value: &str) -> TestResult {
    kv.put(PutRequest {
        key: key.into(),
        value: value.into(),
        ..Default::default()
    })
    .await?;
    Ok(())
}

pub(super) async fn get(kv: &mut KvClient<Channel>, key: &str) -> TestResult<Option<Vec<u8>>> {
    let r = kv
        .range(RangeRequest {
            key: key.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(r.kvs.into_iter().next().map(|kv| kv.value.to_vec()))
}

/// kubeadm's etcd flags for member `name` (ports on 127.0.0.1).
pub(super) fn kubeadm_flags(
    pki: &Pki,
    dir: &Path,
    name: &str,
    ports: (u16, u16, u16),
    initial: &str,
) -> Vec<String> {
    let (client, peer, metrics) = ports;
    [
        format!("--advertise-client-urls=https://127.0.0.1:{client}"),
        format!("--cert-file={}", pki.path("server.crt")),
        "--client-cert-auth=true".into(),
        format!("--data-dir={}", dir.join(name).display()),
        "--experimental-initial-corrupt-check=true".into(),
        "--experimental-watch-progress-notify-interval=5s".into(),
        format!("--initial-advertise-peer-urls=https://127.0.0.1:{peer}"),
        format!("--initial-cluster={initial}"),
        format!("--key-file={}", pki.path("server.key")),
        format!("--listen-client-urls=https://127.0.0.1:{client}"),
        format!("--listen-metrics-urls=http://127.0.0.1:{metrics}"),
        format!("--listen-peer-urls=https://127.0.0.1:{peer}"),
        format!("--name={name}"),
        format!("--peer-cert-file={}", pki.path("peer.crt")),
        "--peer-client-cert-auth=true".into(),
        format!("--peer-key-file={}", pki.path("peer.key")),
        format!("--peer-trusted-ca-file={}", pki.path("ca.crt")),
        "--snapshot-count=10000".into(),
        format!("--trusted-ca-file={}", pki.path("ca.crt")),
    ]
    .into()
}

pub(super) fn spawn(args: &[String], log: &Path) -> TestResult<Child> {
    let log = std::fs::File::create(log)?;
    Ok(Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(args)
        .args(["--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?)
}

/// Starts one member whose client URL (`127.0.0.1:client_port`) serves `server.crt` and
/// requires client certificates signed by the CA, with `extra` flags; data and log in `dir`.
pub(super) fn spawn_one(
    pki: &Pki,
    dir: &Path,
    client_port: u16,
    extra: &[String],
) -> TestResult<Child> {
    let peer_port = crate::cluster::free_port()?;
    let mut args: Vec<String> = vec![
        format!("--data-dir={}", dir.join("m").display()),
        format!("--listen-client-urls=https://127.0.0.1:{client_port}"),
        format!("--advertise-client-urls=https://127.0.0.1:{client_port}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
        format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
        format!("--cert-file={}", pki.path("server.crt")),
        format!("--key-file={}", pki.path("server.key")),
        format!("--trusted-ca-file={}", pki.path("ca.crt")),
        "--client-cert-auth".into(),
    ];
    args.extend_from_slice(extra);
    spawn(&args, &dir.join("m.log"))
}

/// Retries `op` for up to 20 s (members start, elect, and connect).
pub(super) async fn eventually<T, F, Fut>(mut op: F) -> TestResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = TestResult<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The CN of the certificate a TLS server at `127.0.0.1:port` presents now.
pub(super) async fn served_cn(port: u16, tls: Arc<rustls::ClientConfig>) -> TestResult<String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = ServerName::try_from("127.0.0.1")?;
    let session = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await?;
    let cert = session
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first().cloned())
        .ok_or("no certificate")?;
    Ok(concord::tls::common_name(&cert).unwrap_or_default())
}

/// A client configuration that accepts any server certificate (as `etcdctl
/// --insecure-skip-tls-verify`), still checking handshake signatures.
pub(super) fn insecure_client() -> TestResult<Arc<rustls::ClientConfig>> {
    Ok(concord::tls::client_config(None, None)?)
}
