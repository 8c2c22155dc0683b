//! faults: the reverse tunnel through faults on the seed–shoot path (black holes, one direction silent, a flapping link, one of two paths black), what each cost an open stream and the dials made meanwhile, beside direct TCP's open stream.
//!
//! Each fault gets fresh network namespaces joined by the testbed's link emulator (25 ms each
//! way, no rate limit), proxy-server in this process in the seed namespace and proxy-agent in
//! the shoot's (`testbed::faults`), the products' default keepalive (suspect after 3 s, dead
//! after 60 s). Before the fault a stream is opened through the tunnel to an echo target in the
//! shoot (and, during the h2 pass, a direct TCP connection to it across the same link); during
//! the fault dials are made through the front end, each an echo round trip with a client
//! timeout of 4 s; after the heal, side by side, dials until one is served and a round trip on
//! the open stream (and on the direct connection). What counts is the outcome of each dial
//! (served, refused with a reason, no answer), how many waited more than 3 s, and how long after
//! the heal the first dial was served and the open stream carried bytes again.
//!
//! Faults: black holes both ways of 5, 12, 20 and 30 s (a dial a second); only seed → shoot
//! dropped for 20 s; a link that flaps (1 s down, 1 s up) for a minute (a dial every 250 ms);
//! two replicas behind sni-router listening on two paths, the agent listing the gateway once per
//! path, path 2 black for 30 s (a dial every 250 ms, alternating between the replicas' front
//! ends). The smoke run: a 4 s black hole and the two paths with 4 s of black, each transport.

use super::{Ctx, record};
use crate::report::{
    self, Answer, Better, FigureId, Kind, Mark, MetricId, Moment, Read, Request, Results, Timeline, at, fmt_num,
};
use std::time::Duration;
use testbed::faults::{Dialled, Outcome, Rig, RigOpts, dial, roundtrip};
use testbed::link::{Dir, LinkOpts, Shape, Wan};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

pub(crate) const SC: &str = "faults";
/// The subnets of the two paths (10.94.0.0/30, 10.93.0.0/30), in the scenario's namespaces.
const NET: u8 = 94;
const NET2: u8 = 93;

const H2: &str = "proxy-server + proxy-agent (h2)";
const QUIC: &str = "proxy-server + proxy-agent (quic)";
const DIRECT: &str = "direct TCP";

/// A client's patience with one dial.
const CLIENT_WAIT: Duration = Duration::from_secs(4);
/// A dial that took longer than this to be served or refused waited too long.
const TOO_LONG: Duration = Duration::from_secs(3);
/// The most the open stream may take to carry bytes after the heal, and the first good dial to
/// come.
const AFTER: Duration = Duration::from_secs(40);

/// The figures, each per fault (the fault's name is the parameter).
const F_STREAM: &str = "open stream carries bytes after it";
const F_RESUME: &str = "open stream's first round trip after the heal";
const F_DIALS: &str = "dials during it";
const F_SERVED: &str = "dials served";
const F_REFUSED: &str = "dials refused with a reason";
const F_UNANSWERED: &str = "dials unanswered (client timeout) or failed";
const F_WAITED: &str = "dials that waited > 3 s";
const F_MAX_WAIT: &str = "longest dial";
const F_HEAL: &str = "first good dial after the heal";
const F_LATE_FAILED: &str = "dials not served after the first 3 s";

fn fig(f: &'static str) -> FigureId {
    FigureId::new(SC, f)
}

/// One fault on the path.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// Both directions dropped for this many seconds.
    Hole(u64),
    /// Only seed → shoot dropped.
    OneWay(u64),
    /// Down 1 s, up 1 s, for this many seconds.
    Flap(u64),
    /// Two replicas over two paths; path 2 dropped both ways.
    TwoPaths(u64),
}

impl Fault {
    fn name(self) -> String {
        match self {
            Fault::Hole(s) => format!("black hole {s} s"),
            Fault::OneWay(s) => format!("seed → shoot silent {s} s"),
            Fault::Flap(s) => format!("flapping {s} s (1 s down, 1 s up)"),
            Fault::TwoPaths(s) => format!("two replicas, path 2 black {s} s"),
        }
    }

    fn secs(self) -> u64 {
        match self {
            Fault::Hole(s) | Fault::OneWay(s) | Fault::Flap(s) | Fault::TwoPaths(s) => s,
        }
    }

    /// Time between dials during it.
    fn dial_every(self) -> Duration {
        match self {
            Fault::Hole(_) | Fault::OneWay(_) => Duration::from_secs(1),
            Fault::Flap(_) | Fault::TwoPaths(_) => Duration::from_millis(250),
        }
    }

