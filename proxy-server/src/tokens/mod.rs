//! ServiceAccount tokens of agents: a TokenReview at the named cluster's kube-apiserver (and only there), a bounded cache of positive answers, and the verdict a session's admission and its later re-reviews act on.

mod cache;
mod client;

use cache::Cache;
use client::{Client, Endpoint, Unavailable};
use proxy_core::obs::metrics::{counter_vec, seconds_histogram};
use proxy_core::prometheus::{HistogramVec, IntCounterVec, Registry};
use proxy_core::sync::Mutex;
use proxy_core::tunnel::Secret;
use proxy_core::watch::tls::TlsMetrics;
use proxy_wire::token_review::{self, Account, Verdict};
use seedgate_config::server::{TokenReview, TokenReviews};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// A review's settings for one cluster: its kube-apiserver, and the global defaults it does
/// not override.
#[derive(Clone)]
pub(crate) struct ClusterReview {
    pub review: TokenReview,
    pub audiences: Vec<String>,
    pub accounts: Vec<String>,
    pub timeout: Duration,
    pub cache_ttl: Duration,
    pub max_in_flight: usize,
}

impl ClusterReview {
    pub(crate) fn of(review: &TokenReview, defaults: &TokenReviews) -> Self {
        Self {
            audiences: review.audiences.clone().unwrap_or_else(|| defaults.audiences.clone()),
            accounts: review.service_accounts.clone().unwrap_or_else(|| defaults.service_accounts.clone()),
            review: review.clone(),
            timeout: defaults.timeout.get(),
            cache_ttl: defaults.cache_ttl.get(),
            max_in_flight: defaults.max_in_flight,
        }
    }
}

/// A token the kube-apiserver authenticated as an allowed account, for an allowed audience.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reviewed {
    pub account: Account,
    /// The token's `exp` (not verified: only when to review again), if it has one.
    pub expires: Option<SystemTime>,
}

/// Why a token got no session.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReviewError {
    /// The kube-apiserver answered, and not yes.
    #[error(transparent)]
    Refused(#[from] Verdict),
    /// No answer: the kube-apiserver is down, slow, or refuses proxy-server itself.
    #[error("the kube-apiserver did not review the token: {0}")]
    Unavailable(String),
}

impl ReviewError {
    /// The reason label of metrics and refusals.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            ReviewError::Refused(v) => v.label(),
            ReviewError::Unavailable(_) => "token_review_unavailable",
        }
    }
}

#[derive(Clone)]
struct TokenMetrics {
    reviews: IntCounterVec,
    seconds: HistogramVec,
}

/// What the status page shows of the token reviews.
pub(crate) struct ReviewFigures {
    /// Positive answers cached, and how many the cache holds at most.
    pub cached: usize,
    pub capacity: usize,
    /// Reviews in flight now, by cluster.
    pub in_flight: Vec<(String, usize)>,
    /// Reviews so far, by result (`authenticated`, `cached`, or the refusal's reason).
    pub results: std::collections::BTreeMap<String, u64>,
}

/// The TokenReview clients of every cluster and the cache of their positive answers.
pub(crate) struct Reviewers {
    clients: Mutex<HashMap<String, Arc<Client>>>,
    cache: Mutex<Cache>,
    tls_metrics: TlsMetrics,
    metrics: TokenMetrics,
}

impl Reviewers {
    pub(crate) fn new(reg: &Registry, tls_metrics: &TlsMetrics, cache_size: usize) -> Self {
        let metrics = TokenMetrics {
            reviews: counter_vec(
                reg,
                "seedgate_token_reviews_total",
                "Agent tokens reviewed, by cluster and result: authenticated, cached (a positive answer reused), token_invalid, token_audience, token_account, token_review_malformed, token_review_unavailable (the kube-apiserver did not answer).",
                &["cluster", "result"],
            ),
            seconds: seconds_histogram(
                reg,
                "seedgate_token_review_duration_seconds",
                "Time a TokenReview took at the cluster's kube-apiserver (cached answers not included), by cluster.",
                &["cluster"],
            ),
        };
        Self {
            clients: Mutex::new(HashMap::new()),
            cache: Mutex::new(Cache::new(cache_size)),
            tls_metrics: tls_metrics.clone(),
            metrics,
        }
    }

