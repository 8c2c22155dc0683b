//! Cluster states from the files of `clusters_dir`, merged with the main config's `clusters`; a cluster defined twice is refused, naming both places.

use proxy_core::watch::dir::{FileMetrics, Update};
use seedgate_config::server::ClusterState;
use std::collections::{BTreeMap, HashMap};

type States = BTreeMap<String, ClusterState>;

/// A cluster a file defines that is defined elsewhere too (the file is refused).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Taken {
    #[error("{file}: clusters.{cluster}: also defined in the main config")]
    ByMain { file: String, cluster: String },
    #[error("{file}: clusters.{cluster}: also defined in {other}")]
    ByFile { file: String, cluster: String, other: String },
}

/// Why a cluster file was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error(transparent)]
    Invalid(#[from] seedgate_config::ConfigError),
    /// Every cluster of the file defined elsewhere too, one per line.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Taken(Vec<Taken>),
}

/// A main config that defines a cluster a file defines (the reload is refused).
#[derive(Debug, thiserror::Error)]
#[error("cluster {cluster:?} is defined in both the main config and {file}")]
pub struct DefinedTwice {
    cluster: String,
    file: String,
}

/// The cluster files in force.
#[derive(Default)]
pub(crate) struct ClusterFiles {
    files: BTreeMap<String, States>,
    /// Which file defines each cluster.
    owner: HashMap<String, String>,
    refused: BTreeMap<String, String>,
    metrics: Option<FileMetrics>,
}

impl ClusterFiles {
    pub(crate) fn new(metrics: Option<FileMetrics>) -> Self {
        Self { metrics, ..Self::default() }
    }

    /// Every file's states (no cluster is in two files).
    pub(crate) fn states(&self) -> impl Iterator<Item = (&String, &ClusterState)> {
        self.files.values().flatten()
    }

    /// The first cluster that both `main` (the main config's `clusters`) and a file define.
    pub(crate) fn conflict_with(&self, main: &States) -> Option<DefinedTwice> {
        main.keys().find_map(|c| self.owner.get(c).map(|f| DefinedTwice { cluster: c.clone(), file: f.clone() }))
    }

    pub(crate) fn show(&self) -> serde_json::Value {
        serde_json::json!({
            "files": self.files.len(),
            "clusters": self.owner.len(),
            "refused": self.refused,
        })
    }

    pub(crate) fn summary(&self) -> (usize, usize, usize) {
        (self.files.len(), self.owner.len(), self.refused.len())
    }

    /// Take in an update of the directory (`main`: the main config's `clusters`); returns
    /// whether the states in force changed.
    pub(crate) fn absorb(&mut self, up: Update<States>, main: &States) -> bool {
        let mut changed = false;
        for (file, parsed) in up.loaded {
            let states = match parsed.map_err(Refusal::from).and_then(|s| self.fits(&file, s, main)) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(%file, error = %e, "cluster file refused; its earlier states (if any) stay in force");
                    self.count("failure");
                    self.refused.insert(file, e.to_string());
                    continue;
                }
            };
            self.refused.remove(&file);
            self.count("success");
            self.drop_file(&file);
            for c in states.keys() {
                self.owner.insert(c.clone(), file.clone());
            }
            tracing::info!(%file, clusters = states.len(), "cluster file loaded");
            self.files.insert(file, states);
            changed = true;
        }
        for file in up.removed {
            self.refused.remove(&file);
            if self.drop_file(&file) {
                self.count("removed");
                tracing::info!(%file, "cluster file removed");
                changed = true;
            }
        }
        if let Some(m) = &self.metrics {
            m.files.set(self.files.len() as i64);
        }
        changed
    }

    fn fits(&self, file: &str, states: States, main: &States) -> Result<States, Refusal> {
        let mut taken = Vec::new();
        for c in states.keys() {
            let (file, cluster) = (file.to_owned(), c.clone());
            if main.contains_key(c) {
                taken.push(Taken::ByMain { file, cluster });
            } else if let Some(other) = self.owner.get(c).filter(|o| *o != &file) {
                taken.push(Taken::ByFile { file, cluster, other: other.clone() });
            }
        }
        if taken.is_empty() { Ok(states) } else { Err(Refusal::Taken(taken)) }
    }

    fn drop_file(&mut self, file: &str) -> bool {
        let Some(old) = self.files.remove(file) else { return false };
        for c in old.keys() {
            self.owner.remove(c);
        }
        true
    }

    fn count(&self, result: &str) {
        if let Some(m) = &self.metrics {
            m.reloads.with_label_values(&[result]).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seedgate_config::server::{ClusterMode, parse_cluster_file};

    fn update(files: &[(&str, &str)], removed: &[&str]) -> Update<States> {
        Update {
            loaded: files.iter().map(|(f, t)| (f.to_string(), parse_cluster_file(t, f))).collect(),
            removed: removed.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn files_merge_and_a_cluster_defined_twice_is_refused() {
        let main: States = parse_cluster_file("clusters:\n  m: { state: active }\n", "main").unwrap();
        let mut f = ClusterFiles::new(None);
        assert!(f.absorb(update(&[("a.yaml", "clusters:\n  a: { state: fenced }\n")], &[]), &main));
        let bad = [("b.yaml", "clusters:\n  a: { state: active }\n  m: { state: fenced }\n  b: { state: fenced }\n")];
        assert!(!f.absorb(update(&bad, &[]), &main));
        let why = &f.refused["b.yaml"];
        assert!(why.contains("b.yaml: clusters.a: also defined in a.yaml"), "{why}");
        assert!(why.contains("b.yaml: clusters.m: also defined in the main config"), "{why}");
        assert_eq!(f.states().map(|(c, s)| (c.as_str(), s.state)).collect::<Vec<_>>(), [("a", ClusterMode::Fenced)]);
        // A broken file keeps what it had.
        assert!(!f.absorb(update(&[("a.yaml", "clusters: [\n")], &[]), &main));
        assert_eq!(f.states().count(), 1);
        assert!(f.absorb(update(&[], &["a.yaml"]), &main));
        assert_eq!(f.states().count(), 0);
        assert!(f.absorb(update(&[("b.yaml", "clusters:\n  a: { state: fenced }\n")], &[]), &main));
        let main2 = parse_cluster_file("clusters:\n  a: { state: active }\n", "main").unwrap();
        assert!(f.conflict_with(&main2).is_some_and(|e| e.to_string().contains("b.yaml")));
    }
}
