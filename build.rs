//! Compiles our wire-compatible etcd protos and Concord's peer protocol with a vendored protoc,
//! so that a fresh machine needs nothing but cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    let files = [
        "proto/etcd/mvccpb/kv.proto",
        "proto/etcd/authpb/auth.proto",
        "proto/etcd/etcdserverpb/rpc.proto",
        "proto/etcd/v3lockpb/v3lock.proto",
        "proto/etcd/v3electionpb/v3election.proto",
        "proto/concord/raft.proto",
    ];
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .compile_protos(&files, &["proto"])?;
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    Ok(())
}
