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
        // A value is shared, not copied, from the storage read to the response encoder and
        // among the watchers of its event.
        .bytes(".mvccpb.KeyValue.value")
        // Encoders allocate a response's buffer once, at its encoded size.
        .codec_path("crate::pb::codec::SizedCodec")
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
    write_grpc_methods(&std::fs::read(&descriptors)?, &out.join("grpc_methods.rs"))?;
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    Ok(())
}

/// Writes `GRPC_METHODS`: every method the server serves as (`/pkg.Service/Method`, grpc-go's
/// `grpc_type` label), from the compiled protos plus gRPC health, sorted by path, so that the
/// metrics count only those.
fn write_grpc_methods(
    descriptors: &[u8],
    dest: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(descriptors)?;
    let mut methods = vec![
        ("/grpc.health.v1.Health/Check".to_string(), "unary"),
        ("/grpc.health.v1.Health/Watch".to_string(), "server_stream"),
    ];
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                let kind = match (method.client_streaming(), method.server_streaming()) {
                    (false, false) => "unary",
                    (true, false) => "client_stream",
                    (false, true) => "server_stream",
                    (true, true) => "bidi_stream",
                };
                let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                methods.push((path, kind));
            }
        }
    }
    methods.sort();
    methods.dedup();
    let mut code = String::from(
        "/// Every gRPC method the server serves: (path, `grpc_type`), sorted by path (generated \
         by build.rs).\npub const GRPC_METHODS: &[(&str, &str)] = &[\n",
    );
    for (path, kind) in &methods {
        code.push_str(&format!("    ({path:?}, {kind:?}),\n"));
    }
    code.push_str("];\n");
    std::fs::write(dest, code)?;
    Ok(())
}
