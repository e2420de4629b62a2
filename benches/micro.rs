//! Criterion microbenchmarks of the hot inner pieces: MVCC put and range (on a real fjall store
//! in a temp dir, without fsync: the log's fsync is measured by the load benches), the key
//! index, the Raft command encoding, and the watch fan-out.
//!
//! ```sh
//! cargo bench --bench micro
//! ```

// A benchmark with a broken setup (no temp dir, a failed write) has nothing to measure: it stops.
#![allow(clippy::expect_used)]
// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use concord::apply::{Command, Op};
use concord::mvcc::{self, KeyIndex, KeyRange, KeyRevision, KvTxn, MvccStore, Revision};
use concord::pb::etcdserverpb::{PutRequest, RangeRequest};
use concord::pb::mvccpb::{Event, KeyValue};
use concord::storage::Storage;
use concord::watch::{WatchHub, WatchSpec};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use prost::Message;

fn key(i: usize) -> Vec<u8> {
    format!("bench/k/{i:08}").into_bytes()
}

fn store_with(keys: usize) -> (tempfile::TempDir, MvccStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let storage = Storage::open(dir.path()).expect("storage");
    let store = MvccStore::open(storage).expect("store");
    let value = vec![b'v'; 256];
    for chunk in (0..keys).collect::<Vec<_>>().chunks(1000) {
        let mut w = store.write().expect("write");
        for i in chunk {
            w.put(&key(*i), &value, 0).expect("put");
            w.end_request();
        }
        w.commit().expect("commit");
    }
    (dir, store)
}

fn mvcc(c: &mut Criterion) {
    let (_dir, store) = store_with(10_000);
    let value = vec![b'v'; 256];
    let mut i = 0;
    c.bench_function("mvcc put (one request, one batch)", |b| {
        b.iter(|| {
            i = (i + 1) % 10_000;
            let mut w = store.write().expect("write");
            w.put(&key(i), &value, 0).expect("put");
            w.end_request();
            black_box(w.commit().expect("commit"));
        })
    });
    c.bench_function("mvcc range one key", |b| {
        b.iter(|| {
            i = (i + 7) % 10_000;
            let read = store.read().expect("read");
            let req = RangeRequest {
                key: key(i),
                ..Default::default()
            };
            black_box(mvcc::range(&read, &req).expect("range"));
        })
    });
    c.bench_function("mvcc range 100 keys", |b| {
        b.iter(|| {
            i = (i + 7) % 9_900;
            let read = store.read().expect("read");
            let req = RangeRequest {
                key: key(i),
                range_end: key(i + 100),
                ..Default::default()
            };
            black_box(mvcc::range(&read, &req).expect("range"));
        })
    });
}

fn key_index(c: &mut Criterion) {
    let mut index = KeyIndex::default();
    for i in 0..100_000 {
        let rev = Revision::new(i as i64 + 2, 0);
        index.push(
            &key(i),
            KeyRevision {
                rev,
                create_revision: rev.main,
                version: 1,
                lease: 0,
            },
        );
    }
    let mut i = 0;
    c.bench_function("key index get (100k keys)", |b| {
        b.iter(|| {
            i = (i + 7919) % 100_000;
            black_box(index.get(&key(i), i64::MAX));
        })
    });
    c.bench_function("key index range 100 (100k keys)", |b| {
        b.iter(|| {
            i = (i + 7919) % 99_000;
            let range = KeyRange::new(&key(i), &key(i + 100));
            black_box(index.range(&range, i64::MAX).count());
        })
    });
}

fn encoding(c: &mut Criterion) {
    let cmd = Command::new(Op::Put(PutRequest {
        key: key(42),
        value: vec![b'v'; 256],
        ..Default::default()
    }));
    let bytes = cmd.encode_to_vec();
    c.bench_function("command encode (put, 256 B)", |b| {
        b.iter(|| black_box(cmd.encode_to_vec()))
    });
    c.bench_function("command decode (put, 256 B)", |b| {
        b.iter(|| black_box(Command::decode(bytes.as_slice()).expect("decode")))
    });
}

fn fanout(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _guard = runtime.enter();
    let hub = WatchHub::new(1);
    let mut receivers = Vec::new();
    for w in 0..1000 {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let stream = hub.new_stream();
        let spec = WatchSpec {
            watch_id: w,
            range: KeyRange::new(b"bench/", b"bench0"),
            no_put: false,
            no_delete: false,
            prev_kv: false,
            fragment: false,
            progress_notify: false,
        };
        hub.watch(stream, spec, 0, tx);
        receivers.push(rx);
    }
    let mut revision = 1;
    c.bench_function("watch publish one event to 1000 watchers", |b| {
        b.iter_batched(
            || {
                revision += 1;
                vec![Event {
                    r#type: 0,
                    kv: Some(KeyValue {
                        key: key(1),
                        value: vec![b'v'; 256].into(),
                        mod_revision: revision,
                        ..Default::default()
                    }),
                    prev_kv: None,
                }]
            },
            |events: Vec<Event>| {
                let at = events
                    .first()
                    .and_then(|e| e.kv.as_ref())
                    .map_or(0, |kv| kv.mod_revision);
                hub.publish(at, &events);
                for rx in &mut receivers {
                    while rx.try_recv().is_ok() {}
                }
            },
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, mvcc, key_index, encoding, fanout);
criterion_main!(benches);
