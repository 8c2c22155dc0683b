//! Dials against sessions that answer, stay silent, are slow but alive, or were superseded, on a virtual clock.

use super::*;
use proxy_core::sync::Mutex;
use proxy_core::tunnel::{BoxFuture, ControlMsg, DialError, Echoes, Opener, TunnelStream};
use std::sync::atomic::{AtomicBool, AtomicUsize};

/// How the agent behind a fake session answers a stream open.
#[derive(Clone, Copy, PartialEq)]
enum Agent {
    Answers,
    /// Gone without a word: no answer, no sign of life.
    Silent,
    /// Alive (answers a probe at once) but its own dial takes this long.
    Slow(Duration),
    /// Heard (its own packets arrive), but nothing sent to it gets through: neither the open
    /// nor a PING behind it is answered (an HTTP/2 session whose TCP lost them on a flapping
    /// path and retransmits on its own back-off).
    Stalled,
}

struct Fake {
    agent: Agent,
    heard: AtomicU64,
    opens: AtomicUsize,
    /// Streams it claims to carry (p2c prefers the less busy: this orders the first pick).
    busy: usize,
    /// Its keepalive's verdict, set by the test.
    quiet: proxy_core::tunnel::Quiet,
    /// Its PINGs, where they are in order with its streams (HTTP/2).
    echoes: Option<Echoes>,
    /// From when its path stalls: nothing sent to it is answered any more (HTTP/2 only).
    stalls: AtomicBool,
}

impl Fake {
    fn new(agent: Agent, busy: usize) -> Arc<Self> {
        Arc::new(Self {
            agent,
            heard: AtomicU64::new(100),
            opens: AtomicUsize::new(0),
            busy,
            quiet: Default::default(),
            echoes: None,
            stalls: AtomicBool::new(false),
        })
    }

    /// An HTTP/2 session: its PINGs are answered in order with its streams.
    fn h2(agent: Agent, busy: usize) -> Arc<Self> {
        let mut fake = Arc::into_inner(Self::new(agent, busy)).expect("just made");
        fake.echoes = Some(Echoes::default());
        Arc::new(fake)
    }

    fn opens(&self) -> usize {
        self.opens.load(Ordering::Relaxed)
    }
}

fn stream() -> TunnelStream {
    TunnelStream::new(tokio::net::UnixStream::pair().expect("socket pair").0)
}

impl Opener for Fake {
    fn open(&self, target: &str, timeout: Duration) -> BoxFuture<'_, Result<TunnelStream, DialError>> {
        self.opens.fetch_add(1, Ordering::Relaxed);
        let timed_out = DialError::Timeout(format!("{target}: no answer within {timeout:?}"));
        Box::pin(async move {
            let took = match self.agent {
                Agent::Answers => Duration::ZERO,
                Agent::Silent | Agent::Stalled => Duration::MAX,
                Agent::Slow(d) => d,
            };
            if took > timeout {
                tokio::time::sleep(timeout).await;
                return Err(timed_out);
            }
            tokio::time::sleep(took).await;
            Ok(stream())
        })
    }

    fn control(&self, _msg: &ControlMsg) -> Result<(), DialError> {
        Ok(())
    }

    fn active_streams(&self) -> usize {
        self.busy
    }

    fn is_closed(&self) -> bool {
        false
    }

    fn heard(&self) -> Option<u64> {
        Some(self.heard.load(Ordering::Relaxed))
    }

    fn probe(&self) {
        if self.agent != Agent::Silent {
            self.heard.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(e) = &self.echoes
            && !matches!(self.agent, Agent::Silent | Agent::Stalled)
            && !self.stalls.load(Ordering::Relaxed)
        {
            e.answered(tokio::time::Instant::now());
        }
    }

    fn quiet(&self) -> Option<&proxy_core::tunnel::Quiet> {
        Some(&self.quiet)
    }

    fn echoes(&self) -> Option<&Echoes> {
        self.echoes.as_ref()
    }
}

