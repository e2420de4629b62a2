//! TLS for clients and peers: kubeadm's etcd command line, verbatim, on three members with a CA
//! and certificates made the way kubeadm makes them; clients without a certificate, with an
//! untrusted, expired or revoked one refused; certificate rotation without a restart; a member
//! joining over TLS; auto TLS; bad certificate flags refused at start.

pub(crate) mod pki;

use std::time::Duration;

use concord::pb::etcdserverpb::kv_client::KvClient;
use tonic::transport::Endpoint;

use crate::cluster::{free_port, http_get, TestResult};
use pki::{
    eventually, get, insecure_client, kubeadm_flags, kv, put, served_cn, spawn, spawn_one, Pki,
    Procs,
};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_without_a_restart() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    pki.issue("server", "before", true)?;
    pki.issue("client", "root", false)?;
    let client_port = free_port()?;
    let _procs = Procs(vec![spawn_one(&pki, dir.path(), client_port, &[])?]);
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
    let client_port = free_port()?;
    let crl = format!("--client-crl-file={}", pki.path("crl.pem"));
    let _procs = Procs(vec![spawn_one(&pki, dir.path(), client_port, &[crl])?]);
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

/// `--config-file` with etcd's YAML (TLS in `client-transport-security`, `log-outputs` to a
/// file): the member serves as configured, and the file wins over the command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_starts_a_tls_member() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    pki.issue("server", "node", true)?;
    pki.issue("client", "root", false)?;
    let (client, peer) = (free_port()?, free_port()?);
    let log = dir.path().join("member.log");
    let yaml = format!(
        "name: from-file\n\
         data-dir: {data}\n\
         listen-client-urls: https://127.0.0.1:{client}\n\
         advertise-client-urls: https://127.0.0.1:{client}\n\
         listen-peer-urls: http://127.0.0.1:{peer}\n\
         initial-advertise-peer-urls: http://127.0.0.1:{peer}\n\
         initial-cluster: from-file=http://127.0.0.1:{peer}\n\
         log-outputs: [{log}]\n\
         experimental-watch-progress-notify-interval: 5000000000\n\
         client-transport-security:\n  \
           cert-file: {cert}\n  \
           key-file: {key}\n  \
           trusted-ca-file: {ca}\n  \
           client-cert-auth: true\n",
        data = dir.path().join("data").display(),
        log = log.display(),
        cert = pki.path("server.crt"),
        key = pki.path("server.key"),
        ca = pki.path("ca.crt"),
    );
    let file = dir.path().join("etcd.conf.yml");
    std::fs::write(&file, yaml)?;
    // The command line's name is ignored: the file replaces it.
    let args = vec![
        format!("--config-file={}", file.display()),
        "--name=ignored".to_string(),
    ];
    let _procs = Procs(vec![spawn(&args, &dir.path().join("stderr.log"))?]);
    let tls = pki.client(Some("client"))?;
    eventually(|| async { put(&mut kv(client, tls.clone()).await?, "k", "v").await }).await?;
    let members = {
        let connector = concord::transport::connector(Duration::from_secs(5), None, Some(tls));
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{client}"))?
            .connect_with_connector(connector)
            .await?;
        concord::pb::etcdserverpb::cluster_client::ClusterClient::new(channel)
            .member_list(concord::pb::etcdserverpb::MemberListRequest {
                linearizable: false,
            })
            .await?
            .into_inner()
            .members
    };
    assert_eq!(members.first().map(|m| m.name.as_str()), Some("from-file"));
    let logged = std::fs::read_to_string(&log)?;
    assert!(
        logged.contains("loaded server configuration"),
        "logs went elsewhere: {logged}"
    );
    Ok(())
}

/// With `--client-cert-auth` and auth on, a request without a token is its certificate's CN's
/// (etcd's `AuthInfoFromTLS`): root's certificate may do anything, alice's only her prefix,
/// a certificate naming no user nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificates_cn_is_its_user_when_auth_is_on() -> TestResult {
    use concord::pb::authpb::{permission::Type, Permission};
    use concord::pb::etcdserverpb::auth_client::AuthClient;
    use concord::pb::etcdserverpb::{
        AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
        AuthUserGrantRoleRequest,
    };
    let dir = tempfile::tempdir()?;
    let pki = Pki::new(dir.path())?;
    pki.issue("server", "node", true)?;
    for (file, cn) in [
        ("root-client", "root"),
        ("alice-client", "alice"),
        ("nobody", "bob"),
    ] {
        pki.issue(file, cn, false)?;
    }
    let port = free_port()?;
    let _member = Procs(vec![spawn_one(&pki, dir.path(), port, &[])?]);
    let root = pki.client(Some("root-client"))?;
    let channel = eventually(|| async {
        let connector =
            concord::transport::connector(Duration::from_secs(5), None, Some(root.clone()));
        Ok(Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
            .connect_with_connector(connector)
            .await?)
    })
    .await?;
    let mut auth = AuthClient::new(channel);
    for name in ["root", "alice"] {
        auth.user_add(AuthUserAddRequest {
            name: name.into(),
            password: "pw".into(),
            ..Default::default()
        })
        .await?;
    }
    auth.role_add(AuthRoleAddRequest { name: "r".into() })
        .await?;
    auth.role_grant_permission(AuthRoleGrantPermissionRequest {
        name: "r".into(),
        perm: Some(Permission {
            perm_type: Type::Readwrite as i32,
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
        }),
    })
    .await?;
    for (user, role) in [("alice", "r"), ("root", "root")] {
        auth.user_grant_role(AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        })
        .await?;
    }
    auth.auth_enable(concord::pb::etcdserverpb::AuthEnableRequest {})
        .await?;
    let mut alice = kv(port, pki.client(Some("alice-client"))?).await?;
    put(&mut alice, "a/1", "v").await?;
    let denied = put(&mut alice, "b", "v").await.err().map(|e| e.to_string());
    assert!(denied.is_some_and(|e| e.contains("etcdserver: permission denied")));
    let mut nobody = kv(port, pki.client(Some("nobody"))?).await?;
    assert!(put(&mut nobody, "a/2", "v").await.is_err());
    put(&mut kv(port, root).await?, "b", "v").await?;
    Ok(())
}
