//! The workloads: each client runs operations in a loop (closed loop, or at a fixed offered
//! rate measured from the intended start time so that a stalled server cannot hide its latency),
//! after a one-second warm-up that is not measured.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::authed::WithToken as Channel;
use anyhow::Context as _;
use concord::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use concord::pb::etcdserverpb::kv_client::KvClient;
use concord::pb::etcdserverpb::lease_client::LeaseClient;
use concord::pb::etcdserverpb::request_op::Request as OpRequest;
use concord::pb::etcdserverpb::watch_client::WatchClient;
use concord::pb::etcdserverpb::watch_request::RequestUnion;
use concord::pb::etcdserverpb::{
    Compare, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, PutRequest,
    RangeRequest, RequestOp, TxnRequest, WatchCreateRequest, WatchRequest,
};
use concord::pb::v3lockpb::lock_client::LockClient;
use concord::pb::v3lockpb::{LockRequest, UnlockRequest};
use tokio::sync::mpsc;
use tonic::transport::Endpoint;
use tonic::Status;

use crate::report::Measured;
use crate::{Args, Workload};

const WARMUP: Duration = Duration::from_secs(1);
/// Keys per prefix in range-prefix.
const PREFIX_KEYS: usize = 100;
/// Prefixes in range-prefix.
const PREFIXES: usize = 100;

/// Runs the workload of `args`.
///
/// # Errors
/// When the servers cannot be reached or the preparation fails.
pub async fn run(args: &Args) -> anyhow::Result<Measured> {
    let channels = connect(args).await?;
    if matches!(args.workload, Workload::Watch | Workload::WatchKeys) {
        return watch(args, &channels).await;
    }
    if args.workload == Workload::Load {
        let started = Instant::now();
        let mut m = Measured::new()?;
        m.ops = prefill(args, &channels).await? as u64;
        m.elapsed = started.elapsed();
        return Ok(m);
    }
    if !args.no_prefill {
        prefill(args, &channels).await?;
    }
    let args = Arc::new(args.clone());
    let measure_from = Instant::now() + WARMUP;
    let end = measure_from + args.duration;
    let usage = crate::report::server_usage(&args.server_pids, measure_from, end);
    let mut tasks = Vec::new();
    for id in 0..args.clients {
        let channel = channels[id % channels.len()].clone();
        let args = args.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = Client::new(args.clone(), id, channel).await?;
            let mut m = Measured::new()?;
            let interval = (args.rate > 0)
                .then(|| Duration::from_secs_f64(args.clients as f64 / args.rate as f64));
            // Clients start spread over one interval, so that the offered load arrives evenly
            // (all starting at once sent bursts of `--clients` requests every interval).
            let mut next = Instant::now()
                + interval.map_or(Duration::ZERO, |every| {
                    every * id as u32 / args.clients as u32
                });
            while Instant::now() < end {
                let started = match interval {
                    Some(every) => {
                        tokio::time::sleep_until(next.into()).await;
                        let intended = next;
                        next += every;
                        intended
                    }
                    None => Instant::now(),
                };
                let done = client.op().await;
                if started >= measure_from {
                    let took = started.elapsed();
                    if args
                        .slow_ms
                        .is_some_and(|ms| took >= Duration::from_millis(ms))
                    {
                        let at = started
                            .saturating_duration_since(measure_from)
                            .as_secs_f64();
                        eprintln!(
                            "slow: client {id} at {at:.3} s took {} ms",
                            took.as_millis()
                        );
                    }
                    match done {
                        Ok(()) => m.record(took),
                        Err(_) => m.errors += 1,
                    }
                }
            }
            client.finish().await;
            anyhow::Ok(m)
        }));
    }
    gather(tasks, args.duration, usage).await
}