/// `fake`'s keepalive finds its path quiet `after` from now.
fn turns_quiet(fake: &Arc<Fake>, after: Duration) {
    let f = fake.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        f.quiet.set(true);
    });
}

fn directory() -> Arc<SessionDirectory> {
    let reg = proxy_core::prometheus::Registry::new();
    Arc::new(SessionDirectory::new(ServerMetrics::new(&reg), &reg, &BTreeMap::new(), CancellationToken::new()))
}

fn add(d: &SessionDirectory, fake: &Arc<Fake>, hello: Option<(&str, &str)>) -> Arc<Session> {
    let opener: Arc<dyn Opener> = fake.clone();
    let hello = hello.map(|(node, instance)| AgentHello {
        node: node.into(),
        instance: instance.into(),
        ..AgentHello::default()
    });
    let hello = Arc::new(hello.map(std::sync::OnceLock::from).unwrap_or_default());
    let filed = Filed {
        peer: "peer".into(),
        transport: "h2",
        opener,
        hello,
        stop: CancellationToken::new(),
        identity: Default::default(),
    };
    d.add("a", filed).expect("not fenced")
}

const TIMES: DialTimes = DialTimes { dial: Duration::from_secs(10), open: Duration::from_secs(2) };

async fn dial(d: &SessionDirectory) -> Result<Dialed, DialRefusal> {
    d.dial("a", "10.0.0.1:443", TIMES, &[ProxyStrategy::Default]).await
}

fn count(v: &proxy_core::prometheus::IntCounterVec, labels: &[&str]) -> u64 {
    v.with_label_values(labels).get()
}

#[tokio::test(start_paused = true)]
async fn a_silent_session_is_suspected_and_the_dial_moves_to_another() {
    let d = directory();
    // p2c prefers the idle silent session; the live one looks busy.
    let (silent, live) = (Fake::new(Agent::Silent, 0), Fake::new(Agent::Answers, 9));
    let (s, _) = (add(&d, &silent, None), add(&d, &live, None));
    let started = tokio::time::Instant::now();
    assert!(dial(&d).await.is_ok());
    assert_eq!((silent.opens(), live.opens()), (1, 1));
    assert_eq!(started.elapsed(), TIMES.open, "moved on after agents.open_timeout, not the dial timeout");
    assert_eq!(s.standing(&d.metrics), Standing::Suspect);
    assert_eq!(count(&d.metrics.sessions_doubted, &["a", "silent"]), 1);
    assert_eq!(count(&d.metrics.dial_retries, &["a", "silent"]), 1);

    // While it stays silent, no dial tries it first, idle as it is.
    for _ in 0..20 {
        assert!(dial(&d).await.is_ok());
    }
    assert_eq!((silent.opens(), live.opens()), (1, 21));
    // Anything heard from it ends the doubt.
    silent.heard.fetch_add(1, Ordering::Relaxed);
    // The admin pages' look sees it and changes nothing: the dial that asks next counts it.
    assert_eq!((s.looked_at(), s.shown(crate::registry::ClusterMode::Active)), (Standing::Healthy, ("active", None)));
    assert_eq!(count(&d.metrics.sessions_revived, &["a", "silent"]), 0);
    assert_eq!(s.standing(&d.metrics), Standing::Healthy);
    assert_eq!(count(&d.metrics.sessions_revived, &["a", "silent"]), 1);
}

