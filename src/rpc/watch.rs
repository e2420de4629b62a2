//! `etcdserverpb.Watch`: one bidirectional stream carrying many watches.
//!
//! Per stream, a receive task handles create/cancel/progress requests, and the response stream
//! itself turns hub messages into `WatchResponse`s (filling headers, looking up `prev_kv`,
//! fragmenting) when the connection polls it: no task or channel between the hub and HTTP/2.
//! Streams opened with `hasleader` end with `etcdserver: no leader` when the member has had no
//! leader for three election timeouts, as etcd's; every stream ends with `etcdserver: server
//! stopped` on shutdown, so clients resume elsewhere from the last revision they saw.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::Stream;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};

use super::{fill_header, require_leader, status::status, Context, HAS_LEADER_KEY};
use crate::error::Error;
use crate::metrics;
use crate::mvcc::{KeyRange, KvTxn};
use crate::pb::etcdserverpb::watch_create_request::FilterType;
use crate::pb::etcdserverpb::watch_request::RequestUnion;
use crate::pb::etcdserverpb::watch_server::Watch;
use crate::pb::etcdserverpb::{ResponseHeader, WatchCreateRequest, WatchRequest, WatchResponse};
use crate::pb::mvccpb::event::EventType;
use crate::pb::mvccpb::Event;
use crate::raft::RaftNode;
use crate::watch::{StreamMsg, WatchHub, WatchSpec};

/// Hub messages buffered per stream before its watchers are moved aside as slow.
const STREAM_BUFFER: usize = 256;
/// etcd's error for a watch whose range end is not above its key.
const EMPTY_RANGE: &str = "mvcc: watcher range is empty";
/// etcd's error when a client reuses a watch id on one stream.
const DUPLICATE_WATCH_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

/// The Watch service.
pub struct WatchService {
    ctx: Context,
    stop: watch::Receiver<bool>,
}

impl WatchService {
    /// A Watch service over `ctx`; streams end when `stop` turns true.
    pub fn new(ctx: Context, stop: watch::Receiver<bool>) -> Self {
        WatchService { ctx, stop }
    }
}

type WatchOut = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Watch for WatchService {
    async fn watch(
        &self,
        req: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<WatchOut>, Status> {
        require_leader(&self.ctx.node, &req)?;
        let needs_leader = req
            .metadata()
            .get(HAS_LEADER_KEY)
            .is_some_and(|v| v.as_bytes() == b"true");
        let node = self.ctx.node.clone();
        let stream = node.hub().new_stream();
        let (msg_tx, msg_rx) = mpsc::channel(STREAM_BUFFER);
        // Checked at each create, as etcd does (the auth store may change meanwhile); a token
        // of a login this member has not applied yet is waited for first.
        let _ = self.ctx.caller(&req).await;
        let credentials = self.ctx.credentials(&req);
        tokio::spawn(receive(
            node.clone(),
            stream,
            req.into_inner(),
            msg_tx,
            credentials,
        ));
        Ok(Response::new(responses(
            node,
            msg_rx,
            needs_leader,
            self.stop.clone(),
        )))
    }
}

/// Handles the client's requests until it closes the stream or the send side ends.
async fn receive(
    node: Arc<RaftNode>,
    stream: u64,
    mut incoming: Streaming<WatchRequest>,
    tx: mpsc::Sender<StreamMsg>,
    credentials: crate::auth::Credentials,
) {
    let hub = node.hub().clone();
    // Client watch id -> hub id.
    let mut watches: HashMap<i64, u64> = HashMap::new();
    let mut next_auto: i64 = 0;
    loop {
        let req = tokio::select! {
            r = incoming.message() => r,
            _ = tx.closed() => break,
        };
        let Ok(Some(req)) = req else { break };
        let control = match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => match may_watch(&node, &credentials, &c) {
                Ok(()) => {
                    let revision = node.mvcc().current_revision();
                    create(&hub, revision, stream, c, &mut watches, &mut next_auto, &tx)
                }
                Err(_) => Some(refused(node.mvcc().current_revision())),
            },
            // A watch the server ended itself (its start compacted) keeps its ID until the
            // client cancels it, as on etcd: that cancel is answered too, and frees the ID.
            Some(RequestUnion::CancelRequest(c)) => match watches.remove(&c.watch_id) {
                Some(id) => {
                    hub.cancel(id);
                    Some(WatchResponse {
                        header: Some(ResponseHeader {
                            revision: node.mvcc().current_revision(),
                            ..Default::default()
                        }),
                        watch_id: c.watch_id,
                        canceled: true,
                        ..Default::default()
                    })
                }
                None => None,
            },
            Some(RequestUnion::ProgressRequest(_)) => {
                hub.request_progress(stream, tx.clone());
                None
            }
            None => None,
        };
        if let Some(resp) = control {
            if tx.send(StreamMsg::Control(resp)).await.is_err() {
                break;
            }
        }
    }
    let ids: Vec<u64> = watches.values().copied().collect();
    hub.drop_stream(stream, &ids);
}

