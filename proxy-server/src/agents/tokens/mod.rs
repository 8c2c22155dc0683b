//! ServiceAccount tokens of agents: a TokenReview at the named cluster's kube-apiserver (and only there), what its answer says, a bounded cache of answers, the budget of unauthenticated peers' reviews, and the verdict a session's admission and its later re-reviews act on.

mod budget;
mod cache;
mod client;

pub(crate) use budget::Limit;
pub(crate) use client::{Lane, Unavailable};

use budget::Budgets;
use cache::Cache;
use client::{Client, Endpoint};
use proxy_core::net::pending::SourceKey;
use proxy_core::obs::metrics::{at_zero, counter_vec, seconds_histogram};
use proxy_core::prometheus::{HistogramVec, IntCounterVec, Registry};
use proxy_core::sync::Mutex;
use proxy_core::tunnel::Secret;
use proxy_core::watch::tls::TlsMetrics;
use proxy_wire::token_review::{self, Account, Answered, BadExpiry, Verdict};
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

impl Reviewed {
    /// How long from `now` until the token's `exp` (zero when past; `None` without `exp`).
    pub(crate) fn expires_in(&self, now: SystemTime) -> Option<Duration> {
        self.expires.map(|e| e.duration_since(now).unwrap_or_default())
    }
}

/// A kube-apiserver's answer as the cache keeps it: a yes, or a no about the token.
type Answer = Result<Reviewed, Verdict>;

/// Why a token got no session (or lost it). What the log says; the agent is told the label.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReviewError {
    /// The kube-apiserver answered, and not yes.
    #[error(transparent)]
    Refused(#[from] Verdict),
    /// The token's `exp` is no time: refused without asking.
    #[error(transparent)]
    Expiry(#[from] BadExpiry),
    /// No token to review (an empty one).
    #[error("no token")]
    NoToken,
    /// No answer: the kube-apiserver is down, slow, or refuses proxy-server itself.
    #[error("the kube-apiserver did not review the token: {0}")]
    Unavailable(#[from] Unavailable),
    /// Not asked: the reviews of new sessions are at their limit.
    #[error("not reviewed: {0}")]
    Busy(#[from] Limit),
}

impl ReviewError {
    /// The reason label of metrics and refusals.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            ReviewError::Refused(v) => v.label(),
            ReviewError::Expiry(_) => "token_invalid",
            ReviewError::NoToken => "token_required",
            ReviewError::Unavailable(_) => "token_review_unavailable",
            ReviewError::Busy(_) => "token_review_busy",
        }
    }
}

/// Who asks for a review: a new session (an unauthenticated peer, from this source) or a live one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Asker {
    New(SourceKey),
    Live,
}

/// Where a review's answer came from.
enum Source {
    Asked,
    Cached,
    /// Not asked at all (refused before: the token's `exp`, the budget).
    NotAsked,
}

/// What the status page shows of the token reviews.
pub(crate) struct ReviewFigures {
    /// Answers cached, and how many the cache holds at most.
    pub cached: usize,
    pub capacity: usize,
    /// Reviews in flight now, by cluster.
    pub in_flight: Vec<(String, usize)>,
    /// Reviews so far, by result (`authenticated`, `cached`, or the refusal's reason).
    pub results: std::collections::BTreeMap<String, u64>,
}

#[derive(Clone)]
struct TokenMetrics {
    reviews: IntCounterVec,
    seconds: HistogramVec,
    budget_refused: IntCounterVec,
    renewals: IntCounterVec,
}

/// The TokenReview clients of every cluster, the cache of their answers and the budget of new
/// sessions' reviews.
pub(crate) struct Reviewers {
    clients: Mutex<HashMap<String, Arc<Client>>>,
    cache: Mutex<Cache<Answer>>,
    budgets: Arc<Mutex<Budgets>>,
    tls_metrics: TlsMetrics,
    metrics: TokenMetrics,
}

