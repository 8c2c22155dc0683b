//! Results: the samples each scenario records, and their Markdown table, JSON file and SVG chart
//! (the README's small charts are drawn in [`crate::charts`]).

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Which way a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Better {
    Higher,
    Lower,
}

/// What a system is: the physical limit, ours, or an anchor we compare with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    Direct,
    Seedgate,
    Anchor,
}

/// One system's samples of one figure, or why it was skipped.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Row {
    pub system: String,
    pub kind: Kind,
    pub samples: Vec<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// Errors and other remarks seen while measuring (one line each, deduplicated).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Information about the figure that is not an error (e.g. memory by process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<String>,
}

impl Row {
    pub(crate) fn median(&self) -> Option<f64> {
        let mut v: Vec<f64> = self.samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
    }

    pub(crate) fn min_max(&self) -> Option<(f64, f64)> {
        let v = self.samples.iter().copied().filter(|x| x.is_finite());
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for x in v {
            lo = lo.min(x);
            hi = hi.max(x);
        }
        lo.is_finite().then_some((lo, hi))
    }
}

/// One figure of a scenario (e.g. "bulk, 64 streams" in Gbit/s) across systems.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Metric {
    pub scenario: String,
    pub name: String,
    pub unit: String,
    pub better: Better,
    pub rows: Vec<Row>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The figure's [`FigureId::key`], where it was recorded with one (targets find it by that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The figure's parameter beside its id (a stream count, a number of CPUs, a WAN profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// A figure's typed identity: the scenario that records it and the key its targets find it by.
/// The displayed name may change, carry a parameter or read differently in a smoke run; the id
/// does not, so a target cannot lose its figure to a rename (a figure no longer recorded under
/// its id is a missing target input, which fails the run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FigureId {
    pub scenario: &'static str,
    pub key: &'static str,
}

impl FigureId {
    pub(crate) const fn new(scenario: &'static str, key: &'static str) -> Self {
        Self { scenario, key }
    }
}

/// When and under what load one scenario ran (results can be merged from several runs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ScenarioRun {
    pub scenario: String,
    pub date_utc: String,
    pub loadavg_start: String,
    pub loadavg_end: String,
    pub repeats: usize,
    pub window_s: f64,
    pub smoke: bool,
    pub seconds: f64,
    /// The systems' `GLIBC_TUNABLES` (absent in runs from before the bench set it).
    #[serde(default)]
    pub glibc_tunables: Option<String>,
    /// Whether the scenario ran to its end (not when it failed with an error or was interrupted).
    #[serde(default = "yes")]
    pub completed: bool,
}

fn yes() -> bool {
    true
}

impl Metric {
    fn row(&self, kind: Kind) -> Option<&Row> {
        self.rows.iter().find(|r| r.kind == kind && r.median().is_some())
    }
}

/// Everything a run recorded, in the order it was recorded.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Results {
    pub metrics: Vec<Metric>,
    /// Scenario-level remarks (configs, caveats), by scenario.
    pub remarks: Vec<(String, String)>,
    /// Markdown a scenario adds under its table (a summary across its figures), by scenario.
    #[serde(default)]
    pub tables: Vec<(String, String)>,
    #[serde(default)]
    pub runs: Vec<ScenarioRun>,
    /// What happened over time (absent in results written before the bench kept any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timelines: Vec<Timeline>,
}

/// One system through one event over time (e.g. a fault on the path): when the path was down,
/// each request made meanwhile and what came of it, and the moments that mark the recovery.
/// Times are seconds from the event's start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Timeline {
    pub scenario: String,
    /// The event (a fault's name).
    pub name: String,
    pub system: String,
    pub kind: Kind,
    /// When the path was down: (from, to).
    pub down: Vec<(f64, f64)>,
    pub requests: Vec<Request>,
    pub marks: Vec<Mark>,
}

/// One request of a [`Timeline`]: when it was made, how long it waited for its answer, and what
/// the answer was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Request {
    pub at: f64,
    pub waited: f64,
    pub outcome: Answer,
}

/// What came of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Answer {
    Served,
    /// Refused with a reason.
    Refused,
    /// No answer within the client's patience, or the connection failed.
    Unanswered,
}

/// A moment of a [`Timeline`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Mark {
    pub at: f64,
    pub what: Moment,
}

/// What a [`Mark`] marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Moment {
    /// The path came back.
    Healed,
    /// A stream opened before the event carried bytes again.
    StreamResumed,
    /// The first request served after the heal.
    FirstServed,
}

/// A handle to a metric inside [`Results`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MetricId(pub(crate) usize);

