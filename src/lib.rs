//! Concord: an etcd v3 API-compatible, strongly consistent key-value and coordination service.
//!
//! One Raft group owns the whole keyspace; every mutation is a log entry that every member
//! applies, in the same order, to the same revisioned store.
//!
//! ```text
//! client ──gRPC──▶ rpc::<service>                          one file per etcd service
//!                   │  read?  ── serializable ──▶ mvcc (local)
//!                   │         └─ linearizable ─▶ raft::read (batched read index) ─▶ mvcc
//!                   │  write? ──▶ raft::propose (Command) ──▶ leader (followers forward)
//!                   ▼                                       │ quorum fsync'd
//!              response ◀── CommandResult (revision) ◀── apply ──▶ mvcc ──▶ storage (fjall)
//! ```
//!
//! Dependencies point one way: `rpc → raft → apply → auth → mvcc → storage` (the RPC edge also
//! asks [`auth`] whether a caller may read). fjall is imported only by
//! [`storage`], openraft only by [`raft`], tonic only by [`rpc`] (and the generated [`pb`]).

pub mod apply;
pub mod auth;
pub mod bbolt;
pub mod compactor;
pub mod concurrency;
pub mod config;
pub mod error;
pub mod etcd_db;
pub mod lease;
pub mod metrics;
pub mod mvcc;
pub mod pb;
pub mod raft;
pub mod rpc;
pub mod server;
pub mod snapshot;
pub mod storage;
pub mod tls;
pub mod transport;
pub mod watch;