/// A dial sent on a session whose path then goes quiet (its keepalive unanswered) is not
/// refused: it moves to another live session of the cluster at once, and is counted as served
/// around a suspect session.
#[tokio::test(start_paused = true)]
async fn a_dial_whose_session_turns_suspect_meanwhile_is_served_by_another() {
    let d = directory();
    // p2c prefers the idle session that is about to go quiet.
    let (quiet, live) = (Fake::new(Agent::Silent, 0), Fake::new(Agent::Answers, 9));
    let (_s, _) = (add(&d, &quiet, None), add(&d, &live, None));
    let turns = Duration::from_millis(700);
    turns_quiet(&quiet, turns);
    let started = tokio::time::Instant::now();
    assert!(dial(&d).await.is_ok());
    assert_eq!((quiet.opens(), live.opens()), (1, 1));
    assert_eq!(started.elapsed(), turns, "moved on when the session turned suspect, not at the open timeout");
    assert_eq!(count(&d.metrics.dial_retries, &["a", "suspect"]), 1);
    assert_eq!(count(&d.metrics.dial_retries, &["a", "silent"]), 0);
    assert_eq!(count(&d.metrics.dials_around_suspect, &["a"]), 1);
    // With no other session, a dial on the quiet one is refused at once, naming it.
    let d = directory();
    let alone = Fake::new(Agent::Silent, 0);
    add(&d, &alone, None);
    alone.quiet.set(true);
    let err = dial(&d).await.err().expect("refused");
    assert!(err.to_string().contains("suspect"), "{err}");
    assert_eq!(alone.opens(), 0, "a suspect session takes no new dial");
}

/// One direction of the path silent: the agent is heard (its own packets arrive), yet neither
/// the open nor its answer gets through, and the session turns suspect. The dial does not wait
/// for the agent's "slow dial" to the dial timeout: it moves on, or is refused, then.
#[tokio::test(start_paused = true)]
async fn a_heard_agent_whose_session_turns_suspect_does_not_hold_the_dial() {
    let d = directory();
    let (heard, live) = (Fake::new(Agent::Slow(Duration::from_secs(8)), 0), Fake::new(Agent::Answers, 9));
    let (_s, _) = (add(&d, &heard, None), add(&d, &live, None));
    let turns = Duration::from_secs(3);
    turns_quiet(&heard, turns);
    let started = tokio::time::Instant::now();
    assert!(dial(&d).await.is_ok());
    assert_eq!((heard.opens(), live.opens()), (1, 1));
    assert_eq!(started.elapsed(), turns, "moved on when the session turned suspect, not when the agent answered");
    assert_eq!(count(&d.metrics.dial_retries, &["a", "suspect"]), 1);
    // Alone, it is refused then.
    let d = directory();
    let alone = Fake::new(Agent::Slow(Duration::from_secs(8)), 0);
    add(&d, &alone, None);
    turns_quiet(&alone, turns);
    let started = tokio::time::Instant::now();
    let err = dial(&d).await.err().expect("refused");
    assert!(err.to_string().contains("suspect"), "{err}");
    assert_eq!(started.elapsed(), turns);
}

#[tokio::test(start_paused = true)]
async fn a_live_agent_slow_to_reach_its_target_gets_the_whole_dial_timeout() {
    // Any transport: any sign of life, or a PING behind the open answered (HTTP/2).
    for fake in [Fake::new, Fake::h2] {
        let d = directory();
        let (slow, other) = (fake(Agent::Slow(Duration::from_secs(7)), 0), fake(Agent::Answers, 9));
        let (s, _) = (add(&d, &slow, None), add(&d, &other, None));
        let started = tokio::time::Instant::now();
        assert!(dial(&d).await.is_ok());
        assert_eq!(started.elapsed(), Duration::from_secs(7));
        assert_eq!((slow.opens(), other.opens()), (1, 0), "it answered the probe: not abandoned");
        assert_eq!(s.standing(&d.metrics), Standing::Healthy);
        assert_eq!(count(&d.metrics.sessions_doubted, &["a", "silent"]), 0);
        // Alone too.
        let d = directory();
        let alone = fake(Agent::Slow(Duration::from_secs(7)), 0);
        add(&d, &alone, None);
        let started = tokio::time::Instant::now();
        assert!(dial(&d).await.is_ok());
        assert_eq!(started.elapsed(), Duration::from_secs(7));
    }
}