impl Results {
    /// The metric `scenario`/`name`, created on first use.
    pub(crate) fn metric(&mut self, scenario: &str, name: &str, unit: &str, better: Better) -> MetricId {
        if let Some(i) = self.metrics.iter().position(|m| m.scenario == scenario && m.name == name) {
            return MetricId(i);
        }
        self.metrics.push(Metric {
            scenario: scenario.into(),
            name: name.into(),
            unit: unit.into(),
            better,
            rows: Vec::new(),
            note: None,
            id: None,
            at: None,
        });
        MetricId(self.metrics.len() - 1)
    }

    /// The figure `id`, named `name` in the table, created on first use.
    pub(crate) fn figure(&mut self, id: FigureId, name: &str, unit: &str, better: Better) -> MetricId {
        self.keyed(id, None, name, unit, better)
    }

    /// The figure `id` at parameter `at` (a stream count, CPUs, a profile), named `name`.
    pub(crate) fn figure_at(
        &mut self,
        id: FigureId,
        at: impl std::fmt::Display,
        name: &str,
        unit: &str,
        better: Better,
    ) -> MetricId {
        self.keyed(id, Some(at.to_string()), name, unit, better)
    }

    fn keyed(&mut self, id: FigureId, at: Option<String>, name: &str, unit: &str, better: Better) -> MetricId {
        let m = self.metric(id.scenario, name, unit, better);
        let metric = &mut self.metrics[m.0];
        metric.id = Some(id.key.to_owned());
        metric.at = at;
        m
    }

    /// The figure `id` (at `at`), if recorded.
    pub(crate) fn find(&self, id: FigureId, at: Option<&str>) -> Option<&Metric> {
        self.metrics
            .iter()
            .find(|m| m.scenario == id.scenario && m.id.as_deref() == Some(id.key) && m.at.as_deref() == at)
    }

    /// The parameters figure `id` was recorded at, in the order recorded.
    pub(crate) fn params(&self, id: FigureId) -> Vec<&str> {
        self.metrics
            .iter()
            .filter(|m| m.scenario == id.scenario && m.id.as_deref() == Some(id.key))
            .filter_map(|m| m.at.as_deref())
            .collect()
    }

    /// `scenario | name (unit)` of a metric, for progress lines.
    pub(crate) fn describe(&self, m: MetricId) -> String {
        let m = &self.metrics[m.0];
        format!("{} | {} ({})", m.scenario, m.name, m.unit)
    }

    fn row_mut(&mut self, m: MetricId, system: &str, kind: Kind) -> &mut Row {
        let rows = &mut self.metrics[m.0].rows;
        if let Some(i) = rows.iter().position(|r| r.system == system) {
            return &mut rows[i];
        }
        rows.push(Row {
            system: system.into(),
            kind,
            samples: Vec::new(),
            skipped: None,
            notes: Vec::new(),
            info: None,
        });
        rows.last_mut().expect("just pushed")
    }

    pub(crate) fn add(&mut self, m: MetricId, system: &str, kind: Kind, value: f64) {
        self.row_mut(m, system, kind).samples.push(value);
    }

    pub(crate) fn skip(&mut self, m: MetricId, system: &str, kind: Kind, reason: &str) {
        let r = self.row_mut(m, system, kind);
        if r.skipped.is_none() {
            r.skipped = Some(reason.into());
        }
    }

    pub(crate) fn note(&mut self, m: MetricId, system: &str, kind: Kind, note: &str) {
        let r = self.row_mut(m, system, kind);
        if !r.notes.iter().any(|n| n == note) && r.notes.len() < 5 {
            r.notes.push(note.into());
        }
    }

    /// Replace the row's informational split (one per row; not an error).
    pub(crate) fn note_split(&mut self, m: MetricId, system: &str, kind: Kind, text: &str) {
        let r = self.row_mut(m, system, kind);
        r.info = Some(text.into());
    }

    /// What failed on seedgate's side: a row whose system did not start (other than left out by
    /// `--only`) or whose measurement ended in an error. Each is a defect, whatever the figures
    /// (which are never asserted); one line each, without repeats.
    pub(crate) fn seedgate_failures(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for m in &self.metrics {
            for r in m.rows.iter().filter(|r| r.kind == Kind::Seedgate) {
                let what = match &r.skipped {
                    Some(why) if why.contains("filtered out") => continue,
                    Some(why) => format!("{}: {} did not start: {why}", m.scenario, r.system),
                    None => match r.notes.iter().find(|n| n.starts_with("error:")) {
                        Some(e) => format!("{} | {} | {}: {e}", m.scenario, m.name, r.system),
                        None => continue,
                    },
                };
                if !out.contains(&what) {
                    out.push(what);
                }
            }
        }
        out
    }

