//! Compiles the daemon's proto (kept once, at the repository's proto/) into client types.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "../../proto";
    let protos = ["../../proto/vserve/v1/vserve.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, [root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        // Received chunks stay slices of the receive buffer until reassembly copies them once.
        .bytes(".vserve.v1.GetClipsResponse.data")
        .bytes(".vserve.v1.StreamBatchesResponse.data")
        .compile_fds(fds)?;
    Ok(())
}