/// A flapping path over HTTP/2: the agent's own PINGs get through now and then, so it is heard,
/// but the open was lost and waits in the session's TCP, behind a retransmission back-off that
/// can outlast the next moment the path is up, and so does every PING sent behind it. Being heard
/// does not hold the dial: without an answered PING sent after the open, it moves on at the open
/// timeout, or, on the only session, is refused then with the reason.
#[tokio::test(start_paused = true)]
async fn an_h2_open_stalled_on_a_path_that_still_carries_the_agents_pings_moves_on_at_the_open_timeout() {
    let d = directory();
    // p2c prefers the idle stalled session.
    let (stalled, live) = (Fake::h2(Agent::Stalled, 0), Fake::h2(Agent::Answers, 9));
    let (s, _) = (add(&d, &stalled, None), add(&d, &live, None));
    let heard = stalled.heard.load(Ordering::Relaxed);
    let started = tokio::time::Instant::now();
    assert!(dial(&d).await.is_ok());
    assert!(stalled.heard.load(Ordering::Relaxed) > heard, "the agent was heard meanwhile");
    assert_eq!((stalled.opens(), live.opens()), (1, 1));
    assert_eq!(started.elapsed(), TIMES.open, "moved on at agents.open_timeout, not the dial timeout");
    assert_eq!(count(&d.metrics.dial_retries, &["a", "silent"]), 1);
    drop(s);

    // Alone: refused at the open timeout, naming the stalled path; not held to the dial timeout.
    let d = directory();
    let alone = Fake::h2(Agent::Stalled, 0);
    add(&d, &alone, None);
    let started = tokio::time::Instant::now();
    let err = dial(&d).await.err().expect("refused");
    assert_eq!((started.elapsed(), alone.opens()), (TIMES.open, 1));
    assert_eq!(err.http_status(), 503);
    assert!(err.to_string().contains("stalled") && err.to_string().contains("suspect"), "{err}");

    // Two sessions over the same flapping path (the agent's replacement beside the first): the
    // second has a quarter of the open timeout to show it got the open, so the dial is answered
    // within one and a quarter open timeouts, not two.
    let d = directory();
    let (first, second) = (Fake::h2(Agent::Stalled, 0), Fake::h2(Agent::Stalled, 9));
    let (_a, _b) = (add(&d, &first, None), add(&d, &second, None));
    let started = tokio::time::Instant::now();
    let err = dial(&d).await.err().expect("refused");
    assert_eq!((first.opens(), second.opens()), (1, 1));
    assert_eq!(started.elapsed(), TIMES.open + TIMES.open / 4);
    assert!(err.to_string().contains("stalled"), "{err}");
    // A live second session still takes it in that quarter.
    let d = directory();
    let (first, second) = (Fake::h2(Agent::Stalled, 0), Fake::h2(Agent::Slow(Duration::from_secs(3)), 9));
    let (_a, _b) = (add(&d, &first, None), add(&d, &second, None));
    let started = tokio::time::Instant::now();
    assert!(dial(&d).await.is_ok());
    assert_eq!(started.elapsed(), TIMES.open + Duration::from_secs(3), "slow, but it answered its PINGs");
}