impl Reviewers {
    pub(crate) fn new(reg: &Registry, tls_metrics: &TlsMetrics, cache_size: usize) -> Self {
        let metrics = TokenMetrics {
            reviews: counter_vec(
                reg,
                "seedgate_token_reviews_total",
                "Agent tokens reviewed, by cluster and result: authenticated, cached (a yes reused), cached_refused (a no reused), token_invalid (not authenticated, a request the kube-apiserver refused, or an exp that is no time), token_audience, token_account, token_review_malformed, token_review_unavailable (the kube-apiserver did not answer, or refused proxy-server itself). Reviews not asked for lack of a place are counted in seedgate_token_review_budget_refused_total.",
                &["cluster", "result"],
            ),
            seconds: seconds_histogram(
                reg,
                "seedgate_token_review_duration_seconds",
                "Time a TokenReview took at the cluster's kube-apiserver (cached answers not included), by cluster.",
                &["cluster"],
            ),
            budget_refused: counter_vec(
                reg,
                "seedgate_token_review_budget_refused_total",
                "New agent sessions refused without a review (token_review_busy) because the cluster's reviews of new sessions held their places, by cluster and limit: per_source (the session's source address held its share) or in_all (every place was held).",
                &["cluster", "limit"],
            ),
            renewals: counter_vec(
                reg,
                "seedgate_token_renewals_total",
                "Renewed tokens live agent sessions sent, by cluster and result: review (reviewed at once), deferred (too soon after the session's last review: the latest is reviewed once 10s have passed), superseded (replaced by a later one before it was looked at), unchanged (the session's token again: not reviewed), empty (the agent has no token any more: the session ends).",
                &["cluster", "result"],
            ),
        };
        Self {
            clients: Mutex::new(HashMap::new()),
            cache: Mutex::new(Cache::new(cache_size)),
            budgets: Arc::new(Mutex::new(Budgets::default())),
            tls_metrics: tls_metrics.clone(),
            metrics,
        }
    }

    /// The review metrics of `cluster` (one with a `token_review`) at 0 before its first
    /// review, so that alerts tell "none yet" from "missing".
    pub(crate) fn at_zero(&self, cluster: &str) {
        let c: &[&str] = &[cluster];
        let results = [
            "authenticated",
            "cached",
            "cached_refused",
            "token_invalid",
            "token_audience",
            "token_account",
            "token_review_malformed",
            "token_review_unavailable",
            "token_required",
        ];
        at_zero(&self.metrics.reviews, &[c, &results]);
        at_zero(&self.metrics.seconds, &[c]);
        at_zero(&self.metrics.budget_refused, &[c, &["per_source", "in_all"]]);
        at_zero(&self.metrics.renewals, &[c, &["review", "deferred", "superseded", "unchanged", "empty"]]);
    }

    /// Review `token` at `cluster`'s kube-apiserver for `asker` (an answer of the last
    /// `cache_ttl` for the same token and settings is reused; a new session's review needs a
    /// place in the cluster's budget).
    pub(crate) async fn review(
        &self,
        cluster: &str,
        settings: &ClusterReview,
        token: &Secret,
        asker: Asker,
    ) -> Result<Reviewed, ReviewError> {
        let (result, source) = self.review_uncounted(cluster, settings, token, asker).await;
        let label = match (&result, source) {
            (Err(ReviewError::Busy(limit)), _) => {
                self.metrics.budget_refused.with_label_values(&[cluster, limit.label()]).inc();
                return result;
            }
            (Ok(_), Source::Cached) => "cached",
            (Ok(_), _) => "authenticated",
            (Err(_), Source::Cached) => "cached_refused",
            (Err(e), _) => e.label(),
        };
        self.metrics.reviews.with_label_values(&[cluster, label]).inc();
        result
    }