    fn figures(self) -> &'static [&'static str] {
        match self {
            Fault::TwoPaths(_) => &[F_STREAM, F_DIALS, F_SERVED, F_LATE_FAILED, F_WAITED, F_MAX_WAIT],
            _ => &[F_STREAM, F_RESUME, F_DIALS, F_SERVED, F_REFUSED, F_UNANSWERED, F_WAITED, F_MAX_WAIT, F_HEAL],
        }
    }
}

fn unit_of(f: &str) -> (&'static str, Better) {
    match f {
        F_STREAM => ("yes = 1", Better::Higher),
        F_DIALS => ("dials", Better::Higher),
        F_SERVED => ("dials", Better::Higher),
        F_MAX_WAIT | F_HEAL | F_RESUME => ("s", Better::Lower),
        _ => ("dials", Better::Lower),
    }
}

fn faults(smoke: bool) -> Vec<Fault> {
    if smoke {
        return vec![Fault::Hole(4), Fault::TwoPaths(4)];
    }
    vec![
        Fault::Hole(5),
        Fault::Hole(12),
        Fault::Hole(20),
        Fault::Hole(30),
        Fault::OneWay(20),
        Fault::Flap(60),
        Fault::TwoPaths(30),
    ]
}

/// What one fault did.
struct Seen {
    /// From the heal to the end of the open stream's first round trip through the tunnel
    /// (`None`: not within [`AFTER`]).
    resumed: Option<Duration>,
    /// The same of a direct TCP connection across the link (the h2 pass only).
    direct: Option<Option<Duration>>,
    /// Each dial made during it, with when it was made (from the fault's start).
    dials: Vec<(Duration, Dialled)>,
    /// From the heal to the first served dial (`None`: none within [`AFTER`]).
    heal: Option<Duration>,
    /// From the fault's start to the heal.
    healed: Duration,
    /// When the path was down (from the fault's start): one span, or one per down phase.
    down: Vec<(Duration, Duration)>,
}

/// The figure's value from what was seen (`None`: not a figure of this fault or system).
fn value(f: &str, seen: &Seen) -> Option<f64> {
    let count = |p: &dyn Fn(&Duration, &Dialled) -> bool| seen.dials.iter().filter(|(at, d)| p(at, d)).count() as f64;
    Some(match f {
        F_STREAM => f64::from(u8::from(seen.resumed.is_some())),
        F_RESUME => seen.resumed?.as_secs_f64(),
        F_DIALS => seen.dials.len() as f64,
        F_SERVED => count(&|_, d| d.outcome == Outcome::Served),
        F_REFUSED => count(&|_, d| matches!(d.outcome, Outcome::Refused(..))),
        F_UNANSWERED => count(&|_, d| matches!(d.outcome, Outcome::NoAnswer | Outcome::Failed(_))),
        F_WAITED => count(&|_, d| d.waited() > TOO_LONG),
        F_MAX_WAIT => seen.dials.iter().map(|(_, d)| d.waited().as_secs_f64()).fold(0.0, f64::max),
        F_HEAL => seen.heal?.as_secs_f64(),
        F_LATE_FAILED => count(&|at, d| *at >= TOO_LONG && d.outcome != Outcome::Served),
        _ => return None,
    })
}

/// The dials that took longer than [`TOO_LONG`] with their echo: when each was made, what came
/// of it and when (the first five), to tell a slow answer from a slow echo after it.
fn slow_dials(seen: &Seen) -> Option<String> {
    let slow: Vec<String> = (seen.dials.iter().filter(|(_, d)| d.took > TOO_LONG).take(5))
        .map(|(at, d)| {
            let what = match &d.outcome {
                Outcome::Served => "served".to_owned(),
                Outcome::Refused(code, _) => format!("refused {code}"),
                Outcome::NoAnswer => "unanswered".to_owned(),
                Outcome::Failed(_) => "failed".to_owned(),
            };
            let answer = d.answered.map(|a| format!(" (answered after {:.2} s)", a.as_secs_f64())).unwrap_or_default();
            format!("made at {:.2} s, {what} after {:.2} s{answer}", at.as_secs_f64(), d.took.as_secs_f64())
        })
        .collect();
    (!slow.is_empty()).then(|| slow.join("; "))
}

