//! proxy-agent binary: the shared lifecycle's `main` for the shoot end.

fn main() -> std::process::ExitCode {
    proxy_core::app::main::<proxy_agent::Agent>(
        "seedgate proxy-agent, the shoot end: runs the node-local apiserver proxy, which forwards in-cluster \
         connections for the kube-apiserver's advertised address to the seed gateway, and the reverse tunnel agent, \
         which dials out to the seed's proxy-servers.",
    )
}
