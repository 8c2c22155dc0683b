//! soak: RSS, fds and tokio tasks of every seedgate process, sampled each second under minutes of mixed traffic at a fixed rate.
//!
//! The leak scenario's topology and connection mix ([`super::leak`]), offered open-loop at
//! `soak_rate` connections/s (at most 1,000 outstanding; starts beyond that are counted as
//! dropped) for `soak_minutes`. Each process is sampled once a second; the report gives the first
//! and last sample and the least-squares slope per minute over all of them (a steady process
//! shows a slope near zero; a leak, a steady climb). Not part of `all` unless `--soak-minutes`
//! is given.

use super::leak::{self, Sample, Topology, kind_of, mix, settle};
use super::{Ctx, record};
use crate::report::{Better, Kind, Results};
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

pub(super) const SC: &str = "soak";
/// Outstanding connections at most; starts beyond are dropped (and counted).
const MAX_OUTSTANDING: usize = 1000;

/// Least-squares slope of `y` over `t` (per unit of `t`); `None` with fewer than two points.
pub(super) fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let pts: Vec<&(f64, f64)> = points.iter().filter(|(t, y)| t.is_finite() && y.is_finite()).collect();
    if pts.len() < 2 {
        return None;
    }
    let n = pts.len() as f64;
    let (mt, my) = (pts.iter().map(|p| p.0).sum::<f64>() / n, pts.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = pts.iter().map(|p| (p.0 - mt).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mt) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let mut topo = Topology::start(ctx, SC).await?;
    let warm = mix(&topo.targets, 0, s.leak_warmup, s.leak_concurrency).await;
    settle(&topo.watched, s.settle_max).await;
    let duration = Duration::from_secs_f64(s.soak_minutes * 60.0);
    eprintln!(
        "  soak: warm-up of {} connections; {:.1} min at {} connections/s",
        warm.total(),
        s.soak_minutes,
        s.soak_rate
    );

    let t0 = Instant::now();
    let end = t0 + duration;
    // Sampling starts once the traffic is running: the in-flight connections (stalled ones hold
    // theirs for the handshake deadline) would otherwise show as a ramp from idle in the slope.
    let ramp = (duration / 10).clamp(Duration::from_secs(1), Duration::from_secs(10));
    // Samples: seconds since the start, one reading per process.
    let mut samples: Vec<(f64, Vec<Sample>)> = Vec::new();
    let sampler = async {
        let mut next = t0 + ramp;
        // One reading a second until the end.
        while next <= end {
            tokio::time::sleep_until(next).await;
            let r = leak::sample_all(&topo.watched).await;
            samples.push((t0.elapsed().as_secs_f64(), r));
            next += Duration::from_secs(1);
        }
    };
    let targets = topo.targets.clone();
    let first = s.leak_warmup;
    let rate = s.soak_rate.max(0.1);
    let generator = async {
        let period = Duration::from_secs_f64(1.0 / rate);
        let mut tally = leak::Tally::default();
        let mut dropped = 0u64;
        let mut tasks = JoinSet::new();
        let (mut i, mut next) = (first, t0);
        // One start per period until the end: bounded by duration / period.
        while next < end {
            tokio::time::sleep_until(next).await;
            next += period;
            while let Some(j) = tasks.try_join_next() {
                if let Ok((p, e, r)) = j {
                    tally.add(p, e, &r);
                }
            }
            if tasks.len() >= MAX_OUTSTANDING {
                dropped += 1;
                continue;
            }
            let (p, e) = kind_of(i);
            i += 1;
            let t = targets.clone();
            tasks.spawn(async move { (p, e, t.run(p, e).await) });
        }
        // Every connection is bounded by its own timeout.
        while let Some(j) = tasks.join_next().await {
            if let Ok((p, e, r)) = j {
                tally.add(p, e, &r);
            }
        }
        (tally, dropped)
    };
    let ((tally, dropped), ()) = tokio::join!(generator, sampler);
    let took = t0.elapsed();
    eprintln!(
        "  soak: {} connections in {:.0} s ({dropped} starts dropped); {}",
        tally.total(),
        took.as_secs_f64(),
        tally.describe()
    );
    if let (Some((_, a)), Some((_, b))) = (samples.first(), samples.last()) {
        eprintln!("  soak: first sample: {}", leak::describe(&topo.watched, a));
        eprintln!("  soak: last sample:  {}", leak::describe(&topo.watched, b));
    }
    let alive = topo.check_alive();

    for f in leak::FIGURES {
        let m_start = res.metric(SC, &format!("{} at start", f.name), f.unit, Better::Lower);
        let m_end = res.metric(SC, &format!("{} at end", f.name), f.unit, Better::Lower);
        let slope_unit = format!("{}/min", f.change_unit);
        let m_slope = res.metric(SC, &format!("{}, least-squares slope", f.name), &slope_unit, Better::Lower);
        for (i, w) in topo.watched.iter().enumerate() {
            // Minutes since the start, value.
            let series: Vec<(f64, f64)> =
                samples.iter().filter_map(|(t, r)| (f.get)(&r[i]).map(|v| (*t / 60.0, v))).collect();
            let one = |v: Option<f64>| -> anyhow::Result<f64> {
                if let Err(e) = &alive {
                    anyhow::bail!("{e:#}");
                }
                v.filter(|x| x.is_finite()).ok_or_else(|| anyhow::anyhow!("no samples"))
            };
            record(res, m_start, w.name, Kind::Seedgate, one(series.first().map(|p| p.1)));
            record(res, m_end, w.name, Kind::Seedgate, one(series.last().map(|p| p.1)));
            record(res, m_slope, w.name, Kind::Seedgate, one(slope(&series).map(|v| v * f.change_scale)));
        }
    }
    res.remark(
        SC,
        &format!(
            "{:.1} min at {} connections/s offered (open loop, at most {MAX_OUTSTANDING} outstanding; {dropped} starts dropped), after a warm-up of {} connections; {}",
            s.soak_minutes,
            s.soak_rate,
            warm.total(),
            leak::mix_remark()
        ),
    );
    res.remark(
        SC,
        &format!(
            "{} connections in {:.0} s; endings: {}; {} samples per process (one a second: /proc/<pid>/fd, VmRSS, \
             `seedgate_runtime_alive_tasks`) from {:.0} s after the start, when the traffic runs; slope = least squares over every \
             sample, per minute",
            tally.total(),
            took.as_secs_f64(),
            tally.describe(),
            samples.len(),
            ramp.as_secs_f64()
        ),
    );
    if let Some(first) = &tally.first_unexpected {
        res.remark(
            SC,
            &format!("{} connections went otherwise than expected; the first: {first}", tally.total_unexpected()),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::slope;

    #[test]
    fn least_squares_slope() {
        let line: Vec<(f64, f64)> = (0..10).map(|t| (t as f64, 3.0 * t as f64 + 7.0)).collect();
        assert!((slope(&line).unwrap() - 3.0).abs() < 1e-9);
        assert_eq!(slope(&[(1.0, 2.0)]), None);
        assert_eq!(slope(&[(1.0, 2.0), (1.0, 3.0)]), None);
        let flat: Vec<(f64, f64)> = (0..10).map(|t| (t as f64, if t % 2 == 0 { 5.0 } else { 6.0 })).collect();
        assert!(slope(&flat).unwrap().abs() < 0.1);
    }
}