    pub(crate) fn remark(&mut self, scenario: &str, text: &str) {
        self.remarks.push((scenario.into(), text.into()));
    }

    /// Keep what `older` holds for scenarios this one does not have (a merge of runs), ordered
    /// by `order` (scenario names; unknown ones last).
    pub(crate) fn merge_older(&mut self, older: Results, order: &[&str]) {
        let mine = self.scenarios();
        let keep = |s: &String| !mine.contains(s);
        self.metrics.extend(older.metrics.into_iter().filter(|m| keep(&m.scenario)));
        self.remarks.extend(older.remarks.into_iter().filter(|(s, _)| keep(s)));
        self.tables.extend(older.tables.into_iter().filter(|(s, _)| keep(s)));
        self.runs.extend(older.runs.into_iter().filter(|r| keep(&r.scenario)));
        self.timelines.extend(older.timelines.into_iter().filter(|t| keep(&t.scenario)));
        let rank = |s: &str| order.iter().position(|o| *o == s).unwrap_or(order.len());
        self.metrics.sort_by_key(|m| rank(&m.scenario));
        self.remarks.sort_by_key(|(s, _)| rank(s));
        self.tables.sort_by_key(|(s, _)| rank(s));
        self.runs.sort_by_key(|r| rank(&r.scenario));
        self.timelines.sort_by_key(|t| rank(&t.scenario));
    }

    fn scenarios(&self) -> Vec<String> {
        let mut s: Vec<String> = Vec::new();
        for m in &self.metrics {
            if !s.contains(&m.scenario) {
                s.push(m.scenario.clone());
            }
        }
        s
    }
}

