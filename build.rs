//! Compiles proto/ into the gRPC server types with protox (no system protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/vserve/v1/vserve.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    // The descriptors, serialized for gRPC server reflection (`include_file_descriptor_set!`).
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("vserve_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        // Unparseable requests are INVALID_ARGUMENT, not prost's INTERNAL (src/rpc/codec.rs).
        .codec_path("crate::rpc::codec::Codec")
        // Chunks are slices of one buffer: Bytes makes them zero-copy.
        .bytes(".vserve.v1.GetClipsResponse.data")
        .bytes(".vserve.v1.StreamBatchesResponse.data")
        .compile_fds(fds)?;
    Ok(())
}