    async fn review_uncounted(
        &self,
        cluster: &str,
        settings: &ClusterReview,
        token: &Secret,
        asker: Asker,
    ) -> (Result<Reviewed, ReviewError>, Source) {
        if token.is_empty() {
            return (Err(ReviewError::NoToken), Source::NotAsked);
        }
        // Read before asking: a token whose `exp` is no time is refused as it is.
        let expires = match token_review::expiry(token.expose()) {
            Ok(None) => None,
            Ok(Some(s)) => match SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(s)) {
                Some(t) => Some(t),
                None => return (Err(BadExpiry(s.to_string()).into()), Source::NotAsked),
            },
            Err(e) => return (Err(e.into()), Source::NotAsked),
        };
        let key = cache::key(cluster, &settings.audiences, &settings.accounts, token.expose());
        let now = Instant::now();
        if let Some(hit) = self.cache.lock().get(&key, now) {
            return (hit.map_err(ReviewError::from), Source::Cached);
        }
        // Held until the answer: unauthenticated peers cannot take every place.
        let _place = match asker {
            Asker::New(source) => match budget::take(&self.budgets, cluster, source, settings.max_in_flight) {
                Ok(p) => Some(p),
                Err(limit) => return (Err(limit.into()), Source::NotAsked),
            },
            Asker::Live => None,
        };
        let lane = if matches!(asker, Asker::New(_)) { Lane::New } else { Lane::Live };
        let answer = match self.ask(cluster, settings, token, lane).await {
            Ok(a) => a,
            Err(e) => return (Err(e.into()), Source::Asked),
        };
        let answer = answer.map(|account| Reviewed { account, expires });
        let ttl = match &answer {
            Ok(r) => match r.expires_in(SystemTime::now()) {
                // A yes is never reused past the token's own expiry.
                Some(left) => settings.cache_ttl.min(left),
                None => settings.cache_ttl,
            },
            // An answer that is no review may be the kube-apiserver's passing fault.
            Err(Verdict::Malformed(_)) => Duration::ZERO,
            Err(_) => settings.cache_ttl,
        };
        if !ttl.is_zero() {
            self.cache.lock().put(key, answer.clone(), now + ttl);
        }
        (answer.map_err(ReviewError::from), Source::Asked)
    }

    /// Ask the kube-apiserver: its word on the token (the account, or why not), or why it gave
    /// none.
    async fn ask(
        &self,
        cluster: &str,
        settings: &ClusterReview,
        token: &Secret,
        lane: Lane,
    ) -> Result<Result<Account, Verdict>, Unavailable> {
        let client = self.client(cluster, settings).map_err(Unavailable::Setup)?;
        let body = token_review::request(token.expose(), &settings.audiences);
        let started = Instant::now();
        let answer = client.post(lane, body, settings.timeout).await;
        self.metrics.seconds.with_label_values(&[cluster]).observe(started.elapsed().as_secs_f64());
        let (status, body) = answer?;
        let status_of = |why: String| Unavailable::Status { status, why, message: token_review::status_message(&body) };
        match token_review::answered(status) {
            Answered::Review => Ok(token_review::verdict(&body, &settings.audiences, &settings.accounts)),
            Answered::TokenRefused => {
                Ok(Err(Verdict::Rejected { status, message: token_review::status_message(&body) }))
            }
            Answered::Credentials => Err(status_of(format!(
                "proxy-server's credentials of clusters.{cluster}.token_review are refused, or may not create tokenreviews"
            ))),
            Answered::NotFound => Err(status_of(format!("no TokenReview API at clusters.{cluster}.token_review.url"))),
            Answered::Unavailable => Err(status_of("overloaded or failing".to_owned())),
        }
    }

    /// The cluster's client, built anew when its settings changed.
    fn client(&self, cluster: &str, settings: &ClusterReview) -> Result<Arc<Client>, String> {
        let endpoint = Endpoint { settings: settings.review.clone(), max_in_flight: settings.max_in_flight };
        let mut clients = self.clients.lock();
        if let Some(c) = clients.get(cluster).filter(|c| c.endpoint == endpoint) {
            return Ok(c.clone());
        }
        let c = Arc::new(Client::new(cluster, endpoint, &self.tls_metrics)?);
        clients.insert(cluster.to_owned(), c.clone());
        Ok(c)
    }

    /// What the status page shows: answers cached (and the cache's size), reviews in flight at
    /// each cluster's kube-apiserver now, and the reviews so far by result.
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

    /// Count `n` renewals of a live session of `cluster` as `result`.
    pub(crate) fn count_renewals(&self, cluster: &str, result: &str, n: u64) {
        self.metrics.renewals.with_label_values(&[cluster, result]).inc_by(n);
    }
}
