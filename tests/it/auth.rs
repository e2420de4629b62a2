//! Auth on a 3-member cluster: users, roles and permissions set up through the Auth service,
//! tokens issued by one member used on the others, every service denied or allowed as etcd
//! (3.5.28's rules) does, a role revoked while its user writes, a deleted user's token, a
//! follower caught up by a snapshot enforcing the same permissions, and auth turned off again.

use std::time::{Duration, Instant};

use concord::pb::authpb::permission::Type as PermType;
use concord::pb::authpb::Permission;
use concord::pb::etcdserverpb::auth_client::AuthClient;
use concord::pb::etcdserverpb::cluster_client::ClusterClient;
use concord::pb::etcdserverpb::lease_client::LeaseClient;
use concord::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use concord::pb::etcdserverpb::request_op::Request as Op;
use concord::pb::etcdserverpb::watch_client::WatchClient;
use concord::pb::etcdserverpb::watch_request::RequestUnion;
use concord::pb::etcdserverpb::{
    AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
    AuthUserDeleteRequest, AuthUserGrantRoleRequest, AuthUserRevokeRoleRequest,
    AuthenticateRequest, LeaseGrantRequest, MemberListRequest, PutRequest, RangeRequest, RequestOp,
    StatusRequest, TxnRequest, WatchCreateRequest, WatchRequest,
};
use concord::pb::v3lockpb::lock_client::LockClient;
use concord::pb::v3lockpb::LockRequest;
use tonic::transport::Channel;
use tonic::{Code, Request};

use crate::cluster::{Cluster, TestResult};

/// A request carrying `token` the way clientv3 sends it.
fn with_token<T>(msg: T, token: &str) -> TestResult<Request<T>> {
    let mut r = Request::new(msg);
    r.metadata_mut().insert("token", token.parse()?);
    Ok(r)
}

async fn auth(c: &Cluster, i: usize) -> TestResult<AuthClient<Channel>> {
    Ok(AuthClient::connect(c.client_url(i)?).await?)
}

async fn login(c: &Cluster, i: usize, name: &str, password: &str) -> TestResult<String> {
    let r = auth(c, i)
        .await?
        .authenticate(AuthenticateRequest {
            name: name.into(),
            password: password.into(),
        })
        .await?;
    Ok(r.into_inner().token)
}

fn put_req(key: &str) -> PutRequest {
    PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        ..Default::default()
    }
}

/// `root` (password `rootpw`) with the root role; `u` (password `upw`) with role `r`:
/// READWRITE on the prefix `a/`; auth enabled. Set up through member 0.
async fn setup(c: &Cluster) -> TestResult {
    let mut a = auth(c, 0).await?;
    for (name, password) in [("root", "rootpw"), ("u", "upw")] {
        a.user_add(AuthUserAddRequest {
            name: name.into(),
            password: password.into(),
            ..Default::default()
        })
        .await?;
    }
    a.role_add(AuthRoleAddRequest { name: "r".into() }).await?;
    a.role_grant_permission(AuthRoleGrantPermissionRequest {
        name: "r".into(),
        perm: Some(Permission {
            perm_type: PermType::Readwrite as i32,
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
        }),
    })
    .await?;
    for (user, role) in [("u", "r"), ("root", "root")] {
        a.user_grant_role(AuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        })
        .await?;
    }
    a.auth_enable(AuthEnableRequest {}).await?;
    Ok(())
}

/// A cluster of `n` members started with `extra` flags, set up by [`setup`].
async fn auth_cluster(n: usize, extra: &[&str]) -> TestResult<Cluster> {
    // etcd's default timing, not the fault tests' short one: these tests send writes straight
    // after the set-up and do not retry them, so an election on a busy machine (the test suite
    // runs many clusters at once on two cores) would fail them with `leader changed`.
    let mut c = Cluster::prepare(n, extra)?.with_timing(100, 1000);
    for i in 0..n {
        c.spawn(i)?;
    }
    c.wait_leader(Duration::from_secs(20)).await?;
    setup(&c).await?;
    Ok(c)
}