/// What `sys` went through during `fault`, over time: the chart of a fault draws it.
fn timeline(fault: Fault, sys: &str, seen: &Seen) -> Timeline {
    let s = |d: Duration| d.as_secs_f64();
    let requests = (seen.dials.iter())
        .map(|(at, d)| Request {
            at: s(*at),
            waited: s(d.waited()),
            outcome: match d.outcome {
                Outcome::Served => Answer::Served,
                Outcome::Refused(..) => Answer::Refused,
                Outcome::NoAnswer | Outcome::Failed(_) => Answer::Unanswered,
            },
        })
        .collect();
    let after_heal = [
        (Some(Duration::ZERO), Moment::Healed),
        (seen.resumed, Moment::StreamResumed),
        (seen.heal, Moment::FirstServed),
    ];
    Timeline {
        scenario: SC.to_owned(),
        name: fault.name(),
        system: sys.to_owned(),
        kind: Kind::Seedgate,
        down: seen.down.iter().map(|&(a, b)| (s(a), s(b))).collect(),
        requests,
        marks: (after_heal.into_iter()).filter_map(|(t, what)| Some(Mark { at: s(seen.healed + t?), what })).collect(),
    }
}

/// Figure `f` of `fault`.
fn metric(res: &mut Results, fault: Fault, f: &'static str) -> MetricId {
    let n = fault.name();
    let (unit, better) = unit_of(f);
    res.figure_at(fig(f), &n, &format!("{n}: {f}"), unit, better)
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let mut faults = faults(ctx.smoke);
    if let Some(only) = &ctx.scale.fault {
        faults.retain(|f| f.name().contains(only.as_str()));
    }
    if let Some(why) = super::wan::unavailable() {
        for &fault in &faults {
            for &f in fault.figures() {
                let m = metric(res, fault, f);
                for sys in [H2, QUIC] {
                    res.skip(m, sys, Kind::Seedgate, why);
                }
            }
        }
        return Ok(());
    }
    res.remark(
        SC,
        "link: 25 ms each way, no rate limit, fresh namespaces per fault and transport; proxy-server in the bench's \
         process (seed namespace), proxy-agent a process (shoot namespace); default keepalive (suspect after 3 s, \
         dead after 60 s); dials: CONNECT + a 4-byte echo round trip, client timeout 4 s; `dials that waited > 3 s` \
         counts every dial whose answer (the CONNECT's 200, a refusal, or none) took longer, and `longest dial` is \
         the longest such wait: the echo after a 200 is the new stream's bytes crossing the link, and a dial whose \
         echo made it take longer than 3 s is listed under the table; direct TCP: a connection across the \
         same link during the h2 pass (only the open-stream figures)",
    );
    for &fault in &faults {
        for (sys, quic) in [(H2, false), (QUIC, true)] {
            eprintln!("bench: faults, {} over {sys}", fault.name());
            let seen = observe(ctx, fault, quic).await;
            for &f in fault.figures() {
                let m = metric(res, fault, f);
                let r = seen.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"));
                match r.map(|s| value(f, s)) {
                    Ok(Some(v)) => record(res, m, sys, Kind::Seedgate, Ok(v)),
                    Ok(None) => res.note(m, sys, Kind::Seedgate, &format!("none within {} s", AFTER.as_secs())),
                    Err(e) => record(res, m, sys, Kind::Seedgate, Err(e)),
                }
            }
            if let Ok(seen) = &seen
                && let Some(slow) = slow_dials(seen)
            {
                let m = metric(res, fault, F_WAITED);
                res.note_split(m, sys, Kind::Seedgate, &slow);
            }
            if let Ok(seen) = &seen {
                res.timelines.push(timeline(fault, sys, seen));
            }
            if let Ok(Seen { direct: Some(resumed), .. }) = &seen {
                let m = metric(res, fault, F_STREAM);
                record(res, m, DIRECT, Kind::Direct, Ok(f64::from(u8::from(resumed.is_some()))));
                if fault.figures().contains(&F_RESUME) {
                    let m = metric(res, fault, F_RESUME);
                    match resumed {
                        Some(t) => record(res, m, DIRECT, Kind::Direct, Ok(t.as_secs_f64())),
                        None => res.note(m, DIRECT, Kind::Direct, &format!("none within {} s", AFTER.as_secs())),
                    }
                }
            }
        }
    }
    Ok(())
}

/// When the path was down: the phases so far, and when the one under way began.
#[derive(Debug, Default)]
struct DownSpans {
    spans: Vec<(Duration, Duration)>,
    since: Option<Duration>,
}

