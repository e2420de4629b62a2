//! Generated protobuf types and gRPC stubs: etcd's v3 API (wire-compatible with etcd 3.5) and
//! Concord's own peer protocol.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

pub mod codec;

/// `mvccpb`: KeyValue and Event.
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
    include!(concat!(env!("OUT_DIR"), "/mvccpb.serde.rs"));
}
/// `authpb`: users, roles and permissions.
pub mod authpb {
    tonic::include_proto!("authpb");
    include!(concat!(env!("OUT_DIR"), "/authpb.serde.rs"));
}
/// `etcdserverpb`: the KV, Watch, Lease, Cluster, Maintenance and Auth services.
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.serde.rs"));
}
/// `v3lockpb`: the Lock service.
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.serde.rs"));
}
/// `v3electionpb`: the Election service.
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.serde.rs"));
}
/// `concordpb`: the peer protocol and the Raft log-entry payload.
pub mod concordpb {
    tonic::include_proto!("concordpb");
}
