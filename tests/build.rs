//! Generates the tests' gRPC client from konnectivity's proto in the tree (the file proxy-server
//! generates its server from; the client shares no code with the server), with protox: no
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = "../proxy-server/proto";
    let proto = format!("{dir}/konnectivity-client.proto");
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([&proto], [dir])?;
    tonic_prost_build::configure().build_server(false).build_transport(false).compile_fds(fds)?;
    Ok(())
}