impl DownSpans {
    /// The path is `down` (or up) from `at` on.
    fn set(&mut self, down: bool, at: Duration) {
        match (down, self.since) {
            (true, None) => self.since = Some(at),
            (false, Some(from)) => {
                self.spans.push((from, at));
                self.since = None;
            }
            _ => {}
        }
    }

    /// The phases, the one under way ending at the heal, `at`.
    fn end(mut self, at: Duration) -> Vec<(Duration, Duration)> {
        self.set(false, at);
        self.spans
    }
}

/// A plain TCP connection across the link to the echo target, one round trip done.
async fn direct_stream(rig: &Rig) -> anyhow::Result<tokio::net::TcpStream> {
    let mut s = tokio::net::TcpStream::connect(rig.echo.addr()).await?;
    s.write_all(b"x").await?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await?;
    Ok(s)
}

/// Set up, open the streams, bring the fault, dial throughout, heal, look.
async fn observe(ctx: &Ctx, fault: Fault, quic: bool) -> anyhow::Result<Seen> {
    let shape = Shape { delay: Duration::from_millis(25), ..Shape::CLEAR };
    let mut wan = Wan::new("bench-faults", NET, shape, LinkOpts { realtime: true, ..LinkOpts::default() })?;
    if matches!(fault, Fault::TwoPaths(_)) {
        wan.add_path(NET2, shape, LinkOpts { realtime: true, ..LinkOpts::default() })?;
    }
    let _in_seed = wan.seed().enter()?;
    let o = RigOpts { quic, keepalive: None, agent_bin: Some(ctx.bins.agent.clone()) };
    let (rig, path) = match fault {
        Fault::TwoPaths(_) => (Rig::two_replicas(&wan, "bench-faults", &o).await?, 1),
        _ => (Rig::one(&wan, "bench-faults", &o).await?, 0),
    };
    let link = wan.path(path).expect("made above");
    let mut open = rig.open_stream(0).await?;
    // Direct TCP beside the h2 pass, on the path that goes black.
    let mut direct = if quic || path > 0 { None } else { Some(direct_stream(&rig).await?) };
    let dirs = if matches!(fault, Fault::OneWay(_)) { &[Dir::ToShoot][..] } else { Dir::BOTH };

    let every = fault.dial_every();
    let n = Duration::from_secs(fault.secs()).as_millis() / every.as_millis();
    let started = Instant::now();
    let mut dials = Vec::new();
    let mut spans = DownSpans::default();
    for i in 0..n as u32 {
        let down = match fault {
            // Down for the first second, up for the next, and so on.
            Fault::Flap(_) => started.elapsed().as_secs().is_multiple_of(2),
            _ => true,
        };
        link.black_hole(dirs, down);
        spans.set(down, started.elapsed());
        let front = rig.fronts[i as usize % rig.fronts.len()].clone();
        dials.push((started.elapsed(), tokio::spawn(dial(front, rig.echo.addr(), CLIENT_WAIT))));
        tokio::time::sleep_until(started + every * (i + 1)).await;
    }
    link.black_hole(dirs, false);
    // From the heal, at once and side by side: dials until one is served, a round trip on the
    // open stream, and one on the direct connection.
    let healed = Instant::now();
    let down = spans.end(healed - started);
    let first_served = async {
        while healed.elapsed() <= AFTER {
            let d = dial(rig.fronts[0].clone(), rig.echo.addr(), CLIENT_WAIT).await;
            if d.outcome == Outcome::Served {
                return Some(healed.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    };
    let resumed = async {
        let r = tokio::time::timeout(AFTER, roundtrip(&mut open, b"after")).await;
        matches!(r, Ok(Ok(()))).then(|| healed.elapsed())
    };
    let direct_resumed = async {
        let s = direct.as_mut()?;
        let r = tokio::time::timeout(AFTER, async {
            s.write_all(b"y").await?;
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await
        })
        .await;
        Some(r.is_ok_and(|r| r.is_ok()).then(|| healed.elapsed()))
    };
    let (heal, resumed, direct) = tokio::join!(first_served, resumed, direct_resumed);
    let mut done = Vec::new();
    for (at, t) in dials {
        done.push((at, t.await?));
    }
    Ok(Seen { resumed, direct, dials: done, heal, healed: healed - started, down })
}

/// The targets: per fault recorded, over h2 and QUIC.
pub(super) fn targets(t: &mut report::Targets<'_>) {
    let names: Vec<String> = t.res.params(fig(F_STREAM)).into_iter().map(str::to_owned).collect();
    if names.is_empty() {
        t.not_evaluated("faults figures", &[Read::Missing(format!("figure {SC}/{F_STREAM} not recorded"))]);
    }
    for name in &names {
        let n = name.as_str();
        let secs = n.split(' ').find_map(|w| w.parse::<u64>().ok()).unwrap_or(0);
        for (sys, short) in [(H2, "h2"), (QUIC, "QUIC")] {
            let q = |f: &'static str| at(fig(f), n, sys);
            let zero = |v: f64| v == 0.0;
            if n.starts_with("two replicas") {
                t.value(&format!("{n}: {short} no dial fails after the first 3 s"), q(F_LATE_FAILED), fmt_num, zero);
                continue;
            }
            // A quiet session probes at least once per PING interval (1 s by default; over h2 where
            // the kernel has TCP_RTO_MAX_MS, Linux 6.15 and later).
            t.value(
                &format!("{n}: {short} open stream carries bytes within 2 s of the heal"),
                q(F_RESUME),
                |v| format!("{v:.2} s"),
                |v| v <= 2.0,
            );
            if n.starts_with("flapping") {
                t.value(&format!("{n}: {short} no open stream lost"), q(F_STREAM), fmt_num, |v| v == 1.0);
                t.value(&format!("{n}: {short} every dial answered"), q(F_UNANSWERED), fmt_num, zero);
                t.value(
                    &format!("{n}: {short} no dial waits > 3 s"),
                    q(F_MAX_WAIT),
                    |v| format!("{v:.1} s"),
                    |v| v <= TOO_LONG.as_secs_f64(),
                );
                continue;
            }
            if secs <= 20 {
                t.value(&format!("{n}: {short} open stream survives"), q(F_STREAM), fmt_num, |v| v == 1.0);
            }
            t.value(&format!("{n}: {short} at most one dial waits > 3 s"), q(F_WAITED), fmt_num, |v| v <= 1.0);
            t.value(
                &format!("{n}: {short} a dial served within 1 s of the heal"),
                q(F_HEAL),
                |v| format!("{v:.2} s"),
                |v| v <= 1.0,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_down_phases_are_the_spans_between_a_dial_that_took_the_path_down_and_one_that_brought_it_up() {
        let s = Duration::from_secs_f64;
        let mut spans = DownSpans::default();
        for (down, at) in [(true, 0.0), (true, 0.25), (false, 1.0), (false, 1.5), (true, 2.0), (true, 2.75)] {
            spans.set(down, s(at));
        }
        assert_eq!(spans.end(s(3.1)), [(s(0.0), s(1.0)), (s(2.0), s(3.1))]);
        assert_eq!(DownSpans::default().end(s(5.0)), [], "never down");
    }

    #[test]
    fn a_timeline_has_every_dial_with_its_wait_and_the_moments_after_the_heal() {
        let s = Duration::from_secs_f64;
        let dial = |outcome, took, answered: Option<f64>| Dialled { outcome, took: s(took), answered: answered.map(s) };
        let seen = Seen {
            resumed: None,
            direct: None,
            dials: vec![
                // Served: its wait is the CONNECT's answer, not the echo after it.
                (s(0.0), dial(Outcome::Served, 0.9, Some(0.1))),
                (s(0.25), dial(Outcome::Refused(503, "suspect".into()), 2.0, None)),
                (s(0.5), dial(Outcome::NoAnswer, 4.0, None)),
                (s(0.75), dial(Outcome::Failed("reset".into()), 0.01, None)),
            ],
            heal: Some(s(0.5)),
            healed: s(4.0),
            down: vec![(s(0.0), s(1.0)), (s(2.0), s(4.0))],
        };
        let t = timeline(Fault::Flap(4), H2, &seen);
        assert_eq!(
            (t.scenario.as_str(), t.name.as_str(), t.system.as_str()),
            (SC, "flapping 4 s (1 s down, 1 s up)", H2)
        );
        assert_eq!(t.down, [(0.0, 1.0), (2.0, 4.0)]);
        let got: Vec<(f64, f64, Answer)> = t.requests.iter().map(|r| (r.at, r.waited, r.outcome)).collect();
        assert_eq!(
            got,
            [
                (0.0, 0.1, Answer::Served),
                (0.25, 2.0, Answer::Refused),
                (0.5, 4.0, Answer::Unanswered),
                (0.75, 0.01, Answer::Unanswered)
            ]
        );
        // The open stream never came back: no mark for it.
        assert_eq!(t.marks, [Mark { at: 4.0, what: Moment::Healed }, Mark { at: 4.5, what: Moment::FirstServed }]);
    }
}
