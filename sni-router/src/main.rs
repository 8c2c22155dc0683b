//! sni-router binary: the shared lifecycle's `main` for the router.

fn main() -> std::process::ExitCode {
    proxy_core::app::main::<sni_router::Router>(
        "The seed's ingress gateway: routes TLS by SNI, PROXY-protocol destination or HTTP CONNECT header to shoot \
         kube-apiservers without terminating TLS.",
    )
}