/// A number with about three significant digits and thousands separators for big ones.
pub(crate) fn fmt_num(x: f64) -> String {
    if !x.is_finite() {
        return "–".into();
    }
    let a = x.abs();
    if a < 1000.0 && x.fract() == 0.0 {
        return format!("{x:.0}");
    }
    if a >= 1000.0 {
        let n = x.round() as i64;
        let s = n.unsigned_abs().to_string();
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        if n < 0 {
            out.insert(0, '-');
        }
        out
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

fn ratio(x: f64) -> String {
    if !x.is_finite() {
        return "–".into();
    }
    // Two significant digits below 0.01 (a latency of milliseconds against one of seconds),
    // not a bare "0.00×".
    if x != 0.0 && x.abs() < 0.01 {
        let decimals = (-x.abs().log10()).ceil() as usize + 1;
        return format!("{x:.decimals$}×");
    }
    format!("{x:.2}×")
}

/// Latency-like units, where "vs direct" reads better as an added amount than as a ratio.
fn is_latency(unit: &str) -> bool {
    matches!(unit, "µs" | "ms" | "s")
}

/// The Markdown report: one table per scenario, each figure's rows with median, spread, the
/// ratio (or difference, for latencies) against direct, and seedgate's ratio to each system.
pub(crate) fn markdown(res: &Results, header: &str) -> String {
    let mut out = String::new();
    out.push_str(header);
    for sc in res.scenarios() {
        let _ = writeln!(out, "\n### {sc}\n");
        for r in res.runs.iter().filter(|r| r.scenario == sc) {
            let _ = writeln!(
                out,
                "- ran {}{}: {} repeat(s), {:.2} s windows, {:.0} s; load average {} at start, {} at end; {}",
                r.date_utc,
                if r.smoke { " (smoke)" } else { "" },
                r.repeats,
                r.window_s,
                r.seconds,
                r.loadavg_start,
                r.loadavg_end,
                match &r.glibc_tunables {
                    Some(t) => format!("systems with `GLIBC_TUNABLES={t}`"),
                    None => "no `GLIBC_TUNABLES`".into(),
                }
            );
        }
        for (_, text) in res.remarks.iter().filter(|(s, _)| *s == sc) {
            let _ = writeln!(out, "- {text}");
        }
        if res.remarks.iter().any(|(s, _)| *s == sc) {
            out.push('\n');
        }
        out.push_str("| figure | system | median | min–max | n | vs direct | seedgate ÷ this |\n");
        out.push_str("|---|---|---:|---:|---:|---:|---:|\n");
        // A system skipped as a whole is shown once (at its first figure), not in every figure.
        let mut shown_skips: Vec<&str> = Vec::new();
        for m in res.metrics.iter().filter(|m| m.scenario == sc) {
            let direct = m.row(Kind::Direct).and_then(Row::median);
            let ours = m.row(Kind::Seedgate).and_then(Row::median);
            let arrow = match m.better {
                Better::Higher => "↑",
                Better::Lower => "↓",
            };
            let fig = format!("{} ({}, {arrow})", m.name, m.unit);
            let mut first_row = true;
            for r in &m.rows {
                let figcell = if first_row { fig.as_str() } else { "" };
                let sys = match r.kind {
                    Kind::Seedgate => format!("**{}**", r.system),
                    _ => r.system.clone(),
                };
                let Some(med) = r.median() else {
                    if r.skipped.is_some() {
                        if shown_skips.contains(&r.system.as_str()) {
                            continue;
                        }
                        shown_skips.push(&r.system);
                    }
                    let _ = writeln!(out, "| {figcell} | {sys} | {} | | | | |", unavailable(r).replace('|', "/"));
                    first_row = false;
                    continue;
                };
                let (lo, hi) = r.min_max().unwrap_or((med, med));
                let vs_direct = match (direct, r.kind) {
                    (_, Kind::Direct) => String::new(),
                    (Some(d), _) if is_latency(&m.unit) => {
                        let diff = med - d;
                        format!("{}{} {}", if diff < 0.0 { "−" } else { "+" }, fmt_num(diff.abs()), m.unit)
                    }
                    (Some(d), _) if d != 0.0 => ratio(med / d),
                    _ => String::new(),
                };
                let vs_ours = match (ours, r.kind) {
                    (Some(o), Kind::Anchor | Kind::Direct) if med != 0.0 => ratio(o / med),
                    _ => String::new(),
                };
                let mut medcell = fmt_num(med);
                if !r.notes.is_empty() {
                    medcell.push_str(" ⚠");
                }
                let _ = writeln!(
                    out,
                    "| {figcell} | {sys} | {medcell} | {}–{} | {} | {vs_direct} | {vs_ours} |",
                    fmt_num(lo),
                    fmt_num(hi),
                    r.samples.len()
                );
                first_row = false;
            }
        }
        // Notes under the table: errors grouped by system and first message (a failure that
        // repeats across figures and repeats is listed once, with the figures it hit).
        let mut notes = String::new();
        for m in res.metrics.iter().filter(|m| m.scenario == sc) {
            if let Some(n) = &m.note {
                let _ = writeln!(notes, "- {}: {n}", m.name);
            }
        }
        let mut groups: Vec<(String, String, Vec<String>, usize)> = Vec::new();
        for m in res.metrics.iter().filter(|m| m.scenario == sc) {
            for r in m.rows.iter().filter(|r| !r.notes.is_empty()) {
                let first = r.notes[0].clone();
                match groups.iter_mut().find(|g| g.0 == r.system && g.1 == first) {
                    Some(g) => g.2.push(m.name.clone()),
                    None => groups.push((r.system.clone(), first, vec![m.name.clone()], r.notes.len())),
                }
            }
        }
        for m in res.metrics.iter().filter(|m| m.scenario == sc) {
            for r in &m.rows {
                if let Some(i) = &r.info {
                    let _ = writeln!(notes, "- {} / {}: {i}", m.name, r.system);
                }
            }
        }
        for (system, first, figures, n) in groups {
            let more = if n > 1 { format!(" (and {} other messages)", n - 1) } else { String::new() };
            let _ = writeln!(notes, "- ⚠ {system} — {}: {first}{more}", figures.join("; "));
        }
        if !notes.is_empty() {
            out.push('\n');
            out.push_str(&notes);
        }
        for (_, table) in res.tables.iter().filter(|(s, _)| *s == sc) {
            out.push('\n');
            out.push_str(table);
        }
    }
    out
}

/// Why a row has no median: skipped (not run) or failed (every repeat errored).
pub(crate) fn unavailable(r: &Row) -> String {
    match (&r.skipped, r.notes.first()) {
        (Some(s), _) => format!("skipped: {s}"),
        (None, Some(n)) => format!("failed: {}", n.trim_start_matches("error: ")),
        (None, None) => "no result".into(),
    }
}

/// `s` as XML text or attribute value.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A hand-written SVG: one panel per figure, a horizontal bar per system (the median, with a
/// min–max whisker), scaled to the largest median of that figure; skipped systems are named.
pub(crate) fn svg(res: &Results, title: &str) -> String {
    const W: f64 = 980.0;
    const LABEL_W: f64 = 300.0;
    const BAR_W: f64 = 520.0;
    const ROW_H: f64 = 18.0;
    const PANEL_GAP: f64 = 14.0;
    let mut body = String::new();
    let mut y = 52.0;
    let mut last_sc = String::new();
    let mut shown_skips: Vec<&str> = Vec::new();
    for m in &res.metrics {
        if m.scenario != last_sc {
            shown_skips.clear();
            y += 10.0;
            let _ = writeln!(
                body,
                r##"<text x="10" y="{:.1}" font-size="16" font-weight="bold">{}</text>"##,
                y + 14.0,
                esc(&m.scenario)
            );
            y += 24.0;
            last_sc = m.scenario.clone();
        }
        let arrow = match m.better {
            Better::Higher => "higher is better",
            Better::Lower => "lower is better",
        };
        let _ = writeln!(
            body,
            r##"<text x="20" y="{:.1}" font-size="13" font-weight="bold">{} ({}, {arrow})</text>"##,
            y + 13.0,
            esc(&m.name),
            esc(&m.unit)
        );
        y += ROW_H + 2.0;
        // Bars scale to the largest median; whiskers beyond the panel are clipped at its edge.
        let max = m.rows.iter().filter_map(Row::median).fold(0.0f64, f64::max).max(f64::MIN_POSITIVE) * 1.05;
        let x_of = |v: f64| LABEL_W + (v / max * BAR_W).min(BAR_W + 20.0);
        for r in &m.rows {
            // A system skipped as a whole is named once per scenario.
            if r.median().is_none() && r.skipped.is_some() {
                if shown_skips.contains(&r.system.as_str()) {
                    continue;
                }
                shown_skips.push(&r.system);
            }
            let color = match r.kind {
                Kind::Direct => "#9e9e9e",
                Kind::Seedgate => "#2e7d32",
                Kind::Anchor => "#1565c0",
            };
            let _ = writeln!(
                body,
                r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"##,
                LABEL_W - 6.0,
                y + 13.0,
                esc(&r.system)
            );
            match r.median() {
                Some(med) => {
                    let wbar = (med / max * BAR_W).max(1.0);
                    let _ = writeln!(
                        body,
                        r##"<rect x="{LABEL_W}" y="{:.1}" width="{wbar:.1}" height="{:.1}" fill="{color}"/>"##,
                        y + 2.0,
                        ROW_H - 4.0
                    );
                    if let Some((lo, hi)) = r.min_max()
                        && hi > lo
                    {
                        let (x0, x1) = (x_of(lo), x_of(hi));
                        let ym = y + ROW_H / 2.0;
                        let _ = writeln!(
                            body,
                            r##"<path d="M{x0:.1},{ym:.1}H{x1:.1}M{x0:.1},{:.1}V{:.1}M{x1:.1},{:.1}V{:.1}" stroke="#000" stroke-width="1"/>"##,
                            ym - 4.0,
                            ym + 4.0,
                            ym - 4.0,
                            ym + 4.0
                        );
                    }
                    let _ = writeln!(
                        body,
                        r##"<text x="{:.1}" y="{:.1}" font-size="12">{} {}</text>"##,
                        x_of(med).max(r.min_max().map_or(0.0, |(_, hi)| x_of(hi))) + 6.0,
                        y + 13.0,
                        fmt_num(med),
                        esc(&m.unit)
                    );
                }
                None => {
                    let why: String = unavailable(r).chars().take(100).collect();
                    let _ = writeln!(
                        body,
                        r##"<text x="{LABEL_W}" y="{:.1}" font-size="11" fill="#777">{}</text>"##,
                        y + 13.0,
                        esc(&why)
                    );
                }
            }
            y += ROW_H;
        }
        y += PANEL_GAP;
    }
    let h = y + 30.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h:.0}" viewBox="0 0 {W} {h:.0}" font-family="DejaVu Sans, Arial, sans-serif">"##
    );
    let _ = writeln!(out, r##"<rect width="100%" height="100%" fill="#fff"/>"##);
    let _ = writeln!(out, r##"<text x="10" y="22" font-size="15">{}</text>"##, esc(title));
    let legend = [("#9e9e9e", "direct (no proxy)"), ("#2e7d32", "seedgate"), ("#1565c0", "anchor")];
    for (i, (c, t)) in legend.iter().enumerate() {
        let x = 10.0 + i as f64 * 150.0;
        let _ = writeln!(
            out,
            r##"<rect x="{x:.0}" y="36" width="12" height="12" fill="{c}"/><text x="{:.0}" y="47" font-size="12">{t}</text>"##,
            x + 16.0
        );
    }
    out.push_str(&body);
    out.push_str("</svg>\n");
    out
}

/// What a target reads: the median of one system's row (the first whose label starts with
/// `system`) of one figure.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Input<'a> {
    pub fig: FigureId,
    pub at: Option<&'a str>,
    pub system: &'a str,
}

/// `system`'s row of figure `fig`.
pub(crate) fn of(fig: FigureId, system: &str) -> Input<'_> {
    Input { fig, at: None, system }
}