    /// Review `token` at `cluster`'s kube-apiserver (a positive answer of the last
    /// `cache_ttl` for the same token and settings is reused).
    pub(crate) async fn review(
        &self,
        cluster: &str,
        settings: &ClusterReview,
        token: &Secret,
    ) -> Result<Reviewed, ReviewError> {
        let result = self.review_uncounted(cluster, settings, token).await;
        let label = match &result {
            Ok((_, true)) => "cached",
            Ok((_, false)) => "authenticated",
            Err(e) => e.label(),
        };
        self.metrics.reviews.with_label_values(&[cluster, label]).inc();
        result.map(|(r, _)| r)
    }

    async fn review_uncounted(
        &self,
        cluster: &str,
        settings: &ClusterReview,
        token: &Secret,
    ) -> Result<(Reviewed, bool), ReviewError> {
        let key = cache::key(cluster, &settings.audiences, &settings.accounts, token.expose());
        let now = Instant::now();
        if let Some(hit) = self.cache.lock().get(&key, now) {
            return Ok((hit, true));
        }
        let client = self.client(cluster, settings).map_err(ReviewError::Unavailable)?;
        let body = token_review::request(token.expose(), &settings.audiences);
        let started = Instant::now();
        let answer = client.post(body, settings.timeout).await;
        self.metrics.seconds.with_label_values(&[cluster]).observe(started.elapsed().as_secs_f64());
        let (_, body) = answer.map_err(|e: Unavailable| ReviewError::Unavailable(e.to_string()))?;
        let account = token_review::verdict(&body, &settings.audiences, &settings.accounts)?;
        let expires = token_review::expiry(token.expose()).map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        let reviewed = Reviewed { account, expires };
        let ttl = match expires.map(|e| e.duration_since(SystemTime::now())) {
            // Never reused past the token's own expiry.
            Some(Ok(left)) => settings.cache_ttl.min(left),
            Some(Err(_)) => Duration::ZERO,
            None => settings.cache_ttl,
        };
        if !ttl.is_zero() {
            self.cache.lock().put(key, reviewed.clone(), now + ttl);
        }
        Ok((reviewed, false))
    }

    /// The cluster's client, built anew when its settings changed.
    fn client(&self, cluster: &str, settings: &ClusterReview) -> Result<Arc<Client>, String> {
        let endpoint = Endpoint { settings: settings.review.clone(), max_in_flight: settings.max_in_flight };
        let mut clients = self.clients.lock();
        if let Some(c) = clients.get(cluster).filter(|c| c.endpoint == endpoint) {
            return Ok(c.clone());
        }
        let c = Arc::new(Client::new(&format!("token-review {cluster}"), endpoint, &self.tls_metrics)?);
        clients.insert(cluster.to_owned(), c.clone());
        Ok(c)
    }

    /// What the status page shows: answers cached (and the cache's size), and reviews in
    /// flight at each cluster's kube-apiserver now.
    pub(crate) fn figures(&self) -> ReviewFigures {
        let (cached, capacity) = {
            let c = self.cache.lock();
            (c.len(), c.capacity())
        };
        let in_flight = self.clients.lock().iter().map(|(c, client)| (c.clone(), client.in_flight())).collect();
        let readings = proxy_core::obs::status::readings(&self.metrics.reviews);
        ReviewFigures {
            cached,
            capacity,
            in_flight,
            results: proxy_core::obs::status::sum_by(&readings, None, "result"),
        }
    }

    /// A new cache size (a reload); the cache empties when it changes.
    pub(crate) fn resize(&self, size: usize) {
        let mut cache = self.cache.lock();
        if cache.capacity() != size {
            *cache = Cache::new(size);
        }
    }
}