/// The clients' (or watchers') measurements merged into one over `duration`, with the servers'
/// and this process's CPU from `usage`.
async fn gather(
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<Measured>>>,
    duration: Duration,
    usage: tokio::task::JoinHandle<(crate::report::ProcStats, f64)>,
) -> anyhow::Result<Measured> {
    let mut total = Measured::new()?;
    for t in tasks {
        total.merge(&t.await??)?;
    }
    total.elapsed = duration;
    let (usage, client_cpu) = usage.await?;
    total.server_usage = Some(usage);
    total.client_cpu = Some(client_cpu);
    Ok(total)
}

/// The TLS client configuration `--cacert`, `--cert` and `--key` ask for.
fn tls_config(args: &Args) -> anyhow::Result<Option<std::sync::Arc<rustls::ClientConfig>>> {
    let Some(ca) = &args.cacert else {
        return Ok(None);
    };
    let cert = args.cert.as_deref().zip(args.key.as_deref());
    let config = concord::tls::client_config(Some(ca), cert).map_err(anyhow::Error::msg)?;
    Ok(Some(config))
}

/// One channel per `--conns`, over the endpoints in turn, logged in with `--user`.
pub(crate) async fn connect(args: &Args) -> anyhow::Result<Vec<Channel>> {
    let tls = tls_config(args)?;
    let mut channels = Vec::new();
    for i in 0..args.conns.max(1) {
        let url = &args.endpoints[i % args.endpoints.len()];
        if args.plain {
            // An ordinary tonic client: its own connector (one write per frame flush) and a
            // unary request's END_STREAM in a frame of its own.
            let channel = Endpoint::from_shared(url.clone())?
                .connect()
                .await
                .with_context(|| format!("connecting to {url}"))?;
            let unchanged: fn(
                http::Request<tonic::body::Body>,
            ) -> http::Request<tonic::body::Body> = |r| r;
            channels.push(tower::util::MapRequest::new(channel, unchanged));
            continue;
        }
        // Requests are written through the server's write coalescing too: a load generator
        // that pays one `writev` per request spends the CPU the servers under test share.
        // TLS is done by the connector; tonic sees a plain URL.
        let connector = concord::transport::connector(Duration::from_secs(5), None, tls.clone());
        let plain = url.replacen("https://", "http://", 1);
        let channel = Endpoint::from_shared(plain)?
            .connect_with_connector(connector)
            .await
            .with_context(|| format!("connecting to {url}"))?;
        // Unary requests carry END_STREAM on their data frame, as grpc-go's (etcd's clients)
        // do; tonic alone sends a separate empty frame, which a tonic server waits for.
        channels.push(concord::transport::eager(channel));
    }
    crate::authed::authed(channels, args.user.as_deref()).await
}

fn key(i: usize) -> Vec<u8> {
    format!("bench/k/{i:08}").into_bytes()
}

fn prefix(group: usize) -> Vec<u8> {
    format!("bench/p/{group:04}/").into_bytes()
}