/// Whether the sender may watch what `c` names (read access; an empty key is `\0`).
fn may_watch(
    node: &RaftNode,
    credentials: &crate::auth::Credentials,
    c: &WatchCreateRequest,
) -> Result<(), crate::error::Error> {
    let auth = node.auth();
    if !auth.enabled() {
        return Ok(());
    }
    let caller = auth.resolve(credentials)?;
    let key = if c.key.is_empty() {
        vec![0]
    } else {
        c.key.clone()
    };
    let need = crate::auth::Need {
        access: crate::auth::Access::Read,
        key,
        range_end: c.range_end.clone(),
    };
    crate::auth::check(&auth.current(), caller.as_ref(), &[need])
}

/// The reason a create refused for its credentials is canceled with: the gRPC error's Go text,
/// as etcd's watch server puts it.
const PERMISSION_DENIED: &str =
    "rpc error: code = PermissionDenied desc = etcdserver: permission denied";

/// A create refused for its credentials. etcd 3.5.1 gives one reason whatever the cause (no
/// user, a bad token, an old revision, no permission): permission denied.
fn refused(revision: i64) -> WatchResponse {
    WatchResponse {
        header: Some(ResponseHeader {
            revision,
            ..Default::default()
        }),
        watch_id: -1,
        created: true,
        canceled: true,
        cancel_reason: PERMISSION_DENIED.into(),
        ..Default::default()
    }
}

/// Registers a watch; returns the `created` response (sent before any of its events, since
/// the watch starts after the revision in its header). `revision` is the store's, as etcd's
/// header: it counts every write already answered, which the hub may not have published yet
/// (the watch then skips those events, as it would have on etcd).
fn create(
    hub: &Arc<WatchHub>,
    revision: i64,
    stream: u64,
    c: WatchCreateRequest,
    watches: &mut HashMap<i64, u64>,
    next_auto: &mut i64,
    tx: &mpsc::Sender<StreamMsg>,
) -> Option<WatchResponse> {
    let header = Some(ResponseHeader {
        revision,
        ..Default::default()
    });
    let refuse = |reason: &str| {
        Some(WatchResponse {
            header,
            watch_id: -1,
            created: true,
            canceled: true,
            cancel_reason: reason.into(),
            ..Default::default()
        })
    };
    // As etcd: a range that ends at or before its key watches nothing ("\0" means from-key).
    if !c.range_end.is_empty() && c.range_end != [0] && c.key >= c.range_end {
        return refuse(EMPTY_RANGE);
    }
    let watch_id = if c.watch_id > 0 {
        if watches.contains_key(&c.watch_id) {
            return refuse(DUPLICATE_WATCH_ID);
        }
        c.watch_id
    } else {
        while watches.contains_key(next_auto) {
            *next_auto += 1;
        }
        let id = *next_auto;
        *next_auto += 1;
        id
    };
    // As etcd: an empty key means "\0", the smallest key.
    let key = if c.key.is_empty() { vec![0] } else { c.key };
    let spec = WatchSpec {
        watch_id,
        range: KeyRange::new(&key, &c.range_end),
        no_put: c.filters.contains(&(FilterType::Noput as i32)),
        no_delete: c.filters.contains(&(FilterType::Nodelete as i32)),
        prev_kv: c.prev_kv,
        fragment: c.fragment,
        progress_notify: c.progress_notify,
    };
    let start = if c.start_revision > 0 {
        c.start_revision
    } else {
        revision + 1
    };
    // Queue `created` first, then register: every event of the watch comes after it.
    let created = WatchResponse {
        header,
        watch_id,
        created: true,
        ..Default::default()
    };
    if tx.try_send(StreamMsg::Control(created)).is_err() {
        return Some(WatchResponse {
            header,
            watch_id,
            created: true,
            canceled: true,
            cancel_reason: "etcdserver: too many requests".into(),
            ..Default::default()
        });
    }
    let id = hub.watch(stream, spec, start, tx.clone());
    watches.insert(watch_id, id);
    None
}

