//! Coordination recipes built on the member's own KV, lease and watch API — never on the MVCC
//! store directly — exactly as etcd's `v3lock` and `v3election` wrap `clientv3/concurrency`.

pub mod client;
pub mod election;
pub mod lock;
