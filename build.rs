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
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out.join("descriptors.bin");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .file_descriptor_set_path(&descriptors)
        .compile_protos(&files, &["proto"])?;
    // JSON for the gRPC gateway (`/v3/...`), as etcd's gateway writes it: proto field names,
    // int64 as strings, bytes as base64, defaults omitted.
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptors)?)?
        .preserve_proto_field_names()
        .build(&[
            ".etcdserverpb",
            ".mvccpb",
            ".authpb",
            ".v3lockpb",
            ".v3electionpb",
        ])?;
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    Ok(())
}
