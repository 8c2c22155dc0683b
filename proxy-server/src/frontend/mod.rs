//! The front ends' wing: where kube-apiserver's egress and Prometheus enter the tunnel — their listeners, and a connection's life from accept to relay as one pipeline.
//!
//! Open first: [`pipeline`] (admit → handshake → protocol → relay → log, one exit). What a
//! connection carries from step to step, and what every connection uses, is in [`wing`]. The
//! protocols: HTTP CONNECT (kube-apiserver egress, Prometheus https targets; [`connect`]),
//! absolute-form forward proxying (Prometheus http targets; [`forward`]), konnectivity's gRPC
//! ([`grpc`], its HTTP/2 requests normalised by [`h2_normalise`]), or a fixed port forward to one
//! target (`protocol: tcp`; [`port_forward`]). Each refuses what it cannot serve with a
//! [`Refusal`](refusal::Refusal); proxy credentials are read by [`proxy_auth`]. A TLS connection
//! whose client certificate a reloaded list revokes is ended ([`revocation`]). [`listener`]
//! binds and reloads the sockets, [`unix_socket`] the socket files on disk.

mod connect;
mod forward;
mod grpc;
mod h2_normalise;
mod listener;
mod pipeline;
mod port_forward;
mod proxy_auth;
mod refusal;
mod revocation;
mod unix_socket;
mod wing;

pub use listener::ApplyError;
pub(crate) use listener::{Listeners, Opened};
pub use unix_socket::SocketError;
pub(crate) use wing::Frontends;