/// `system`'s row of figure `fig` at parameter `at`.
pub(crate) fn at<'a>(fig: FigureId, at: &'a str, system: &'a str) -> Input<'a> {
    Input { fig, at: Some(at), system }
}

/// What a target found for one input.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Read {
    Value(f64),
    /// The system was skipped, or every measurement of it errored: said on its row already (a
    /// seedgate error fails the run there), so the target is only shown as not evaluated.
    Unavailable(String),
    /// The figure was never recorded under its id, or has no row for the system at all: the
    /// scenario and its targets disagree, and the target fails the run.
    Missing(String),
}

/// Whether a target is met, and if not evaluated, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Met,
    Unmet,
    Unavailable,
    Missing,
}

/// One row of the targets table.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub what: String,
    pub value: String,
    pub verdict: Verdict,
}

/// The targets of one scenario, evaluated on the results.
///
/// A target whose figure is missing (never recorded under its id, or without a row for the
/// system) is [`Verdict::Missing`], which fails the run; not where the scenario did not run to
/// its end (its error already failed the run) or was merged from an older results file (shown
/// as missing, not evaluated). A system skipped (an anchor not installed, left
/// out by `--seedgate-only` or `--only`, a scenario that cannot run here) or that errored has a
/// row saying so; its targets are [`Verdict::Unavailable`] and fail nothing of their own. A
/// scenario that did not run has no targets in the table.
#[derive(Debug)]
pub(crate) struct Targets<'a> {
    pub res: &'a Results,
    /// A missing figure fails the run (the scenario ran in this run, to its end).
    missing_fails: bool,
    pub rows: Vec<Target>,
}