fn denied<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, text: &str) {
    match r {
        Err(s) => {
            assert_eq!(s.code(), code, "{s:?}");
            assert_eq!(s.message(), text);
        }
        Ok(v) => panic!("allowed, expected {text}: {v:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_is_checked_with_tokens_valid_on_every_member() -> TestResult {
    let c = auth_cluster(3, &[]).await?;
    let user = login(&c, 0, "u", "upw").await?;
    let root = login(&c, 1, "root", "rootpw").await?;
    // A token issued through member 0 works on members 1 and 2 (the login is replicated).
    for i in 0..3 {
        let mut kv = c.kv(i).await?;
        kv.put(with_token(put_req(&format!("a/{i}")), &user)?)
            .await?;
        denied(
            kv.put(with_token(put_req("b"), &user)?).await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
    }
    let mut kv = c.kv(2).await?;
    denied(
        kv.put(put_req("a/x")).await,
        Code::InvalidArgument,
        "etcdserver: user name is empty",
    );
    denied(
        kv.put(with_token(put_req("a/x"), "bogus.1")?).await,
        Code::Unauthenticated,
        "etcdserver: invalid auth token",
    );
    denied(
        auth(&c, 2)
            .await?
            .authenticate(AuthenticateRequest {
                name: "u".into(),
                password: "wrong".into(),
            })
            .await,
        Code::InvalidArgument,
        "etcdserver: authentication failed, invalid user ID or password",
    );
    // Reads: the granted prefix, not beyond it.
    let range = |key: &str, end: &str| RangeRequest {
        key: key.into(),
        range_end: end.into(),
        ..Default::default()
    };
    let got = kv.range(with_token(range("a/", "a0"), &user)?).await?;
    assert_eq!(got.into_inner().count, 3);
    denied(
        kv.range(with_token(range("a", "b"), &user)?).await,
        Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    assert_eq!(
        kv.range(with_token(range("\0", "\0"), &root)?)
            .await?
            .into_inner()
            .count,
        3
    );
    // A nested txn is checked too (etcd 3.5.28 and on).
    let nested = TxnRequest {
        success: vec![RequestOp {
            request: Some(Op::RequestTxn(TxnRequest {
                success: vec![RequestOp {
                    request: Some(Op::RequestPut(put_req("z"))),
                }],
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    denied(
        kv.txn(with_token(nested, &user)?).await,
        Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    // Watches: refused at create, with etcd's cancel reason, on a stream that stays open.
    let mut watch = WatchClient::connect(c.client_url(1)?).await?;
    let creates = [("z", ""), ("a/", "a0")].map(|(k, e)| WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: k.into(),
            range_end: e.into(),
            ..Default::default()
        })),
    });
    let mut responses = watch
        .watch(with_token(tokio_stream::iter(creates), &user)?)
        .await?
        .into_inner();
    let refused = responses.message().await?.ok_or("no response")?;
    assert!(refused.created && refused.canceled && refused.watch_id == -1);
    assert_eq!(
        refused.cancel_reason,
        "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
    );
    let created = responses.message().await?.ok_or("no response")?;
    assert!(created.created && !created.canceled);
    // Maintenance and cluster: Status for root, MemberList for any user.
    let mut m = MaintenanceClient::connect(c.client_url(0)?).await?;
    denied(
        m.status(with_token(StatusRequest {}, &user)?).await,
        Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    m.status(with_token(StatusRequest {}, &root)?).await?;
    let mut cl = ClusterClient::connect(c.client_url(0)?).await?;
    denied(
        cl.member_list(MemberListRequest::default()).await,
        Code::InvalidArgument,
        "etcdserver: user name is empty",
    );
    cl.member_list(with_token(MemberListRequest::default(), &user)?)
        .await?;
    // Leases: granted to a user; locks need the lock's prefix.
    let mut leases = LeaseClient::connect(c.client_url(0)?).await?;
    let lease = leases
        .lease_grant(with_token(LeaseGrantRequest { ttl: 30, id: 0 }, &user)?)
        .await?
        .into_inner()
        .id;
    let mut lock = LockClient::connect(c.client_url(2)?).await?;
    let lock_req = |name: &str| LockRequest {
        name: name.into(),
        lease,
    };
    denied(
        lock.lock(with_token(lock_req("z"), &user)?).await,
        Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    lock.lock(with_token(lock_req("a/lock"), &user)?).await?;
    // Auth off: everything is open again, without a restart.
    let mut a = auth(&c, 0).await?;
    denied(
        a.auth_disable(with_token(Default::default(), &user)?).await,
        Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    a.auth_disable(with_token(Default::default(), &root)?)
        .await?;
    c.kv(1).await?.put(put_req("b")).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_role_and_a_deleted_user_take_effect_on_the_next_request() -> TestResult {
    let c = auth_cluster(3, &[]).await?;
    let user = login(&c, 1, "u", "upw").await?;
    let root = login(&c, 0, "root", "rootpw").await?;
    // A writer keeps writing on member 2 while root revokes its role through member 0.
    let writer = {
        let mut kv = c.kv(2).await?;
        let user = user.clone();
        tokio::spawn(async move {
            let mut ok = 0;
            for i in 0..400 {
                let Ok(req) = with_token(put_req(&format!("a/{i}")), &user) else {
                    break;
                };
                match kv.put(req).await {
                    Ok(_) => ok += 1,
                    Err(s) => return (ok, Some(s)),
                }
            }
            (ok, None)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    auth(&c, 0)
        .await?
        .user_revoke_role(with_token(
            AuthUserRevokeRoleRequest {
                name: "u".into(),
                role: "r".into(),
            },
            &root,
        )?)
        .await?;
    let (ok, error) = writer.await?;
    let error = error.ok_or("the writer was never denied")?;
    assert!(ok > 0, "writes before the revoke succeeded");
    assert!(
        [
            "etcdserver: permission denied",
            "etcdserver: revision of auth store is old"
        ]
        .contains(&error.message()),
        "{error:?}"
    );
    // From now on every member denies it: a member that has not applied the revoke yet checks
    // with its older auth store, and the leader's apply refuses the entry as etcd does.
    for i in 0..3 {
        match c.kv(i).await?.put(with_token(put_req("a/x"), &user)?).await {
            Err(s) => assert!(
                [
                    (Code::PermissionDenied, "etcdserver: permission denied"),
                    (
                        Code::InvalidArgument,
                        "etcdserver: revision of auth store is old"
                    ),
                ]
                .contains(&(s.code(), s.message())),
                "member {i}: {s:?}"
            ),
            Ok(r) => panic!("member {i} allowed a put after the revoke: {r:?}"),
        }
    }
    // A deleted user's token stops working everywhere at once.
    auth(&c, 0)
        .await?
        .user_delete(with_token(
            AuthUserDeleteRequest { name: "u".into() },
            &root,
        )?)
        .await?;
    for i in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match c.kv(i).await?.put(with_token(put_req("a/x"), &user)?).await {
                Err(s) if s.message() == "etcdserver: invalid auth token" => break,
                other if Instant::now() > deadline => panic!("member {i}: {other:?}"),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_caught_up_by_a_snapshot_enforces_the_same_permissions() -> TestResult {
    // The leader is found before auth is on (Status is root's once it is).
    let mut c = Cluster::start_with(3, &["--snapshot-count", "50"])?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    setup(&c).await?;
    let follower = (0..3).find(|i| *i != leader).ok_or("no follower")?;
    c.kill(follower)?;
    let root = login(&c, leader, "root", "rootpw").await?;
    let mut kv = c.kv(leader).await?;
    // Enough entries that the leader snapshots and purges what the follower misses, among
    // them the revoke.
    auth(&c, leader)
        .await?
        .user_revoke_role(with_token(
            AuthUserRevokeRoleRequest {
                name: "u".into(),
                role: "r".into(),
            },
            &root,
        )?)
        .await?;
    for i in 0..300 {
        kv.put(with_token(put_req(&format!("a/{i}")), &root)?)
            .await?;
    }
    c.spawn(follower)?;
    // The restarted follower knows no tokens: the user logs in through it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let user = loop {
        match login(&c, follower, "u", "upw").await {
            Ok(t) => break t,
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let serializable = RangeRequest {
        key: b"a/1".to_vec(),
        serializable: true,
        ..Default::default()
    };
    denied(
        c.kv(follower)
            .await?
            .range(with_token(serializable, &user)?)
            .await,
        Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    let root_here = login(&c, follower, "root", "rootpw").await?;
    let got = c
        .kv(follower)
        .await?
        .range(with_token(
            RangeRequest {
                key: b"a/".to_vec(),
                range_end: b"a0".to_vec(),
                count_only: true,
                ..Default::default()
            },
            &root_here,
        )?)
        .await?;
    assert_eq!(got.into_inner().count, 300);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_tokens_signed_by_one_member_are_accepted_by_every_member() -> TestResult {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    jwt_on_every_member("ES256", &key.serialize_pem(), &key.public_key_pem()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn es512_jwt_tokens_work_on_every_member() -> TestResult {
    use p521::pkcs8::{EncodePublicKey, LineEnding};
    let key = p521::SecretKey::random(&mut p521::elliptic_curve::rand_core::OsRng);
    let private = key.to_sec1_pem(LineEnding::LF)?;
    let public = key.public_key().to_public_key_pem(LineEnding::LF)?;
    jwt_on_every_member("ES512", &private, &public).await
}

/// JWTs of `method` with this key pair, on 3 members: signed by one member, accepted by every
/// member, old after an auth change.
async fn jwt_on_every_member(method: &str, private_pem: &str, public_pem: &str) -> TestResult {
    let keys = tempfile::tempdir()?;
    let (private, public) = (keys.path().join("jwt.key"), keys.path().join("jwt.pub"));
    std::fs::write(&private, private_pem)?;
    std::fs::write(&public, public_pem)?;
    let flag = format!(
        "--auth-token=jwt,pub-key={},priv-key={},sign-method={method},ttl=5m",
        public.display(),
        private.display()
    );
    let c = auth_cluster(3, &[flag.as_str()]).await?;
    let user = login(&c, 2, "u", "upw").await?;
    assert_eq!(user.split('.').count(), 3, "a JWT: {user}");
    for i in 0..3 {
        c.kv(i)
            .await?
            .put(with_token(put_req(&format!("a/{i}")), &user)?)
            .await?;
    }
    // Any change of the auth store makes older JWTs old for permission checks.
    let root = login(&c, 0, "root", "rootpw").await?;
    auth(&c, 0)
        .await?
        .role_add(with_token(AuthRoleAddRequest { name: "x".into() }, &root)?)
        .await?;
    denied(
        c.kv(1).await?.put(with_token(put_req("a/1"), &user)?).await,
        Code::InvalidArgument,
        "etcdserver: revision of auth store is old",
    );
    let fresh = login(&c, 1, "u", "upw").await?;
    c.kv(1)
        .await?
        .put(with_token(put_req("a/1"), &fresh)?)
        .await?;
    denied(
        c.kv(0)
            .await?
            .put(with_token(put_req("a/1"), "a.b.c")?)
            .await,
        Code::Unauthenticated,
        "etcdserver: invalid auth token",
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simple_token_expires_after_its_ttl_without_use_and_lives_on_while_used() -> TestResult {
    let c = auth_cluster(1, &["--auth-token-ttl", "3"]).await?;
    let used = login(&c, 0, "u", "upw").await?;
    let idle = login(&c, 0, "u", "upw").await?;
    let mut kv = c.kv(0).await?;
    // Used every 0.3 s for over four seconds: its 3 s TTL restarts with each use; the idle
    // one is past it.
    for i in 0..14 {
        kv.put(with_token(put_req(&format!("a/{i}")), &used)?)
            .await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    denied(
        kv.put(with_token(put_req("a/x"), &idle)?).await,
        Code::Unauthenticated,
        "etcdserver: invalid auth token",
    );
    kv.put(with_token(put_req("a/y"), &used)?).await?;
    Ok(())
}

/// A keep-alive stream is checked per keep-alive with the auth store of its moment: an
/// unrelated change (a new user) does not end it, a deleted user's token does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_stream_is_judged_per_keep_alive() -> TestResult {
    use concord::pb::etcdserverpb::LeaseKeepAliveRequest;
    let c = auth_cluster(1, &[]).await?;
    let user = login(&c, 0, "u", "upw").await?;
    let root = login(&c, 0, "root", "rootpw").await?;
    let mut leases = LeaseClient::connect(c.client_url(0)?).await?;
    let id = leases
        .lease_grant(with_token(LeaseGrantRequest { ttl: 30, id: 0 }, &user)?)
        .await?
        .into_inner()
        .id;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = leases
        .lease_keep_alive(with_token(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            &user,
        )?)
        .await?
        .into_inner();
    tx.send(LeaseKeepAliveRequest { id }).await?;
    assert_eq!(replies.message().await?.ok_or("no reply")?.ttl, 30);
    let mut a = auth(&c, 0).await?;
    a.user_add(with_token(
        AuthUserAddRequest {
            name: "other".into(),
            password: "pw".into(),
            ..Default::default()
        },
        &root,
    )?)
    .await?;
    tx.send(LeaseKeepAliveRequest { id }).await?;
    assert_eq!(replies.message().await?.ok_or("no reply")?.ttl, 30);
    a.user_delete(with_token(
        AuthUserDeleteRequest { name: "u".into() },
        &root,
    )?)
    .await?;
    tx.send(LeaseKeepAliveRequest { id }).await?;
    let ended = replies.message().await;
    assert!(
        ended
            .as_ref()
            .is_err_and(|s| s.message() == "etcdserver: invalid auth token"),
        "{ended:?}"
    );
    Ok(())
}