/// Writes the keys the read workloads read (or, for `load`, the whole key space) with as many
/// writers as clients; returns how many.
async fn prefill(args: &Args, channels: &[Channel]) -> anyhow::Result<usize> {
    let keys: Vec<Vec<u8>> = match args.workload {
        Workload::Range | Workload::Mixed | Workload::Load => {
            (0..args.key_space).map(key).collect()
        }
        Workload::RangePrefix => (0..PREFIXES)
            .flat_map(|g| {
                (0..PREFIX_KEYS).map(move |k| [prefix(g), format!("{k:03}").into_bytes()].concat())
            })
            .collect(),
        _ => return Ok(0),
    };
    let value = incompressible(args.value_size, 1);
    let count = keys.len();
    let keys = Arc::new(keys);
    let writers = args.clients.max(1);
    let mut tasks = Vec::new();
    for t in 0..writers {
        let mut kv = KvClient::new(channels[t % channels.len()].clone());
        let (keys, value) = (keys.clone(), value.clone());
        tasks.push(tokio::spawn(async move {
            for k in keys.iter().skip(t).step_by(writers) {
                kv.put(PutRequest {
                    key: k.clone(),
                    value: value.clone(),
                    ..Default::default()
                })
                .await?;
            }
            Ok::<(), Status>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(count)
}

/// One client's connection and state.
struct Client {
    args: Arc<Args>,
    id: usize,
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    lock: LockClient<Channel>,
    rng: u64,
    value: Vec<u8>,
    /// txn-cas: the mod revision of this client's key.
    cas_revision: i64,
    /// lock workloads: this client's session lease.
    session: i64,
    /// lease-keepalive: this client's leases and its keep-alive stream.
    kept: Vec<i64>,
    keepalive: Option<(
        mpsc::Sender<LeaseKeepAliveRequest>,
        tonic::Streaming<concord::pb::etcdserverpb::LeaseKeepAliveResponse>,
    )>,
}

impl Client {
    async fn new(args: Arc<Args>, id: usize, channel: Channel) -> anyhow::Result<Self> {
        let mut c = Client {
            id,
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            lock: LockClient::new(channel),
            rng: 0x9e37_79b9_7f4a_7c15 ^ (id as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9),
            value: incompressible(args.value_size, id as u64 + 2),
            cas_revision: 0,
            session: 0,
            kept: Vec::new(),
            keepalive: None,
            args,
        };
        match c.args.workload {
            Workload::TxnCas => {
                let resp =
                    c.kv.put(PutRequest {
                        key: c.cas_key(),
                        value: c.value.clone(),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                c.cas_revision = resp.header.map_or(0, |h| h.revision);
            }
            Workload::Lock | Workload::LockContended => c.session = c.grant(60).await?,
            Workload::LeaseKeepalive => {
                let mine = (c.args.leases / c.args.clients.max(1)).max(1);
                for _ in 0..mine {
                    let id = c.grant(600).await?;
                    c.kept.push(id);
                }
                let (tx, rx) = mpsc::channel(16);
                // grpc-go (etcd) answers the stream's headers with its first message: send one
                // keep-alive before waiting for the stream.
                let first = c.kept.first().copied().unwrap_or_default();
                tx.send(LeaseKeepAliveRequest { id: first }).await?;
                let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
                let mut responses = c.lease.lease_keep_alive(stream).await?.into_inner();
                responses.message().await?;
                c.keepalive = Some((tx, responses));
            }
            _ => {}
        }
        Ok(c)
    }

    fn next(&mut self) -> usize {
        xorshift(&mut self.rng) as usize
    }

    fn cas_key(&self) -> Vec<u8> {
        format!("bench/cas/{:06}", self.id).into_bytes()
    }

    async fn grant(&mut self, ttl: i64) -> Result<i64, Status> {
        let resp = self
            .lease
            .lease_grant(LeaseGrantRequest { ttl, id: 0 })
            .await?;
        Ok(resp.into_inner().id)
    }

    async fn put(&mut self, key: Vec<u8>, lease: i64) -> Result<(), Status> {
        self.kv
            .put(PutRequest {
                key,
                value: self.value.clone(),
                lease,
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    async fn get(&mut self, key: Vec<u8>, range_end: Vec<u8>) -> Result<(), Status> {
        self.kv
            .range(RangeRequest {
                key,
                range_end,
                serializable: self.args.serializable,
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    /// One operation of the workload.
    async fn op(&mut self) -> Result<(), Status> {
        let space = self.args.key_space.max(1);
        match self.args.workload {
            Workload::Put => {
                let k = key(self.next() % space);
                self.put(k, 0).await
            }
            Workload::Range => {
                let k = key(self.next() % space);
                self.get(k, Vec::new()).await
            }
            Workload::RangePrefix => {
                let p = prefix(self.next() % PREFIXES);
                let end = concord::storage::prefix_end(&p);
                self.get(p, end).await
            }
            Workload::Mixed => {
                let n = self.next();
                if n.is_multiple_of(10) {
                    self.put(key(n / 10 % space), 0).await
                } else {
                    self.get(key(n / 10 % space), Vec::new()).await
                }
            }
            Workload::TxnCas => self.cas().await,
            Workload::Lease => {
                let id = self.grant(60).await?;
                let k = format!("bench/lease/{:06}", self.id).into_bytes();
                self.put(k, id).await?;
                self.lease.lease_revoke(LeaseRevokeRequest { id }).await?;
                Ok(())
            }
            Workload::Lock | Workload::LockContended => {
                let name = if self.args.workload == Workload::Lock {
                    format!("bench/lock/{:06}", self.id).into_bytes()
                } else {
                    b"bench/lock/shared".to_vec()
                };
                let held = self
                    .lock
                    .lock(LockRequest {
                        name,
                        lease: self.session,
                    })
                    .await?
                    .into_inner();
                self.lock.unlock(UnlockRequest { key: held.key }).await?;
                Ok(())
            }
            Workload::LeaseKeepalive => {
                let pick = self.next() % self.kept.len().max(1);
                let id = self.kept.get(pick).copied().unwrap_or_default();
                let (tx, responses) = self
                    .keepalive
                    .as_mut()
                    .ok_or_else(|| Status::internal("no keep-alive stream"))?;
                tx.send(LeaseKeepAliveRequest { id })
                    .await
                    .map_err(|_| Status::internal("keep-alive stream closed"))?;
                match responses.message().await? {
                    Some(r) if r.ttl > 0 => Ok(()),
                    _ => Err(Status::internal("lease lost")),
                }
            }
            Workload::Watch | Workload::WatchKeys | Workload::Load | Workload::Snapshot => Ok(()),
        }
    }

    /// Kubernetes' update: succeed only if nobody changed the key since we read it.
    async fn cas(&mut self) -> Result<(), Status> {
        let key = self.cas_key();
        let resp = self
            .kv
            .txn(TxnRequest {
                compare: vec![Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Mod as i32,
                    key: key.clone(),
                    range_end: Vec::new(),
                    target_union: Some(TargetUnion::ModRevision(self.cas_revision)),
                }],
                success: vec![RequestOp {
                    request: Some(OpRequest::RequestPut(PutRequest {
                        key,
                        value: self.value.clone(),
                        ..Default::default()
                    })),
                }],
                failure: Vec::new(),
            })
            .await?
            .into_inner();
        if !resp.succeeded {
            return Err(Status::aborted("compare failed"));
        }
        self.cas_revision = resp.header.map_or(0, |h| h.revision);
        Ok(())
    }

    async fn finish(&mut self) {
        self.keepalive = None;
        for id in std::mem::take(&mut self.kept) {
            let _ = self.lease.lease_revoke(LeaseRevokeRequest { id }).await;
        }
        if self.session != 0 {
            let _ = self
                .lease
                .lease_revoke(LeaseRevokeRequest { id: self.session })
                .await;
        }
    }
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// One writer puts (at `--rate`, or as fast as it can) values carrying their send time; every
/// watcher records each event's put-to-delivery latency. With `watch-keys` each watcher watches
/// a key of its own and `--clients` writers put to random watchers' keys.
async fn watch(args: &Args, channels: &[Channel]) -> anyhow::Result<Measured> {
    let prefix = b"bench/watch/".to_vec();
    let end_key = concord::storage::prefix_end(&prefix);
    let measure_from = Instant::now() + WARMUP + Duration::from_secs(1);
    let end = measure_from + args.duration;
    let usage = crate::report::server_usage(&args.server_pids, measure_from, end);
    let mut watchers = Vec::new();
    let (ready_tx, mut ready_rx) = mpsc::channel::<()>(args.watchers.max(1));
    for w in 0..args.watchers {
        let mut client = WatchClient::new(channels[w % channels.len()].clone());
        let (key, range_end) = if args.workload == Workload::WatchKeys {
            (watched_key(&prefix, w), Vec::new())
        } else {
            (prefix.clone(), end_key.clone())
        };
        let ready = ready_tx.clone();
        watchers.push(tokio::spawn(async move {
            let create = WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                    key,
                    range_end,
                    ..Default::default()
                })),
            };
            let (tx, rx) = mpsc::channel(1);
            tx.send(create).await?;
            let mut stream = client
                .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await?
                .into_inner();
            let mut m = Measured::new()?;
            let _ = ready.send(()).await;
            loop {
                let next = tokio::time::timeout_at(end.into(), stream.message()).await;
                let Ok(Ok(Some(resp))) = next else { break };
                let now = now_nanos();
                for ev in resp.events {
                    let sent = ev
                        .kv
                        .and_then(|kv| kv.value.get(..8).map(|b| b.to_vec()))
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map_or(0, u64::from_be_bytes);
                    if Instant::now() >= measure_from {
                        m.record(Duration::from_nanos(now.saturating_sub(sent)));
                    }
                }
            }
            drop(tx);
            anyhow::Ok(m)
        }));
    }
    drop(ready_tx);
    for _ in 0..args.watchers {
        ready_rx.recv().await;
    }
    if args.workload == Workload::WatchKeys {
        write_to_watchers(args, channels, &prefix, end).await?;
    } else {
        fan_out_writer(args, channels, &prefix, end).await?;
    }
    gather(watchers, args.duration, usage).await
}

/// Watcher `w`'s key in `watch-keys`.
fn watched_key(prefix: &[u8], w: usize) -> Vec<u8> {
    [prefix, format!("{w:06}").as_bytes()].concat()
}

/// `watch`'s one writer: puts over 1,000 keys of the watched prefix until `end`.
async fn fan_out_writer(
    args: &Args,
    channels: &[Channel],
    prefix: &[u8],
    end: Instant,
) -> anyhow::Result<()> {
    let mut kv = KvClient::new(channels[0].clone());
    let mut value = incompressible(args.value_size.max(8), 0);
    let every = (args.rate > 0).then(|| Duration::from_secs_f64(1.0 / args.rate as f64));
    let mut next = Instant::now();
    let mut i = 0u64;
    while Instant::now() < end {
        if let Some(every) = every {
            tokio::time::sleep_until(next.into()).await;
            next += every;
        }
        value[..8].copy_from_slice(&now_nanos().to_be_bytes());
        let key = [prefix, format!("{:04}", i % 1000).as_bytes()].concat();
        i += 1;
        kv.put(PutRequest {
            key,
            value: value.clone(),
            ..Default::default()
        })
        .await?;
    }
    Ok(())
}

/// `watch-keys`' writers: `--clients` closed loops, spread over the connections, each putting
/// to a random watcher's key until `end`.
async fn write_to_watchers(
    args: &Args,
    channels: &[Channel],
    prefix: &[u8],
    end: Instant,
) -> anyhow::Result<()> {
    let mut writers = Vec::new();
    for c in 0..args.clients.max(1) {
        let mut kv = KvClient::new(channels[c % channels.len()].clone());
        let (prefix, watchers) = (prefix.to_vec(), args.watchers.max(1));
        let mut value = incompressible(args.value_size.max(8), c as u64);
        writers.push(tokio::spawn(async move {
            let mut state = (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            while Instant::now() < end {
                let w = usize::try_from(xorshift(&mut state) % watchers as u64).unwrap_or(0);
                value[..8].copy_from_slice(&now_nanos().to_be_bytes());
                kv.put(PutRequest {
                    key: watched_key(&prefix, w),
                    value: value.clone(),
                    ..Default::default()
                })
                .await?;
            }
            anyhow::Ok(())
        }));
    }
    for w in writers {
        w.await??;
    }
    Ok(())
}

/// `len` pseudo-random bytes from `seed`: values that compression cannot shrink, as most real
/// values (serialized objects, certificates) mostly cannot, so that a server that compresses
/// what it writes gains nothing here that it would not gain in use.
fn incompressible(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| (xorshift(&mut state) >> 24) as u8)
        .collect()
}

/// The next number of the xorshift generator whose state is `state` (never 0).
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
