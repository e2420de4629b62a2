//! TLS for clients and peers: kubeadm's etcd command line, verbatim, on three members with a CA
//! and certificates made the way kubeadm makes them; clients without a certificate refused;
//! certificate rotation without a restart; bad certificate flags refused at start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::kv_client::KvClient;
use concord::pb::etcdserverpb::{PutRequest, RangeRequest};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::{Channel, Endpoint};

use crate::cluster::{free_port, http_get, TestResult};

/// A CA and the certificates it signed, as PEM files in a directory.
struct Pki {
    dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new(dir: &Path) -> TestResult<Self> {
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
    fn issue(&self, name: &str, cn: &str, server: bool) -> TestResult {
        self.issue_valid(name, cn, server, true)
    }

    /// As [`Pki::issue`]; `valid: false` makes a certificate that expired yesterday.
    fn issue_valid(&self, name: &str, cn: &str, server: bool, valid: bool) -> TestResult {
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
    fn revoke(&self, names: &[&str]) -> TestResult {
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

    fn path(&self, file: &str) -> String {
        self.dir.join(file).to_string_lossy().into_owned()
    }

    /// A client configuration trusting the CA, presenting `<name>.crt` if given.
    fn client(&self, name: Option<&str>) -> TestResult<Arc<rustls::ClientConfig>> {
        self.client_as(name.map(|n| (self, n)))
    }

    /// A client configuration trusting this CA, presenting `<name>.crt` of `pki` if given.
    fn client_as(&self, cert: Option<(&Pki, &str)>) -> TestResult<Arc<rustls::ClientConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(self.path("ca.crt"))?)?;
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let mut config = match cert {
            Some((pki, n)) => {
                let chain = vec![CertificateDer::from_pem_file(
                    pki.path(&format!("{n}.crt")),
                )?];
                let key = PrivateKeyDer::from_pem_file(pki.path(&format!("{n}.key")))?;
                builder.with_client_auth_cert(chain, key)?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The serial number of the certificate issued as `name`.
fn serial(name: &str) -> rcgen::SerialNumber {
    let n = name
        .bytes()
        .fold(1u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    rcgen::SerialNumber::from(n & 0x7fff_ffff_ffff_ffff)
}

/// A KV client over TLS to `127.0.0.1:port`.
async fn kv(port: u16, tls: Arc<rustls::ClientConfig>) -> TestResult<KvClient<Channel>> {
    let connector = concord::transport::connector(Duration::from_secs(5), None, Some(tls));
    let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
        .connect_with_connector(connector)
        .await?;
    Ok(KvClient::new(channel))
}

async fn put(kv: &mut KvClient<Channel>, key: &str, value: &str) -> TestResult {
    kv.put(PutRequest {
        key: key.into(),
        value: value.into(),
        ..Default::default()
    })
    .await?;
    Ok(())
}

async fn get(kv: &mut KvClient<Channel>, key: &str) -> TestResult<Option<Vec<u8>>> {
    let r = kv
        .range(RangeRequest {
            key: key.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(r.kvs.into_iter().next().map(|kv| kv.value))
}

/// Member processes, killed when dropped.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// kubeadm's etcd flags for member `name` (ports on 127.0.0.1).
fn kubeadm_flags(
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

fn spawn(args: &[String], log: &Path) -> TestResult<Child> {
    let log = std::fs::File::create(log)?;
    Ok(Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(args)
        .args(["--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?)
}

/// Retries `op` for up to 20 s (members start, elect, and connect).
async fn eventually<T, F, Fut>(mut op: F) -> TestResult<T>
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadms_command_line_forms_a_tls_cluster() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    pki.issue("server", "node", true)?;
    pki.issue("peer", "node", true)?;
    pki.issue("apiserver-etcd-client", "kube-apiserver-etcd-client", false)?;
    let ports: Vec<(u16, u16, u16)> = (0..3)
        .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
        .collect::<TestResult<_>>()?;
    let initial = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("n{i}=https://127.0.0.1:{}", p.1))
        .collect::<Vec<_>>()
        .join(",");
    let mut procs = Procs(Vec::new());
    for (i, p) in ports.iter().enumerate() {
        let args = kubeadm_flags(&pki, dir.path(), &format!("n{i}"), *p, &initial);
        procs
            .0
            .push(spawn(&args, &dir.path().join(format!("n{i}.log")))?);
    }
    let client = pki.client(Some("apiserver-etcd-client"))?;
    let (first, last) = (ports[0].0, ports[2].0);
    eventually(|| async { put(&mut kv(first, client.clone()).await?, "k", "v").await }).await?;
    let got = eventually(|| async { get(&mut kv(last, client.clone()).await?, "k").await }).await?;
    assert_eq!(
        got.as_deref(),
        Some(&b"v"[..]),
        "written on n0, read on n2 over TLS"
    );

    // A client without a certificate, and a plaintext client, are refused.
    let anonymous = pki.client(None)?;
    let refused = match kv(first, anonymous).await {
        Ok(mut c) => put(&mut c, "k", "x").await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "a client without a certificate was served");
    let plain = match KvClient::connect(format!("http://127.0.0.1:{first}")).await {
        Ok(mut c) => put(&mut c, "k", "x").await.is_err(),
        Err(_) => true,
    };
    assert!(plain, "a plaintext client was served on a TLS port");
    // A certificate from another CA, and an expired one from the right CA, are refused.
    let other_dir = tempfile::tempdir()?;
    let other = Pki::new(other_dir.path())?;
    other.issue("stranger", "root", false)?;
    pki.issue_valid("expired", "root", false, false)?;
    for (label, config) in [
        ("untrusted", pki.client_as(Some((&other, "stranger")))?),
        ("expired", pki.client(Some("expired"))?),
    ] {
        let served = match kv(first, config).await {
            Ok(mut c) => put(&mut c, "k", "x").await.is_ok(),
            Err(_) => false,
        };
        assert!(!served, "a client with an {label} certificate was served");
    }
    // kubelet's probe on the plain metrics URL.
    let health = http_get(ports[0].2, "/health?exclude=NOSPACE&serializable=true").await?;
    assert!(health.contains("\"health\":\"true\""), "{health}");
    let got = get(&mut kv(first, client).await?, "k").await?;
    assert_eq!(
        got.as_deref(),
        Some(&b"v"[..]),
        "refused clients wrote nothing"
    );
    Ok(())
}

/// The CN of the certificate a TLS server at `127.0.0.1:port` presents now.
async fn served_cn(port: u16, tls: Arc<rustls::ClientConfig>) -> TestResult<String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_without_a_restart() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    pki.issue("server", "before", true)?;
    pki.issue("client", "root", false)?;
    let (client_port, peer_port) = (free_port()?, free_port()?);
    let args: Vec<String> = vec![
        format!("--data-dir={}", dir.path().join("m").display()),
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
    let _procs = Procs(vec![spawn(&args, &dir.path().join("m.log"))?]);
    let client = pki.client(Some("client"))?;
    let mut old = eventually(|| async {
        let mut c = kv(client_port, client.clone()).await?;
        put(&mut c, "a", "1").await?;
        Ok(c)
    })
    .await?;
    assert_eq!(
        served_cn(client_port, pki.client(Some("client"))?).await?,
        "before"
    );
    pki.issue("server", "after", true)?;
    assert_eq!(
        served_cn(client_port, pki.client(Some("client"))?).await?,
        "after",
        "a new connection gets the new certificate"
    );
    // The connection made before the rotation keeps working.
    put(&mut old, "b", "2").await?;
    let mut new = kv(client_port, client).await?;
    assert_eq!(get(&mut new, "b").await?.as_deref(), Some(&b"2"[..]));
    Ok(())
}

#[tokio::test]
async fn bad_certificate_flags_are_refused_at_start_naming_the_flag() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    pki.issue("server", "node", true)?;
    pki.issue("other", "node", true)?;
    let missing = dir
        .path()
        .join("missing.crt")
        .to_string_lossy()
        .into_owned();
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            vec![
                format!("--cert-file={missing}"),
                format!("--key-file={}", pki.path("server.key")),
            ],
            format!("--cert-file {missing}"),
        ),
        (
            vec![
                format!("--cert-file={}", pki.path("server.crt")),
                format!("--key-file={}", pki.path("other.key")),
            ],
            "does not match the certificate".into(),
        ),
        (
            vec![
                "--listen-client-urls=https://127.0.0.1:0".into(),
                "--advertise-client-urls=https://127.0.0.1:0".into(),
            ],
            "must be provided for client url https://127.0.0.1:0".into(),
        ),
        (
            vec!["--tls-min-version=TLS1.1".into()],
            "unexpected TLS version".into(),
        ),
    ];
    for (mut args, want) in cases {
        args.push(format!("--data-dir={}", dir.path().join("d").display()));
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::process::Command::new(env!("CARGO_BIN_EXE_concord"))
                .args(&args)
                .env("RUST_BACKTRACE", "0")
                .output(),
        )
        .await
        .map_err(|_| format!("{args:?} did not exit"))??;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(stderr.contains(&want), "{args:?}: {stderr}");
    }
    Ok(())
}

/// A member added with `member add` joins a TLS cluster (`--initial-cluster-state existing`):
/// it learns its identity from the running member over TLS with its peer certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_a_tls_cluster() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    pki.issue("server", "node", true)?;
    pki.issue("peer", "node", true)?;
    pki.issue("client", "root", false)?;
    let ports: Vec<(u16, u16, u16)> = (0..2)
        .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
        .collect::<TestResult<_>>()?;
    let first_peer = format!("n0=https://127.0.0.1:{}", ports[0].1);
    let mut procs = Procs(Vec::new());
    let args = kubeadm_flags(&pki, dir.path(), "n0", ports[0], &first_peer);
    procs.0.push(spawn(&args, &dir.path().join("n0.log"))?);
    let client = pki.client(Some("client"))?;
    let c0 = ports[0].0;
    eventually(|| async { put(&mut kv(c0, client.clone()).await?, "before", "1").await }).await?;

    let connector =
        concord::transport::connector(Duration::from_secs(5), None, Some(client.clone()));
    let channel = Endpoint::from_shared(format!("http://127.0.0.1:{c0}"))?
        .connect_with_connector(connector)
        .await?;
    let new_peer = format!("https://127.0.0.1:{}", ports[1].1);
    concord::pb::etcdserverpb::cluster_client::ClusterClient::new(channel)
        .member_add(concord::pb::etcdserverpb::MemberAddRequest {
            peer_ur_ls: vec![new_peer.clone()],
            is_learner: false,
        })
        .await?;
    let initial = format!("{first_peer},n1={new_peer}");
    let mut args = kubeadm_flags(&pki, dir.path(), "n1", ports[1], &initial);
    args.push("--initial-cluster-state=existing".into());
    procs.0.push(spawn(&args, &dir.path().join("n1.log"))?);
    let c1 = ports[1].0;
    let got =
        eventually(|| async { get(&mut kv(c1, client.clone()).await?, "before").await }).await?;
    assert_eq!(
        got.as_deref(),
        Some(&b"1"[..]),
        "the new member has the data"
    );
    eventually(|| async { put(&mut kv(c1, client.clone()).await?, "after", "2").await }).await?;
    Ok(())
}

/// `--client-crl-file`: a client whose certificate the CA revoked is refused; others are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_client_certificate_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    pki.issue("server", "node", true)?;
    pki.issue("client", "root", false)?;
    pki.issue("revoked", "root", false)?;
    pki.revoke(&["revoked"])?;
    let (client_port, peer_port) = (free_port()?, free_port()?);
    let args: Vec<String> = vec![
        format!("--data-dir={}", dir.path().join("m").display()),
        format!("--listen-client-urls=https://127.0.0.1:{client_port}"),
        format!("--advertise-client-urls=https://127.0.0.1:{client_port}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
        format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
        format!("--cert-file={}", pki.path("server.crt")),
        format!("--key-file={}", pki.path("server.key")),
        format!("--trusted-ca-file={}", pki.path("ca.crt")),
        format!("--client-crl-file={}", pki.path("crl.pem")),
        "--client-cert-auth".into(),
    ];
    let _procs = Procs(vec![spawn(&args, &dir.path().join("m.log"))?]);
    let good = pki.client(Some("client"))?;
    eventually(|| async { put(&mut kv(client_port, good.clone()).await?, "a", "1").await }).await?;
    let served = match kv(client_port, pki.client(Some("revoked"))?).await {
        Ok(mut c) => put(&mut c, "a", "2").await.is_ok(),
        Err(_) => false,
    };
    assert!(!served, "a revoked client certificate was served");
    Ok(())
}

/// `--auto-tls --peer-auto-tls`: three members with self-signed certificates (peers do not verify
/// each other's, as in etcd) form a cluster; a client that skips verification is served over
/// TLS; `https://` metrics URLs use the client certificate too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_tls_forms_a_cluster() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ports: Vec<(u16, u16, u16)> = (0..3)
        .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
        .collect::<TestResult<_>>()?;
    let initial = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("a{i}=https://127.0.0.1:{}", p.1))
        .collect::<Vec<_>>()
        .join(",");
    let mut procs = Procs(Vec::new());
    for (i, (client, peer, metrics)) in ports.iter().enumerate() {
        let args: Vec<String> = vec![
            format!("--name=a{i}"),
            format!("--data-dir={}", dir.path().join(format!("a{i}")).display()),
            format!("--listen-client-urls=https://127.0.0.1:{client}"),
            format!("--advertise-client-urls=https://127.0.0.1:{client}"),
            format!("--listen-peer-urls=https://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=https://127.0.0.1:{peer}"),
            format!("--listen-metrics-urls=https://127.0.0.1:{metrics}"),
            format!("--initial-cluster={initial}"),
            "--auto-tls".into(),
            "--peer-auto-tls".into(),
        ];
        procs
            .0
            .push(spawn(&args, &dir.path().join(format!("a{i}.log")))?);
    }
    let insecure = insecure_client()?;
    let (first, last) = (ports[0].0, ports[2].0);
    eventually(|| async { put(&mut kv(first, insecure.clone()).await?, "k", "v").await }).await?;
    let got =
        eventually(|| async { get(&mut kv(last, insecure.clone()).await?, "k").await }).await?;
    assert_eq!(got.as_deref(), Some(&b"v"[..]));
    assert!(dir.path().join("a0/fixtures/peer/cert.pem").exists());
    // The metrics URL speaks TLS: a plain HTTP request gets no answer.
    assert!(http_get(ports[0].2, "/health")
        .await
        .map_or(true, |b| !b.contains("health")));
    Ok(())
}

/// A client configuration that accepts any server certificate (as `etcdctl
/// --insecure-skip-tls-verify`), still checking handshake signatures.
fn insecure_client() -> TestResult<Arc<rustls::ClientConfig>> {
    #[derive(Debug)]
    struct AnyCert(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for AnyCert {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