/// What the response stream of one watch stream carries between polls.
struct Outgoing {
    node: Arc<RaftNode>,
    rx: mpsc::Receiver<StreamMsg>,
    /// Fragments of a message not yet sent.
    pending: VecDeque<WatchResponse>,
    leader_check: Option<tokio::time::Interval>,
    /// Consecutive leader checks that found no leader.
    leaderless: u32,
    stop: watch::Receiver<bool>,
    /// Set once the closing error is out: the next poll ends the stream.
    ended: bool,
    _open: StreamGauge,
}

/// Election timeouts in a row without a leader after which a `hasleader` stream ends, as etcd's
/// (`maxNoLeaderCnt`): a new leader is usually elected sooner, and a watch that lives through
/// the election costs its client nothing, where a restarted one costs a new stream (and, for
/// kube-apiserver, a watch-cache restart). New streams are refused at once without a leader.
const NO_LEADER_CHECKS: u32 = 3;

/// The responses of one stream: hub messages turned into responses until the stream ends, the
/// member loses its leader for [`NO_LEADER_CHECKS`] election timeouts (for `hasleader` streams)
/// or the server stops.
fn responses(
    node: Arc<RaftNode>,
    rx: mpsc::Receiver<StreamMsg>,
    needs_leader: bool,
    stop: watch::Receiver<bool>,
) -> WatchOut {
    metrics::WATCH_STREAMS.fetch_add(1, Ordering::Relaxed);
    let state = Outgoing {
        leader_check: needs_leader.then(|| {
            let every = node.election_timeout();
            tokio::time::interval_at(tokio::time::Instant::now() + every, every)
        }),
        leaderless: 0,
        node,
        rx,
        pending: VecDeque::new(),
        stop,
        ended: false,
        _open: StreamGauge,
    };
    Box::pin(futures::stream::unfold(state, |mut s| async move {
        if let Some(resp) = s.pending.pop_front() {
            return Some((Ok(resp), s));
        }
        if s.ended {
            return None;
        }
        loop {
            let end = tokio::select! {
                msg = s.rx.recv() => {
                    let mut resps = respond(&s.node, msg?).into_iter();
                    if let Some(first) = resps.next() {
                        s.pending.extend(resps);
                        return Some((Ok(first), s));
                    }
                    continue;
                }
                _ = tick(&mut s.leader_check) => {
                    s.leaderless = if s.node.leader().is_some() { 0 } else { s.leaderless + 1 };
                    if s.leaderless < NO_LEADER_CHECKS {
                        continue;
                    }
                    Error::NoLeader
                }
                _ = s.stop.changed() => Error::Stopped,
            };
            s.ended = true;
            return Some((Err(status(end)), s));
        }
    }))
}

