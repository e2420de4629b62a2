//! Watch: etcd's guarantees end to end over real processes. Events arrive in revision order,
//! with no gap and no duplicate, across history replay, the switch to live events, slow
//! consumers, compaction and a leader kill.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::watch_client::WatchClient;
use concord::pb::etcdserverpb::watch_create_request::FilterType;
use concord::pb::etcdserverpb::watch_request::RequestUnion;
use concord::pb::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, PutRequest, WatchCancelRequest, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse,
};
use concord::pb::mvccpb::Event;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::cluster::{put, put_retrying, Cluster, TestResult};

/// One watch stream.
struct Conn {
    tx: mpsc::Sender<WatchRequest>,
    rx: Streaming<WatchResponse>,
}

impl Conn {
    async fn open(c: &Cluster, member: usize) -> TestResult<Self> {
        let (tx, req_rx) = mpsc::channel(64);
        let mut client = WatchClient::connect(c.client_url(member)?).await?;
        let rx = client
            .watch(ReceiverStream::new(req_rx))
            .await?
            .into_inner();
        Ok(Conn { tx, rx })
    }

    async fn send(&self, r: RequestUnion) -> TestResult {
        self.tx
            .send(WatchRequest {
                request_union: Some(r),
            })
            .await
            .map_err(|_| "stream closed".into())
    }

    /// Creates a watch and returns its id once `created` arrives.
    async fn create(&mut self, req: WatchCreateRequest) -> TestResult<i64> {
        self.send(RequestUnion::CreateRequest(req)).await?;
        let resp = self.next().await?.ok_or("stream ended")?;
        assert!(resp.created, "expected created, got {resp:?}");
        Ok(resp.watch_id)
    }

    async fn next(&mut self) -> TestResult<Option<WatchResponse>> {
        match tokio::time::timeout(Duration::from_secs(10), self.rx.message()).await {
            Ok(r) => Ok(r?),
            Err(_) => Err("no watch response within 10s".into()),
        }
    }

    /// Collects events until one with `mod_revision >= until` arrived.
    async fn events_until(&mut self, until: i64) -> TestResult<Vec<Event>> {
        let mut out = Vec::new();
        while out.last().map_or(0, rev) < until {
            let resp = self.next().await?.ok_or("stream ended")?;
            assert!(!resp.canceled, "watch canceled: {resp:?}");
            out.extend(resp.events);
        }
        Ok(out)
    }
}

