//! TokenReview answers, kept briefly by the hash of the token and the settings they answered (a yes until the token's expiry at the latest, a no as long): bounded in count, oldest out first, never past their deadline.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// SHA-256 of the cluster, the audiences and accounts asked for, and the token: the token
/// itself is not kept, and an answer is reused only for the same question.
pub(super) type Key = [u8; 32];

pub(super) fn key(cluster: &str, audiences: &[String], accounts: &[String], token: &str) -> Key {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    // Each part ends with a NUL (none of them holds one), so two different questions never
    // make the same input.
    for part in std::iter::once(cluster)
        .chain(audiences.iter().map(String::as_str))
        .chain(["\u{1}"])
        .chain(accounts.iter().map(String::as_str))
        .chain(["\u{1}", token])
    {
        ctx.update(part.as_bytes());
        ctx.update(&[0]);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// At most `capacity` answers (`A`: a kube-apiserver's answer as the reviewers keep it); a full
/// cache drops its oldest entry for a new one.
pub(super) struct Cache<A> {
    capacity: usize,
    entries: HashMap<Key, (A, Instant)>,
    /// Insertion order (a key appears once per insertion; a stale position is skipped).
    order: VecDeque<(Key, Instant)>,
}

impl<A: Clone> Cache<A> {
    pub(super) fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), entries: HashMap::new(), order: VecDeque::new() }
    }

    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Answers held (some may have passed their deadline, not yet dropped).
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn get(&mut self, key: &Key, now: Instant) -> Option<A> {
        match self.entries.get(key) {
            Some((r, until)) if *until > now => Some(r.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    pub(super) fn put(&mut self, key: Key, r: A, until: Instant) {
        // Bounded: each round removes one position, and there are at most 2 × capacity.
        while self.entries.len() >= self.capacity || self.order.len() >= 2 * self.capacity {
            let Some((old, at)) = self.order.pop_front() else { break };
            if self.entries.get(&old).is_some_and(|(_, u)| *u == at) {
                self.entries.remove(&old);
            }
        }
        self.entries.insert(key, (r, until));
        self.order.push_back((key, until));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::tokens::{Answer, Reviewed};
    use proxy_wire::token_review::{Account, Verdict};
    use std::time::Duration;

    fn reviewed(name: &str) -> Answer {
        Ok(Reviewed { account: Account { namespace: "ns".into(), name: name.into() }, expires: None })
    }

    #[test]
    fn answers_are_kept_until_their_deadline_and_the_oldest_make_room() {
        let t0 = Instant::now();
        let mut c: Cache<Answer> = Cache::new(2);
        let (a, b, d) = (key("c", &[], &[], "a"), key("c", &[], &[], "b"), key("c", &[], &[], "d"));
        c.put(a, reviewed("a"), t0 + Duration::from_secs(10));
        c.put(b, reviewed("b"), t0 + Duration::from_secs(10));
        assert_eq!(c.get(&a, t0).and_then(|r| r.ok()).map(|r| r.account.name), Some("a".into()));
        assert!(c.get(&a, t0 + Duration::from_secs(10)).is_none(), "expired at its deadline");
        c.put(a, reviewed("a"), t0 + Duration::from_secs(20));
        c.put(d, reviewed("d"), t0 + Duration::from_secs(20));
        assert!(c.entries.len() <= 2 && c.order.len() <= 4, "bounded");
        assert!(c.get(&b, t0).is_none(), "the oldest made room");
        assert!(c.get(&d, t0).is_some());
        for i in 0..100 {
            c.put(key("c", &[], &[], &i.to_string()), reviewed("x"), t0 + Duration::from_secs(5));
        }
        assert!(c.entries.len() <= 2 && c.order.len() <= 4, "bounded after many");
        // A refusal is an answer like a yes.
        let mut c: Cache<Answer> = Cache::new(2);
        let refused = key("c", &[], &[], "garbage");
        c.put(refused, Err(Verdict::Unauthenticated("no".into())), t0 + Duration::from_secs(10));
        assert_eq!(c.get(&refused, t0), Some(Err(Verdict::Unauthenticated("no".into()))));
        assert_eq!(c.get(&refused, t0 + Duration::from_secs(10)), None);
    }

    #[test]
    fn the_key_tells_every_question_apart() {
        let aud = ["seedgate".to_owned()];
        let acc = ["kube-system/proxy-agent".to_owned()];
        let k = key("a", &aud, &acc, "t");
        assert_ne!(k, key("b", &aud, &acc, "t"), "another cluster");
        assert_ne!(k, key("a", &[], &acc, "t"), "other audiences");
        assert_ne!(k, key("a", &aud, &[], "t"), "other accounts");
        assert_ne!(k, key("a", &aud, &acc, "u"), "another token");
        assert_ne!(key("a", &["x".into()], &[], "t"), key("a", &[], &["x".into()], "t"), "a list's end is marked");
        assert_eq!(k, key("a", &aud, &acc, "t"));
    }
}