impl<'a> Targets<'a> {
    pub(crate) fn new(res: &'a Results, missing_fails: bool) -> Self {
        Self { res, missing_fails, rows: Vec::new() }
    }

    /// The median of `i`'s row, or why there is none.
    pub(crate) fn read(&self, i: Input<'_>) -> Read {
        let at = i.at.map(|a| format!(" at {a}")).unwrap_or_default();
        let Some(m) = self.res.find(i.fig, i.at) else {
            return Read::Missing(format!("figure {}/{}{at} not recorded", i.fig.scenario, i.fig.key));
        };
        let Some(r) = m.rows.iter().find(|r| r.system.starts_with(i.system)) else {
            return Read::Missing(format!("no row for {} in {}", i.system, m.name));
        };
        match r.median() {
            Some(v) => Read::Value(v),
            None => Read::Unavailable(format!("{} in {}: {}", r.system, m.name, unavailable(r))),
        }
    }

    /// A row that could not be evaluated: missing if any input is, else unavailable.
    pub(crate) fn not_evaluated(&mut self, what: &str, reads: &[Read]) {
        // Each reason once (two inputs of one figure can miss for the same reason).
        let reasons = |missing: bool| {
            let mut v: Vec<&str> = Vec::new();
            for r in reads {
                let w = match r {
                    Read::Missing(w) if missing => w,
                    Read::Unavailable(w) if !missing => w,
                    _ => continue,
                };
                if !v.contains(&w.as_str()) {
                    v.push(w);
                }
            }
            v
        };
        let missing = reasons(true);
        let (value, verdict) = if missing.is_empty() {
            (format!("not measured: {}", reasons(false).join("; ")), Verdict::Unavailable)
        } else {
            let verdict = if self.missing_fails { Verdict::Missing } else { Verdict::Unavailable };
            (format!("missing: {}", missing.join("; ")), verdict)
        };
        self.rows.push(Target { what: what.to_owned(), value: value.replace('|', "/"), verdict });
    }

    /// A target on the values of `reads`: `eval` gives the value shown and whether it is met
    /// (`None`: the values cannot be compared, e.g. a zero divisor).
    pub(crate) fn check_reads(
        &mut self,
        what: &str,
        reads: &[Read],
        eval: impl FnOnce(&[f64]) -> Option<(String, bool)>,
    ) {
        let values: Vec<f64> =
            reads.iter().filter_map(|r| if let Read::Value(v) = r { Some(*v) } else { None }).collect();
        if values.len() < reads.len() {
            return self.not_evaluated(what, reads);
        }
        let (value, verdict) = match eval(&values) {
            Some((v, true)) => (v, Verdict::Met),
            Some((v, false)) => (v, Verdict::Unmet),
            None => ("not comparable (a divisor of 0)".to_owned(), Verdict::Unavailable),
        };
        self.rows.push(Target { what: what.to_owned(), value, verdict });
    }

