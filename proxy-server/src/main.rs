//! proxy-server binary: the shared lifecycle's `main` for the seed end of the tunnel.

fn main() -> std::process::ExitCode {
    proxy_core::app::main::<proxy_server::Server>(
        "The seed end of seedgate's reverse tunnel: agents in the shoots dial in; kube-apiserver (egress selector, \
         HTTP CONNECT) and Prometheus (proxy_url) reach the shoots through them.",
    )
}