fn rev(e: &Event) -> i64 {
    e.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

fn watch_key(key: &str) -> WatchCreateRequest {
    WatchCreateRequest {
        key: key.into(),
        ..Default::default()
    }
}

fn watch_prefix(prefix: &str) -> WatchCreateRequest {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    WatchCreateRequest {
        key: prefix.into(),
        range_end: end,
        ..Default::default()
    }
}

/// Every event is one revision step after the previous (a single writer makes one event per
/// revision): no gap, no duplicate, no reorder.
fn assert_contiguous(events: &[Event], from: i64, to: i64) {
    let revs: Vec<i64> = events.iter().map(rev).collect();
    let want: Vec<i64> = (from..=to).collect();
    assert_eq!(
        revs, want,
        "events must cover every revision once, in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_filters_prev_kv_cancel_progress_and_compaction() -> TestResult {
    let c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let r1 = put(&c, 0, "a", "1").await?;
    let mut w = Conn::open(&c, 0).await?;

    // prev_kv and a NOPUT filter: only the delete, with the value before it.
    let id = w
        .create(WatchCreateRequest {
            prev_kv: true,
            filters: vec![FilterType::Noput as i32],
            ..watch_key("a")
        })
        .await?;
    put(&c, 0, "a", "2").await?;
    let mut kv = c.kv(0).await?;
    let del = kv
        .delete_range(DeleteRangeRequest {
            key: "a".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let resp = w.next().await?.ok_or("no event")?;
    assert_eq!(resp.watch_id, id);
    let e = resp.events.first().ok_or("no event")?;
    assert_eq!(e.r#type, 1, "DELETE");
    assert_eq!(rev(e), del.header.map_or(0, |h| h.revision));
    assert_eq!(
        e.prev_kv.as_ref().map(|p| p.value.to_vec()),
        Some(b"2".to_vec())
    );

    // Cancel: answered with canceled, no more events.
    w.send(RequestUnion::CancelRequest(WatchCancelRequest {
        watch_id: id,
    }))
    .await?;
    let resp = w.next().await?.ok_or("no cancel")?;
    assert!(resp.canceled && resp.watch_id == id);

    // History replay from the first revision, NODELETE filter.
    let id2 = w
        .create(WatchCreateRequest {
            start_revision: r1,
            filters: vec![FilterType::Nodelete as i32],
            ..watch_key("a")
        })
        .await?;
    let events = w.events_until(r1 + 1).await?;
    assert_eq!(events.iter().map(rev).collect::<Vec<_>>(), vec![r1, r1 + 1]);

    // Progress: watch id -1, header revision = everything sent so far.
    w.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await?;
    let p = w.next().await?.ok_or("no progress")?;
    assert_eq!(p.watch_id, -1);
    assert!(p.events.is_empty());
    assert_eq!(p.header.map_or(0, |h| h.revision), r1 + 2);
    w.send(RequestUnion::CancelRequest(WatchCancelRequest {
        watch_id: id2,
    }))
    .await?;
    w.next().await?;

    // A client-chosen id, and a duplicate of it.
    let mine = w
        .create(WatchCreateRequest {
            watch_id: 42,
            ..watch_key("zz")
        })
        .await?;
    assert_eq!(mine, 42);
    w.send(RequestUnion::CreateRequest(WatchCreateRequest {
        watch_id: 42,
        ..watch_key("zz")
    }))
    .await?;
    let dup = w.next().await?.ok_or("no answer")?;
    assert!(dup.created && dup.canceled && !dup.cancel_reason.is_empty());

    // Compaction: a watch from below it is canceled with compact_revision.
    for i in 0..5 {
        put(&c, 0, "b", &i.to_string()).await?;
    }
    let head = put(&c, 0, "b", "last").await?;
    kv.compact(CompactionRequest {
        revision: head - 1,
        physical: true,
    })
    .await?;
    let mut w2 = Conn::open(&c, 0).await?;
    w2.create(WatchCreateRequest {
        start_revision: r1,
        watch_id: 7,
        ..watch_key("b")
    })
    .await?;
    let resp = w2.next().await?.ok_or("no compaction answer")?;
    assert!(resp.canceled);
    assert_eq!(resp.compact_revision, head - 1);
    // As on etcd, the ID of a watch the server ended stays taken until the client cancels it;
    // that cancel is answered (once), and frees the ID.
    let compacted_id = resp.watch_id;
    assert_eq!(compacted_id, 7);
    let taken = WatchCreateRequest {
        watch_id: compacted_id,
        ..watch_key("b")
    };
    w2.send(RequestUnion::CreateRequest(taken.clone())).await?;
    let dup = w2.next().await?.ok_or("no answer")?;
    assert!(dup.created && dup.canceled, "ID still taken: {dup:?}");
    for _ in 0..2 {
        w2.send(RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: compacted_id,
        }))
        .await?;
    }
    let cancel = w2.next().await?.ok_or("no cancel answer")?;
    assert!(cancel.canceled && cancel.watch_id == compacted_id && cancel.compact_revision == 0);
    assert_eq!(
        w2.create(taken).await?,
        compacted_id,
        "the ID is free again"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_switches_to_live_without_gap_or_duplicate_under_writes() -> TestResult {
    let c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let first = put(&c, 0, "k/0", "0").await?;
    let writes = 600;
    let writer = {
        let mut kv = c.kv(0).await?;
        tokio::spawn(async move {
            let mut last = 0;
            for i in 1..writes {
                let r = kv
                    .put(PutRequest {
                        key: format!("k/{}", i % 37).into_bytes(),
                        value: vec![b'v'; 64],
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                last = r.into_inner().header.map_or(0, |h| h.revision);
            }
            Ok::<i64, String>(last)
        })
    };
    // Watches created while writes keep landing, each from a past revision.
    let mut conns = Vec::new();
    for start in [first, first + 50, first + 200] {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let mut w = Conn::open(&c, 0).await?;
        w.create(WatchCreateRequest {
            start_revision: start,
            ..watch_prefix("k/")
        })
        .await?;
        conns.push((start, w));
    }
    let last = writer.await??;
    for (start, mut w) in conns {
        let events = w.events_until(last).await?;
        assert_contiguous(&events, start, last);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_watchers_each_get_every_event_in_order() -> TestResult {
    let c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let streams = 20;
    let per_stream = 100;
    // Half the watches on one shared key, half on a key each.
    let mut conns = Vec::new();
    for s in 0..streams {
        let mut w = Conn::open(&c, 0).await?;
        for i in 0..per_stream {
            let key = if i % 2 == 0 {
                "shared".to_string()
            } else {
                format!("own/{s}/{i}")
            };
            w.create(watch_key(&key)).await?;
        }
        conns.push(w);
    }
    let mut shared_revs = Vec::new();
    for i in 0..20 {
        shared_revs.push(put(&c, 0, "shared", &i.to_string()).await?);
    }
    let mut own_revs = BTreeMap::new();
    for s in 0..streams {
        for i in (1..per_stream).step_by(2) {
            own_revs.insert(
                format!("own/{s}/{i}"),
                put(&c, 0, &format!("own/{s}/{i}"), "x").await?,
            );
        }
    }
    for w in &mut conns {
        // Per watch id: the revisions it received.
        let mut got: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
        let want_total = (per_stream / 2) * (shared_revs.len() + 1);
        let mut total = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while total < want_total {
            let resp = w.next().await?.ok_or("stream ended")?;
            total += resp.events.len();
            got.entry(resp.watch_id)
                .or_default()
                .extend(resp.events.iter().map(rev));
            assert!(Instant::now() < deadline, "events missing");
        }
        for (id, revs) in got {
            if id % 2 == 0 {
                assert_eq!(revs, shared_revs, "shared-key watcher {id}");
            } else {
                assert_eq!(revs.len(), 1, "own-key watcher {id}");
            }
        }
    }
    Ok(())
}

/// Events reach watchers off the apply path, after the writes' responses; a watch created
/// after a put was answered still starts after that put, as on etcd (its header has the put's
/// revision or a later one, and its first event is a later write), and a progress request
/// made after a put was answered is answered at that put's revision or later, however far
/// behind the deliveries to other watchers are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_and_progress_after_a_put_count_that_put() -> TestResult {
    let c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    // 1,000 watchers of the key keep the deliveries busy.
    let mut busy = Vec::new();
    for _ in 0..10 {
        let mut w = Conn::open(&c, 0).await?;
        for _ in 0..100 {
            w.create(watch_key("k")).await?;
        }
        busy.push(w);
    }
    let mut late = Conn::open(&c, 0).await?;
    let rounds = 200;
    for i in 0..rounds {
        let answered = put(&c, 0, "k", format!("a{i}")).await?;
        late.send(RequestUnion::CreateRequest(watch_key("k")))
            .await?;
        let created = late.next().await?.ok_or("stream ended")?;
        assert!(created.created, "expected created, got {created:?}");
        let header = created.header.map_or(0, |h| h.revision);
        assert!(
            header >= answered,
            "created at {header}, after a put answered at {answered}"
        );
        // A progress request sent after a put was answered: its revision counts that put, and
        // it comes after the put's event.
        let next = put(&c, 0, "k", format!("b{i}")).await?;
        late.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
            .await?;
        let mut revs = Vec::new();
        loop {
            let resp = late.next().await?.ok_or("stream ended")?;
            if !resp.created && !resp.canceled && resp.events.is_empty() {
                let at = resp.header.map_or(0, |h| h.revision);
                assert!(
                    at >= next,
                    "progress at {at}, after a put answered at {next}"
                );
                break;
            }
            revs.extend(resp.events.iter().map(rev));
        }
        assert_eq!(revs, vec![next], "watch {} of round {i}", created.watch_id);
        late.send(RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: created.watch_id,
        }))
        .await?;
        let canceled = late.next().await?.ok_or("stream ended")?;
        assert!(canceled.canceled, "expected canceled, got {canceled:?}");
    }
    // Every busy watcher got every event, in order.
    let events = 2 * rounds;
    for w in &mut busy {
        let mut got: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
        while got.values().map(Vec::len).sum::<usize>() < 100 * events {
            let resp = w.next().await?.ok_or("stream ended")?;
            got.entry(resp.watch_id)
                .or_default()
                .extend(resp.events.iter().map(rev));
        }
        for (id, revs) in got {
            assert_eq!(revs.len(), events, "watcher {id}");
            assert!(revs.windows(2).all(|p| p[0] < p[1]), "watcher {id} order");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_never_blocks_writes_and_catches_up() -> TestResult {
    let c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let mut slow = Conn::open(&c, 0).await?;
    slow.create(watch_prefix("s/")).await?;
    let first = put(&c, 0, "s/0", "start").await?;
    // The watcher does not read while 3000 writes of 4 KiB land: far more than its buffers.
    let mut kv = c.kv(0).await?;
    let mut last = first;
    let big = vec![b'x'; 4096];
    for i in 1..3000 {
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            kv.put(PutRequest {
                key: format!("s/{}", i % 100).into_bytes(),
                value: big.clone(),
                ..Default::default()
            }),
        )
        .await
        .map_err(|_| "a write waited on a slow watcher")??;
        last = r.into_inner().header.map_or(0, |h| h.revision);
    }
    // The hub moved the watcher aside (etcd's slow-watcher gauge says so) rather than wait.
    let page = c.http_get(0, "/metrics").await?;
    let has_line = |page: &str, line: &str| page.lines().any(|l| l == line);
    assert!(
        has_line(&page, "etcd_debugging_mvcc_slow_watcher_total 1"),
        "watcher not marked slow: {page}"
    );
    let events = slow.events_until(last).await?;
    assert_contiguous(&events, first, last);
    let page = c.http_get(0, "/metrics").await?;
    assert!(has_line(&page, "etcd_debugging_mvcc_slow_watcher_total 0"));
    assert!(has_line(&page, "etcd_debugging_mvcc_watcher_total 1"));
    assert!(has_line(&page, "etcd_debugging_mvcc_watch_stream_total 1"));
    assert_eq!(
        c.http_get(0, "/health").await?,
        r#"{"health":"true","reason":""}"#
    );
    assert_eq!(
        c.http_get(0, "/version").await?,
        r#"{"etcdserver":"3.5.13","etcdcluster":"3.5.0"}"#
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumed_after_a_leader_kill_has_no_gap_or_duplicate() -> TestResult {
    let mut c = Cluster::start(3)?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    let first = put(&c, leader, "w/0", "0").await?;
    let mut w = Conn::open(&c, leader).await?;
    w.create(WatchCreateRequest {
        start_revision: first,
        ..watch_prefix("w/")
    })
    .await?;
    let mut seen: Vec<Event> = Vec::new();
    for i in 1..30 {
        put(&c, leader, &format!("w/{i}"), "a").await?;
    }
    seen.extend(w.events_until(first + 29).await?);
    c.kill(leader)?;
    // The stream ends with an error; resume on a survivor from the next revision.
    while let Ok(Some(resp)) = w.next().await {
        seen.extend(resp.events);
    }
    c.wait_leader(Duration::from_secs(20)).await?;
    let survivor = *c.alive().first().ok_or("no survivor")?;
    let mut last = 0;
    for i in 30..60 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let member = c.alive()[i % 2];
            match put(&c, member, &format!("w/{i}"), "b").await {
                Ok(r) => {
                    last = r;
                    break;
                }
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
    let resume_from = seen.last().map_or(first, rev) + 1;
    let mut w = Conn::open(&c, survivor).await?;
    w.create(WatchCreateRequest {
        start_revision: resume_from,
        ..watch_prefix("w/")
    })
    .await?;
    seen.extend(w.events_until(last).await?);
    // The final history, read fresh from another survivor, equals what the resumed watch saw.
    let other = *c.alive().last().ok_or("no survivor")?;
    let mut fresh = Conn::open(&c, other).await?;
    fresh
        .create(WatchCreateRequest {
            start_revision: first,
            ..watch_prefix("w/")
        })
        .await?;
    let history = fresh.events_until(last).await?;
    assert_eq!(seen, history);
    let revs: Vec<i64> = seen.iter().map(rev).collect();
    assert!(revs.windows(2).all(|p| p[0] < p[1]), "strictly increasing");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_list_then_watch_with_progress_and_compaction() -> TestResult {
    use concord::pb::etcdserverpb::RangeRequest;
    let c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    for i in 0..25 {
        put(&c, 0, &format!("/registry/pods/p{i:02}"), "spec").await?;
    }
    // Paginated list at one revision: limit 10, continue from the last key + "\0".
    let mut kv = c.kv(0).await?;
    let mut key = b"/registry/pods/".to_vec();
    let end = b"/registry/pods0".to_vec();
    let mut list_rev = 0;
    let mut listed = Vec::new();
    loop {
        let page = kv
            .range(RangeRequest {
                key: key.clone(),
                range_end: end.clone(),
                limit: 10,
                revision: list_rev,
                ..Default::default()
            })
            .await?
            .into_inner();
        if list_rev == 0 {
            list_rev = page.header.map_or(0, |h| h.revision);
        }
        listed.extend(page.kvs.iter().map(|kv| kv.key.clone()));
        // Writes landing mid-list must not show up in later pages.
        put(&c, 0, "/registry/pods/zz-late", "x").await?;
        if !page.more {
            break;
        }
        key = page
            .kvs
            .last()
            .map(|kv| kv.key.clone())
            .ok_or("empty page")?;
        key.push(0);
    }
    assert_eq!(listed.len(), 25);

    // Watch from list revision + 1 with prev_kv: sees exactly the writes after the list.
    let mut w = Conn::open(&c, 0).await?;
    w.create(WatchCreateRequest {
        start_revision: list_rev + 1,
        prev_kv: true,
        progress_notify: true,
        ..watch_prefix("/registry/pods/")
    })
    .await?;
    let head = put(&c, 0, "/registry/pods/p00", "updated").await?;
    let events = w.events_until(head).await?;
    assert_contiguous(&events, list_rev + 1, head);
    let last = events.last().ok_or("no event")?;
    assert_eq!(
        last.prev_kv.as_ref().map(|p| p.value.to_vec()),
        Some(b"spec".to_vec())
    );

    // A progress answer promises every event up to its revision was delivered.
    w.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await?;
    let p = w.next().await?.ok_or("no progress")?;
    assert_eq!((p.watch_id, p.header.map_or(0, |h| h.revision)), (-1, head));

    // Compaction past an old watch's start: it is canceled with compact_revision.
    kv.compact(CompactionRequest {
        revision: head,
        physical: false,
    })
    .await?;
    let mut old = Conn::open(&c, 0).await?;
    old.create(WatchCreateRequest {
        start_revision: list_rev,
        ..watch_prefix("/registry/pods/")
    })
    .await?;
    let resp = old.next().await?.ok_or("no answer")?;
    assert!(resp.canceled && resp.compact_revision == head);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_waits_for_catch_up_and_notifications_are_periodic() -> TestResult {
    let c = Cluster::start_with(
        1,
        &["--experimental-watch-progress-notify-interval", "200ms"],
    )?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let first = put(&c, 0, "p/0", "0").await?;
    let mut last = first;
    for i in 1..2000 {
        last = put(&c, 0, &format!("p/{}", i % 10), "v").await?;
    }
    // A watch replaying 2000 revisions, then an immediate progress request: the answer must
    // come after every replayed event.
    let mut w = Conn::open(&c, 0).await?;
    w.create(WatchCreateRequest {
        start_revision: first,
        ..watch_prefix("p/")
    })
    .await?;
    w.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await?;
    let mut events = Vec::new();
    loop {
        let resp = w.next().await?.ok_or("stream ended")?;
        if resp.watch_id == -1 {
            assert_eq!(resp.header.map_or(0, |h| h.revision), last);
            break;
        }
        events.extend(resp.events);
    }
    assert_contiguous(&events, first, last);

    // progress_notify: periodic notifications with the watch's own id.
    let id = w
        .create(WatchCreateRequest {
            progress_notify: true,
            ..watch_key("quiet")
        })
        .await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let resp = w.next().await?.ok_or("stream ended")?;
        if resp.watch_id == id && resp.events.is_empty() && !resp.created {
            assert_eq!(resp.header.map_or(0, |h| h.revision), last);
            break;
        }
        assert!(Instant::now() < deadline, "no progress notification");
    }
    Ok(())
}

/// Opens a watch stream with `hasleader` on `member` and creates a watch of `key` on it;
/// returns the request sender (the stream lives as long as it does) and the responses.
async fn hasleader_watch(
    c: &Cluster,
    member: usize,
    key: &str,
) -> TestResult<(mpsc::Sender<WatchRequest>, Streaming<WatchResponse>)> {
    let (tx, req_rx) = mpsc::channel(4);
    let mut client = WatchClient::connect(c.client_url(member)?).await?;
    let mut req = tonic::Request::new(ReceiverStream::new(req_rx));
    req.metadata_mut().insert(
        "hasleader",
        tonic::metadata::MetadataValue::from_static("true"),
    );
    let mut rx = client.watch(req).await?.into_inner();
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(watch_key(key))),
    })
    .await?;
    assert!(rx.message().await?.is_some_and(|r| r.created));
    Ok((tx, rx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hasleader_watch_ends_with_no_leader_on_a_minority() -> TestResult {
    let mut c = Cluster::start(3)?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    let follower = (leader + 1) % 3;
    let (_tx, mut rx) = hasleader_watch(&c, follower, "x").await?;
    // Leave the follower alone.
    c.kill(leader)?;
    c.kill((leader + 2) % 3)?;
    let err = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match rx.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(e) => return Some(e),
            }
        }
    })
    .await?
    .ok_or("stream ended without an error")?;
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::Unavailable, "etcdserver: no leader")
    );
    Ok(())
}

/// As etcd's: a `hasleader` stream on a member that lost its leader lives on while a new one is
/// elected (etcd ends such streams only after three election timeouts without a leader), so
/// its watches see the writes made after the election with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hasleader_watch_lives_through_the_election_of_a_new_leader() -> TestResult {
    let mut c = Cluster::start(3)?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    let follower = (leader + 1) % 3;
    let (_tx, mut rx) = hasleader_watch(&c, follower, "after").await?;
    c.kill(leader)?;
    let rev = put_retrying(&c, "after", "v").await?;
    let resp = tokio::time::timeout(Duration::from_secs(20), rx.message())
        .await??
        .ok_or("the stream ended")?;
    assert_eq!(
        resp.events
            .first()
            .and_then(|e| e.kv.as_ref())
            .map(|kv| kv.mod_revision),
        Some(rev)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_shutting_down_ends_its_watch_streams_with_an_error() -> TestResult {
    let mut c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let mut w = Conn::open(&c, 0).await?;
    w.create(watch_key("k")).await?;
    // SIGTERM: the stream must end (so clients reconnect and resume) rather than hang.
    let stopping = tokio::task::spawn_blocking(move || c.terminate(0).map_err(|e| e.to_string()));
    let end = tokio::time::timeout(Duration::from_secs(20), w.rx.message()).await?;
    match end {
        Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}"),
        Ok(None) => {}
        Ok(Some(resp)) => return Err(format!("unexpected response {resp:?}").into()),
    }
    stopping.await??;
    Ok(())
}
