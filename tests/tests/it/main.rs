//! seedgate's end-to-end tests, one test binary: one module per area. The binaries run in this
//! process (their `bind()` → `run(shutdown)` API) unless a process boundary is the point
//! (signals, exit codes, `--check`, network namespaces, the deployment and the README
//! walk-through). Tests in different modules run at the same time: each binds `127.0.0.1:0`,
//! and topology tests use address ranges no other module uses.

mod ca_rotation;
mod certificate_errors;
mod check;
mod client_hello_rustls;
mod dead_sessions;
mod dependencies;
mod deploy;
mod docs;
mod forward_totals;
mod grpc;
mod grpc_core;
mod ha;
mod lifecycle;
mod migration;
mod migration_ha;
mod module_graph;
mod p2_agent;
mod p2_connect;
mod p2_proxy_protocol;
mod path_faults;
mod pending_budget;
mod port_forward;
mod proxy_credentials;
mod proxy_strategies;
mod quic_sni;
mod readiness;
mod readme_examples;
mod readme_walkthrough;
mod revocation;
mod route_files;
mod runtime_changes;
mod session_caps;
mod sizes;
mod sni_router;
mod source;
mod status_page;
mod tenant_shares;
mod token_agents;
mod token_renewals;
mod tunnel;
mod tunnel_auto;
mod tunnel_prometheus;
mod tunnel_quic;
mod tunnel_topology;
mod udp_migration;
mod uds_clients;
mod unix_socket;
mod unknown_clusters;
mod untrusted_agents;
mod wan_bulk;
mod wan_link;