/// The open got through (a PING behind it was answered) and the agent's own dial takes its
/// time; then the path stalls, and with it the agent's answer. The dial gives up once no PING
/// sent within the open timeout has been answered, not at the dial timeout.
#[tokio::test(start_paused = true)]
async fn an_h2_dial_whose_path_stalls_after_the_open_got_through_is_given_up_at_the_open_timeout() {
    let d = directory();
    let slow = Fake::h2(Agent::Slow(Duration::from_secs(7)), 0);
    add(&d, &slow, None);
    let f = slow.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        f.stalls.store(true, Ordering::Relaxed);
    });
    let started = tokio::time::Instant::now();
    let err = dial(&d).await.err().expect("refused");
    // PINGs go out every quarter of the open timeout (500ms): the last one answered went out at
    // 1s; 2s later the session is stalled for the dial.
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert!(err.to_string().contains("stalled"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn with_no_other_session_a_silent_one_is_waited_for_until_another_comes() {
    let d = directory();
    let silent = Fake::new(Agent::Silent, 0);
    add(&d, &silent, None);
    let dialing = tokio::spawn({
        let d = d.clone();
        async move { dial(&d).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert!(!dialing.is_finished(), "the only session: nothing better to do than wait");
    // The restarted agent's session comes up: the dial takes it at its next look.
    let live = Fake::new(Agent::Answers, 0);
    add(&d, &live, None);
    assert!(dialing.await.expect("dial task").is_ok());
    assert_eq!((silent.opens(), live.opens()), (1, 1));

    // Alone and silent to the end: the dial times out at its deadline (one open, no spin).
    let d = directory();
    let silent = Fake::new(Agent::Silent, 0);
    add(&d, &silent, None);
    let started = tokio::time::Instant::now();
    let e = dial(&d).await.err().expect("no answer");
    assert_eq!((e.code(), started.elapsed(), silent.opens()), ("dial_timeout", TIMES.dial, 1));
}

#[tokio::test(start_paused = true)]
async fn a_new_run_of_a_node_supersedes_its_earlier_sessions() {
    let d = directory();
    let (old, other_node, new) =
        (Fake::new(Agent::Silent, 0), Fake::new(Agent::Answers, 5), Fake::new(Agent::Answers, 5));
    let old_s = add(&d, &old, Some(("n1", "run-1")));
    let other_s = add(&d, &other_node, Some(("n2", "run-7")));
    let new_s = add(&d, &new, Some(("n1", "run-2")));
    d.file_hellos("a");
    assert_eq!(old_s.standing(&d.metrics), Standing::Superseded);
    assert_eq!(other_s.standing(&d.metrics), Standing::Healthy, "another node is not touched");
    assert_eq!(new_s.standing(&d.metrics), Standing::Healthy, "the earlier run never supersedes the later");
    assert_eq!(count(&d.metrics.sessions_doubted, &["a", "superseded"]), 1);

    for _ in 0..20 {
        assert!(dial(&d).await.is_ok());
    }
    assert_eq!(old.opens(), 0, "no dial went to the dead session, idle as it looks");
    assert_eq!(other_node.opens() + new.opens(), 20);
    assert_eq!(count(&d.metrics.dial_retries, &["a", "silent"]), 0);
    assert!(!old_s.stop.is_cancelled(), "superseding cuts nothing");

    // A second live agent with the same node name: the superseded session shows life and is
    // trusted again.
    old.heard.fetch_add(1, Ordering::Relaxed);
    assert_eq!(old_s.standing(&d.metrics), Standing::Healthy);
    assert_eq!(count(&d.metrics.sessions_revived, &["a", "superseded"]), 1);
}

/// The last two sessions of a cluster end at the same moment on two threads (every agent of a
/// moved cluster leaves at once): `seedgate_agents_connected` must end at 0, whichever thread's
/// update lands last. Repeated, as the interleaving that loses an update is a matter of timing.
#[test]
fn the_connected_gauge_ends_at_zero_when_the_last_sessions_leave_together() {
    let d = directory();
    let fake = Fake::new(Agent::Answers, 0);
    let gauge = d.metrics.agents.with_label_values(&["a"]);
    let rounds = 50_000;
    let start = Arc::new(std::sync::Barrier::new(3));
    let sessions: Arc<Mutex<Vec<Arc<Session>>>> = Arc::default();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (d, start, sessions) = (d.clone(), start.clone(), sessions.clone());
            std::thread::spawn(move || {
                // Bounded: one removal per round, `rounds` rounds.
                for _ in 0..rounds {
                    start.wait();
                    let s = sessions.lock().pop().expect("one session per thread");
                    d.remove(&s);
                    start.wait();
                }
            })
        })
        .collect();
    let mut stale = 0;
    for _ in 0..rounds {
        let pair = [add(&d, &fake, None), add(&d, &fake, None)];
        assert_eq!(gauge.get(), 2);
        sessions.lock().extend(pair);
        start.wait();
        start.wait();
        assert_eq!(d.sessions("a").len(), 0);
        if gauge.get() != 0 {
            stale += 1;
            gauge.set(0);
        }
    }
    for t in threads {
        t.join().expect("no panic");
    }
    assert_eq!(stale, 0, "the gauge kept a count of sessions that had left, in {stale} of {rounds} rounds");
}