    /// A target evaluated by the scenario itself.
    pub(crate) fn push(&mut self, what: &str, value: String, met: bool) {
        let verdict = if met { Verdict::Met } else { Verdict::Unmet };
        self.rows.push(Target { what: what.to_owned(), value, verdict });
    }

    /// A target on the figures `inputs` read.
    pub(crate) fn check(
        &mut self,
        what: &str,
        inputs: &[Input<'_>],
        eval: impl FnOnce(&[f64]) -> Option<(String, bool)>,
    ) {
        let reads: Vec<Read> = inputs.iter().map(|&i| self.read(i)).collect();
        self.check_reads(what, &reads, eval)
    }

    /// "ours ÷ theirs", met when `ok(ratio)`.
    fn ratio(&mut self, what: &str, ours: Input<'_>, theirs: Input<'_>, unit: &str, ok: impl Fn(f64) -> bool) {
        self.check(what, &[ours, theirs], |v| {
            let (o, t) = (v[0], v[1]);
            (t > 0.0).then(|| (format!("{} ÷ {} {unit} = {:.2}×", fmt_num(o), fmt_num(t), o / t), ok(o / t)))
        });
    }

    pub(crate) fn ratio_at_least(&mut self, what: &str, ours: Input<'_>, theirs: Input<'_>, min: f64, unit: &str) {
        self.ratio(what, ours, theirs, unit, |r| r >= min);
    }

    pub(crate) fn ratio_at_most(&mut self, what: &str, ours: Input<'_>, theirs: Input<'_>, max: f64, unit: &str) {
        self.ratio(what, ours, theirs, unit, |r| r <= max);
    }

    /// One figure against a bound: `show` formats it, `ok` says whether it is met.
    pub(crate) fn value(
        &mut self,
        what: &str,
        i: Input<'_>,
        show: impl FnOnce(f64) -> String,
        ok: impl FnOnce(f64) -> bool,
    ) {
        self.check(what, &[i], |v| Some((show(v[0]), ok(v[0]))));
    }
}

/// The targets table in Markdown (empty when no scenario that ran has targets).
pub(crate) fn targets_markdown(rows: &[Target]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n### targets\n\n| target | seedgate now | met |\n|---|---|---|\n");
    for t in rows {
        let met = match t.verdict {
            Verdict::Met => "yes",
            Verdict::Unmet => "**no**",
            Verdict::Unavailable => "—",
            Verdict::Missing => "**missing**",
        };
        let _ = writeln!(out, "| {} | {} | {met} |", t.what, t.value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_ratios_keep_two_significant_digits() {
        assert_eq!(ratio(12.1 / 4203.0), "0.0029×");
        assert_eq!(ratio(0.05), "0.05×");
        assert_eq!(ratio(0.0), "0.00×");
        assert_eq!(ratio(2.2), "2.20×");
    }

    #[test]
    fn seedgate_errors_and_start_failures_are_failures_anchor_ones_are_not() {
        let mut r = Results::default();
        let m = r.metric("idle-memory", "SNI passthrough", "KiB", Better::Lower);
        r.add(m, "direct", Kind::Direct, 1.0);
        r.note(m, "sni-router", Kind::Seedgate, "error: 0 of 300 connections opened before the first failure");
        r.note(m, "haproxy", Kind::Anchor, "error: refused");
        r.add(m, "nginx", Kind::Anchor, 2.0);
        let ok = r.metric("idle-memory", "CONNECT", "KiB", Better::Lower);
        r.add(ok, "sni-router", Kind::Seedgate, 3.0);
        r.note(ok, "sni-router", Kind::Seedgate, "2 errors of 300");
        let reload = r.metric("reload", "p99", "ms", Better::Lower);
        r.skip(reload, "sni-router", Kind::Seedgate, "cannot bind");
        r.skip(reload, "proxy-server", Kind::Seedgate, "filtered out (--only nginx)");
        let p50 = r.metric("reload", "p50", "ms", Better::Lower);
        r.skip(p50, "sni-router", Kind::Seedgate, "cannot bind");
        assert_eq!(
            r.seedgate_failures(),
            [
                "idle-memory | SNI passthrough | sni-router: error: 0 of 300 connections opened before the first failure",
                "reload: sni-router did not start: cannot bind",
            ]
        );
        let mut clean = Results::default();
        let m = clean.metric("sni-bulk", "bulk", "Gbit/s", Better::Higher);
        clean.add(m, "sni-router", Kind::Seedgate, 1.0);
        assert!(clean.seedgate_failures().is_empty());
    }

    #[test]
    fn a_target_whose_figure_is_missing_fails_one_whose_system_was_skipped_does_not() {
        const BULK: FigureId = FigureId::new("sni-bulk", "bulk-1");
        const RENAMED: FigureId = FigureId::new("sni-bulk", "bulk-64");
        let mut r = Results::default();
        let m = r.figure(BULK, "bulk, 1 stream", "Gbit/s", Better::Higher);
        r.add(m, "direct", Kind::Direct, 10.0);
        r.add(m, "sni-router", Kind::Seedgate, 8.0);
        r.skip(m, "haproxy", Kind::Anchor, "left out (--seedgate-only)");
        let mut t = Targets::new(&r, true);
        t.ratio_at_least("vs direct", of(BULK, "sni-router"), of(BULK, "direct"), 0.5, "Gbit/s");
        t.ratio_at_least("vs haproxy", of(BULK, "sni-router"), of(BULK, "haproxy"), 1.0, "Gbit/s");
        t.ratio_at_least("vs nginx", of(BULK, "sni-router"), of(BULK, "nginx"), 1.0, "Gbit/s");
        t.ratio_at_least("64 streams", of(RENAMED, "sni-router"), of(RENAMED, "direct"), 0.5, "Gbit/s");
        let verdicts: Vec<(&str, Verdict)> = t.rows.iter().map(|t| (t.what.as_str(), t.verdict)).collect();
        assert_eq!(
            verdicts,
            [
                ("vs direct", Verdict::Met),
                ("vs haproxy", Verdict::Unavailable),
                ("vs nginx", Verdict::Missing),
                ("64 streams", Verdict::Missing),
            ]
        );
        assert_eq!(t.rows[1].value, "not measured: haproxy in bulk, 1 stream: skipped: left out (--seedgate-only)");
        assert_eq!(t.rows[2].value, "missing: no row for nginx in bulk, 1 stream");
        assert_eq!(t.rows[3].value, "missing: figure sni-bulk/bulk-64 not recorded");
        let md = targets_markdown(&t.rows);
        assert!(md.contains("| 64 streams | missing: figure sni-bulk/bulk-64 not recorded | **missing** |"), "{md}");
        // A scenario that ended in an error already failed the run: its missing figures do not.
        let mut unfinished = Targets::new(&r, false);
        unfinished.ratio_at_least("64 streams", of(RENAMED, "sni-router"), of(RENAMED, "direct"), 0.5, "Gbit/s");
        assert_eq!(unfinished.rows[0].verdict, Verdict::Unavailable);
        // A name that merely starts like the figure's is not the figure.
        let mut r2 = Results::default();
        let other = r2.metric("sni-bulk", "bulk, 1 stream", "Gbit/s", Better::Higher);
        r2.add(other, "sni-router", Kind::Seedgate, 8.0);
        assert!(matches!(Targets::new(&r2, true).read(of(BULK, "sni-router")), Read::Missing(_)));
    }

    #[test]
    fn table_ratios_and_skips() {
        let mut r = Results::default();
        let m = r.metric("sni-bulk", "bulk, 1 stream", "Gbit/s", Better::Higher);
        r.add(m, "direct", Kind::Direct, 20.0);
        r.add(m, "sni-router", Kind::Seedgate, 10.0);
        r.add(m, "sni-router", Kind::Seedgate, 12.0);
        r.add(m, "haproxy", Kind::Anchor, 5.0);
        r.skip(m, "rathole", Kind::Anchor, "not installed");
        let l = r.metric("sni-bulk", "p50", "µs", Better::Lower);
        r.add(l, "direct", Kind::Direct, 100.0);
        r.add(l, "sni-router", Kind::Seedgate, 110.0);
        let md = markdown(&r, "");
        assert!(md.contains("| **sni-router** | 11 | 10–12 | 2 | 0.55× |  |"), "{md}");
        assert!(md.contains("| haproxy | 5 | 5–5 | 1 | 0.25× | 2.20× |"), "{md}");
        assert!(md.contains("skipped: not installed"), "{md}");
        assert!(md.contains("+10 µs"), "{md}");
        let s = svg(&r, "t");
        assert!(s.starts_with("<svg") && s.contains("skipped: not installed"));
        assert_eq!(fmt_num(17443.2), "17,443");
    }
}
