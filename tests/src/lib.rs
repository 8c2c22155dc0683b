//! testbed: what seedgate's end-to-end tests and the demo share to stand up a topology.
//!
//! - [`pki`]: a throw-away CA, server and client certificates, rustls configs.
//! - [`backend`]: stand-in upstreams (a TLS "kube-apiserver", TCP echo/sink, a plain HTTP page).
//! - [`grpc_core`]: a konnectivity client on gRPC core (Python grpcio), driven as a child process.
//! - [`proc`]: finding, building and running the seedgate binaries; the address-file contract.
//! - [`inproc`]: the same binaries served in this process (`bind()` → `run`), with the same files.
//! - [`admin`]: a minimal HTTP/1.1 client for admin endpoints, and Prometheus text parsing.
//! - [`tls_client`]: TLS requests that report what the client saw (certificate, ALPN, alert).
//! - [`quic`]: a quinn echo server, quinn clients, a stand-in NAT that rebinds and reads connection IDs.
//! - [`raw_agent`]: an agent written by hand over QUIC: any control lines, sent as given.
//! - [`migration`]: control-plane migration worlds (two seeds, replicas, agents, etcd) and their loads.
//! - [`netns`]: network namespaces and veth pairs for multi-host topologies (root only).
//! - [`link`]: a WAN link emulated between two namespaces (delay, rate, bottleneck, loss, black hole).
//! - [`faults`]: rigs for faults on that link (one replica, or two behind a gateway on two paths) and dial outcomes.
//! - [`poll`]: waiting for a condition with a deadline instead of sleeping.
//! - [`tmp`]: temporary directories removed on drop.
//! - [`docs`]: the repository's Markdown (README and book): files, anchors, links, marked examples.
//! - [`secret_volume`]: a directory laid out like a mounted Kubernetes secret (atomic `..data` swaps).
//! - [`token_review`]: a stand-in kube-apiserver that reviews ServiceAccount tokens (and fails as one does).
//! - [`openssl_ca`]: `openssl ca`'s database for a test CA: revoking certificates, writing revocation lists.
//! - [`webdriver`]: a headless Chromium driven over WebDriver (the status pages' browser tests).
//!
//! Everything async expects a tokio runtime.

pub mod admin;
pub mod backend;
pub mod docs;
pub mod faults;
pub mod grpc_core;
pub mod inproc;
pub mod konnectivity;
pub mod link;
pub mod migration;
pub mod netns;
pub mod openssl_ca;
pub mod peers;
pub mod pki;
pub mod poll;
pub mod proc;
pub mod quic;
pub mod raw_agent;
pub mod secret_volume;
pub mod tls_client;
pub mod tmp;
pub mod token_review;
pub mod tunnel_kit;
pub mod webdriver;

pub use admin::{http_get, http_post, metric_sum, metric_value, wait_ready};
pub use backend::{HttpBackend, TcpEcho, TcpSink, TlsHttpBackend};
pub use inproc::InProc;
pub use pki::{Ca, Issued};
pub use poll::poll_until;
pub use proc::{Addresses, Proc, bin_path, ensure_built};
pub use tls_client::{TlsFailure, TlsResult, tls_handshake_error, tls_request};
pub use tmp::TempDir;
