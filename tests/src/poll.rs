//! Waiting for a condition with a deadline: the replacement for `sleep` in tests.

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// What one poll attempt returned: done with a value, or not yet (with the reason, if any).
pub trait Attempt {
    type Output;
    fn into_attempt(self) -> Result<Self::Output, Option<anyhow::Error>>;
}

impl<T> Attempt for Option<T> {
    type Output = T;
    fn into_attempt(self) -> Result<T, Option<anyhow::Error>> {
        self.ok_or(None)
    }
}

impl<T, E: Into<anyhow::Error>> Attempt for Result<T, E> {
    type Output = T;
    fn into_attempt(self) -> Result<T, Option<anyhow::Error>> {
        self.map_err(|e| Some(e.into()))
    }
}

/// Call `f` every `every` until it returns `Some`/`Ok`, for at most `deadline` (each attempt is
/// also cut off at the deadline). On timeout the error carries the last attempt's error.
pub async fn poll_until<F, Fut, A>(deadline: Duration, every: Duration, mut f: F) -> anyhow::Result<A::Output>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
    A: Attempt,
{
    let end = Instant::now() + deadline;
    // The count bound is implied by the deadline; it is explicit so a zero `every` cannot spin.
    let max_attempts = (deadline.as_millis() / every.as_millis().max(1)).saturating_add(2);
    let mut last: Option<anyhow::Error> = None;
    for _ in 0..max_attempts {
        match tokio::time::timeout_at(end, f()).await {
            Ok(a) => match a.into_attempt() {
                Ok(v) => return Ok(v),
                Err(e) => last = e.or(last),
            },
            Err(_) => break,
        }
        if Instant::now() + every > end {
            break;
        }
        tokio::time::sleep(every.max(Duration::from_millis(1))).await;
    }
    Err(match last {
        Some(e) => e.context(format!("condition not met within {deadline:?}")),
        None => anyhow::anyhow!("condition not met within {deadline:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_value_and_last_error() {
        let mut n = 0;
        let v = poll_until(Duration::from_secs(5), Duration::from_millis(1), || {
            n += 1;
            let n = n;
            async move { (n >= 3).then_some(n) }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);

        let e = poll_until(Duration::from_millis(30), Duration::from_millis(5), || async {
            Err::<(), _>(anyhow::anyhow!("still broken"))
        })
        .await
        .unwrap_err();
        assert!(format!("{e:#}").contains("still broken"), "{e:#}");
    }
}
