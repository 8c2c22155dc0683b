//! Generates the gRPC front end's server code from konnectivity's proto, with protox (pure Rust, so
//! the build needs no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/konnectivity-client.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_transport(false)
        // DATA's payload as `Bytes`: decoded without a copy into a `Vec` of its own.
        .bytes(".Data.data")
        // prost's codec with small first buffers (an idle Proxy stream holds them).
        .codec_path("crate::frontend::grpc::pb::Codec")
        .compile_fds(fds)?;
    Ok(())
}
