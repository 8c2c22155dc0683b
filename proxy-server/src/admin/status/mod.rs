//! proxy-server's status page (`/status`, `/`): each cluster (its state, its agents here and how each session stands, its dials of the last minutes by result), each front end (its connections and refusals), the token reviews — assembled from what the wings keep, through their methods.
//!
//! The clusters come from the registry ([`SessionDirectory::figures`](crate::registry::SessionDirectory::figures),
//! each [`Session`](crate::registry::Session)'s standing and tally: [`clusters`]); the front
//! ends from [`Frontends::counts`]; the token reviews from the agents' reviewers; how the page
//! lays it out is [`page`], its fields [`doc`]. Nothing here is on a dial's or a stream's path.

mod clusters;
mod doc;
mod page;

use super::Admin;
use crate::frontend::Frontends;
use doc::{Frontend, Replica, ServerStatus, TokenReviews};
use proxy_core::obs::status::{Header, StatusPage, StatusQuery};
use seedgate_config::ServerConfig;
use seedgate_config::server::ClusterFrom;
use std::collections::BTreeMap;

impl Admin {
    /// The status document for `query`; `addresses`: the front ends' addresses by name.
    pub(crate) fn status(&self, addresses: &BTreeMap<String, String>, query: &StatusQuery) -> StatusPage {
        let shared = &self.shared;
        let header = Header::new("proxy-server");
        let info = self.agents.replica.info();
        let known = shared.known_clusters();
        let figures = shared.directory.figures();
        let all = clusters::listed(&figures, &known);
        let totals = clusters::totals(&all);
        let (rows, page) = clusters::page(&all, query);
        let mut shown = clusters::Shown::read(shared, info.id.clone());
        let clusters = rows.into_iter().map(|k| clusters::row(k, &mut shown)).collect();
        let doc = ServerStatus {
            header,
            replica: Replica { id: info.id.clone(), count: info.count, draining: info.draining },
            totals,
            page,
            clusters,
            frontends: frontends(&shared.config.load(), &self.frontends, addresses),
            token_reviews: self.token_reviews(),
        };
        StatusPage::new(doc, &page::PAGE)
    }

    fn token_reviews(&self) -> TokenReviews {
        let figures = self.agents.reviewers.figures();
        let in_flight_by_cluster: BTreeMap<String, usize> =
            figures.in_flight.into_iter().filter(|(_, n)| *n > 0).collect();
        TokenReviews {
            cached: figures.cached,
            cache_size: figures.capacity,
            in_flight: in_flight_by_cluster.values().sum(),
            in_flight_by_cluster,
            results: figures.results,
        }
    }
}

/// Each configured front end, with its connections.
fn frontends(cfg: &ServerConfig, fes: &Frontends, addresses: &BTreeMap<String, String>) -> Vec<Frontend> {
    cfg.frontends
        .iter()
        .map(|f| {
            let name = f.name.as_str();
            let counts = fes.counts(name);
            Frontend {
                name: name.to_owned(),
                kind: f.protocol.as_str(),
                listen: addresses.get(name).cloned().unwrap_or_default(),
                cluster: f.cluster.clone().unwrap_or_else(|| match f.cluster_from {
                    ClusterFrom::ClientCertificate => "(client certificate)".into(),
                    ClusterFrom::ProxyAuthorization => "(proxy credentials)".into(),
                }),
                tls: f.tls.is_some(),
                connections: counts.open,
                results: counts.results,
                refusals: counts.refusals,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
