//! How proxy-server's status page lays out its document: the summary lines, the clusters table (each row opening its sessions) and the front ends table.

use proxy_core::obs::status::{Field, Format, Page, Table, col};

const SESSIONS: Table = Table {
    key: "sessions",
    title: "sessions",
    row_key: "id",
    state: "standing",
    columns: &[
        col("node", "node", Format::Text),
        col("standing", "standing", Format::State),
        col("doubt", "doubt", Format::Text),
        col("transport", "transport", Format::Text),
        col("peer", "peer", Format::Text),
        col("replica", "replica", Format::Text),
        col("age_s", "age", Format::Secs),
        col("streams", "streams", Format::Int),
        col("bytes_to_shoot", "to shoot", Format::Bytes),
        col("bytes_to_seed", "to seed", Format::Bytes),
        col("last_error", "last error", Format::Text),
        col("version", "version", Format::Text),
    ],
    nested: None,
    paged: false,
    empty: "no sessions",
};

const SUMMARY: &[Field] = &[
    col("replica.id", "replica", Format::Text),
    col("replica.count", "replicas announced", Format::Int),
    col("replica.draining", "draining", Format::Bool),
    col("totals.clusters", "clusters", Format::Int),
    col("totals.clusters_without_agents", "without agents", Format::Int),
    col("totals.sessions", "sessions", Format::Int),
    col("totals.sessions_not_active", "sessions not active", Format::Int),
    col("totals.streams", "streams", Format::Int),
    col("uptime_s", "up", Format::Secs),
    col("token_reviews.cached", "token answers cached", Format::Int),
    col("token_reviews.in_flight", "token reviews in flight", Format::Int),
    col("token_reviews.results", "token reviews", Format::Counts),
];

const CLUSTERS: Table = Table {
    key: "clusters",
    title: "Clusters",
    row_key: "name",
    state: "health",
    columns: &[
        col("name", "cluster", Format::Text),
        col("health", "health", Format::State),
        col("state", "state", Format::Text),
        col("sessions_here", "agents", Format::Int),
        col("streams", "streams", Format::Int),
        col("dials.ok", "dials ok (1m / 10m)", Format::Series),
        col("dials_failed", "failed (1m / 10m)", Format::Series),
        col("dials", "dials by result (10m)", Format::Counts),
        col("bytes_to_shoot", "to shoot", Format::Bytes),
        col("bytes_to_seed", "to seed", Format::Bytes),
        col("agent_sessions", "agent sessions", Format::Counts),
        col("move_to", "move to", Format::List),
    ],
    nested: Some(&SESSIONS),
    paged: true,
    empty: "no cluster matches",
};

const FRONTENDS: Table = Table {
    key: "frontends",
    title: "Front ends",
    row_key: "name",
    state: "",
    columns: &[
        col("name", "front end", Format::Text),
        col("kind", "kind", Format::Text),
        col("listen", "listen", Format::Text),
        col("cluster", "cluster", Format::Text),
        col("tls", "TLS", Format::Bool),
        col("connections", "open", Format::Int),
        col("results", "connections by result", Format::Counts),
        col("refusals", "refused by reason", Format::Counts),
    ],
    nested: None,
    paged: false,
    empty: "no front ends",
};

/// The page: the summary (with the token reviews), clusters (each opening its sessions), front ends.
pub(crate) const PAGE: Page = Page { title: "proxy-server", summary: SUMMARY, tables: &[CLUSTERS, FRONTENDS] };