/// The next tick of `check`, or never when there is none.
async fn tick(check: &mut Option<tokio::time::Interval>) {
    match check {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Counts a watch stream as open while alive.
struct StreamGauge;

impl Drop for StreamGauge {
    fn drop(&mut self) {
        metrics::WATCH_STREAMS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The response(s) for one hub message: headers filled, `prev_kv` looked up, fragmented when
/// the watch asked for it and the response is bigger than the request limit.
fn respond(node: &RaftNode, msg: StreamMsg) -> Vec<WatchResponse> {
    let header = |revision: i64| {
        let mut h = Some(ResponseHeader {
            revision,
            ..Default::default()
        });
        fill_header(node, &mut h);
        h
    };
    match msg {
        StreamMsg::Control(mut resp) => {
            let rev = resp.header.as_ref().map_or(0, |h| h.revision);
            resp.header = header(rev);
            vec![resp]
        }
        StreamMsg::Progress { watch_id, revision } => vec![WatchResponse {
            header: header(revision),
            watch_id,
            ..Default::default()
        }],
        StreamMsg::Compacted {
            watch_id,
            compact_revision,
        } => vec![WatchResponse {
            header: header(0),
            watch_id,
            canceled: true,
            compact_revision,
            ..Default::default()
        }],
        StreamMsg::Events {
            spec,
            revision,
            mut events,
        } => {
            if spec.prev_kv {
                super::disk_reads::run(|_| add_prev_kvs(node, &mut events));
            }
            metrics::EVENTS_SENT.fetch_add(events.len() as u64, Ordering::Relaxed);
            let whole = WatchResponse {
                header: header(revision),
                watch_id: spec.watch_id,
                events,
                ..Default::default()
            };
            if spec.fragment {
                fragment(whole, node.max_request_bytes())
            } else {
                vec![whole]
            }
        }
    }
}

/// As etcd: every event but a creation gets the key's value just before the event's revision.
fn add_prev_kvs(node: &RaftNode, events: &mut [Event]) {
    let Ok(read) = node.mvcc().read() else {
        return;
    };
    for e in events.iter_mut() {
        let Some(kv) = &e.kv else { continue };
        let is_create = e.r#type == EventType::Put as i32 && kv.create_revision == kv.mod_revision;
        if is_create || kv.mod_revision - 1 < read.compacted_revision() {
            continue;
        }
        let found = read.index_range(&KeyRange::Single(kv.key.clone()), kv.mod_revision - 1);
        if let Some((key, change)) = found.first() {
            e.prev_kv = read.load(key, change).ok();
        }
    }
}

/// Splits a response whose size exceeds `limit` into several, all but the last marked
/// `fragment`, as etcd's `sendFragments`.
fn fragment(whole: WatchResponse, limit: usize) -> Vec<WatchResponse> {
    if whole.encoded_len() < limit || whole.events.len() < 2 {
        return vec![whole];
    }
    let empty = WatchResponse {
        header: whole.header,
        watch_id: whole.watch_id,
        ..Default::default()
    };
    let mut out = Vec::new();
    let mut current = empty.clone();
    for e in whole.events {
        if !current.events.is_empty() && current.encoded_len() + e.encoded_len() > limit {
            let mut done = std::mem::replace(&mut current, empty.clone());
            done.fragment = true;
            out.push(done);
        }
        current.events.push(e);
    }
    out.push(current);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::mvccpb::KeyValue;

    #[test]
    fn fragments_split_big_responses_and_mark_all_but_the_last() {
        let events: Vec<Event> = (0..10)
            .map(|i| Event {
                kv: Some(KeyValue {
                    key: format!("k{i}").into_bytes(),
                    value: vec![b'x'; 100].into(),
                    mod_revision: 5,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        let whole = WatchResponse {
            watch_id: 3,
            events,
            ..Default::default()
        };
        let parts = fragment(whole.clone(), 350);
        assert!(parts.len() > 1);
        assert!(parts
            .iter()
            .all(|p| p.encoded_len() <= 350 || p.events.len() == 1));
        let flags: Vec<bool> = parts.iter().map(|p| p.fragment).collect();
        assert_eq!(flags.last(), Some(&false));
        assert!(flags.iter().rev().skip(1).all(|f| *f));
        let joined: Vec<Event> = parts.into_iter().flat_map(|p| p.events).collect();
        assert_eq!(joined, whole.events);
        assert_eq!(fragment(whole.clone(), 1 << 20).len(), 1);
    }
}
