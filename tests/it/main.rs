//! Integration tests: real `concord` processes, real gRPC clients.

mod auth;
mod cluster;
mod disk_full;
mod election;
mod failover;
mod gateway;
mod keepalive;
mod kv_cluster;
mod kv_single;
mod lease;
mod lock;
mod log_catch_up;
mod maintenance;
mod membership;
mod memory_limit;
mod snapshot;
mod tls;
mod unix;
mod wakeups;
mod watch;
