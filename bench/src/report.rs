//! Results: the samples each scenario records, and their Markdown table, JSON file and SVG chart.

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
        });
        MetricId(self.metrics.len() - 1)
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
        let rank = |s: &str| order.iter().position(|o| *o == s).unwrap_or(order.len());
        self.metrics.sort_by_key(|m| rank(&m.scenario));
        self.remarks.sort_by_key(|(s, _)| rank(s));
        self.tables.sort_by_key(|(s, _)| rank(s));
        self.runs.sort_by_key(|r| rank(&r.scenario));
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
fn unavailable(r: &Row) -> String {
    match (&r.skipped, r.notes.first()) {
        (Some(s), _) => format!("skipped: {s}"),
        (None, Some(n)) => format!("failed: {}", n.trim_start_matches("error: ")),
        (None, None) => "no result".into(),
    }
}

fn esc(s: &str) -> String {
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

/// The median of the first row whose system starts with `system`, in the first metric of
/// `scenario` whose name starts with `name`.
fn med(res: &Results, scenario: &str, name: &str, system: &str) -> Option<f64> {
    med_where(res, scenario, system, |n| n.starts_with(name))
}

/// [`med`] of the figure named exactly `name`.
fn med_exact(res: &Results, scenario: &str, name: &str, system: &str) -> Option<f64> {
    med_where(res, scenario, system, |n| n == name)
}

fn med_where(res: &Results, scenario: &str, system: &str, name_matches: impl Fn(&str) -> bool) -> Option<f64> {
    res.metrics
        .iter()
        .filter(|m| m.scenario == scenario && name_matches(&m.name))
        .flat_map(|m| m.rows.iter())
        .find(|r| r.system.starts_with(system))
        .and_then(Row::median)
}

/// The project's performance targets, evaluated on these results (rows whose inputs are missing
/// are left out).
pub(crate) fn targets(res: &Results) -> String {
    let mut rows: Vec<(String, String, bool)> = Vec::new();
    /// Row "ours ÷ theirs", met when `ok(ratio)`.
    fn ratio_row(
        rows: &mut Vec<(String, String, bool)>,
        what: &str,
        (ours, theirs): (Option<f64>, Option<f64>),
        unit: &str,
        ok: impl Fn(f64) -> bool,
    ) {
        if let (Some(o), Some(t)) = (ours, theirs)
            && t > 0.0
        {
            let r = o / t;
            rows.push((what.to_owned(), format!("{} ÷ {} {unit} = {r:.2}×", fmt_num(o), fmt_num(t)), ok(r)));
        }
    }
    fn ratio_at_least(
        rows: &mut Vec<(String, String, bool)>,
        what: &str,
        ours: Option<f64>,
        theirs: Option<f64>,
        min: f64,
        unit: &str,
    ) {
        ratio_row(rows, what, (ours, theirs), unit, |r| r >= min);
    }
    fn ratio_at_most(
        rows: &mut Vec<(String, String, bool)>,
        what: &str,
        ours: Option<f64>,
        theirs: Option<f64>,
        max: f64,
        unit: &str,
    ) {
        ratio_row(rows, what, (ours, theirs), unit, |r| r <= max);
    }
    let b = "sni-bulk";
    ratio_at_least(
        &mut rows,
        "sni-router bulk (1 stream) ≥ 0.5× direct",
        med(res, b, "bulk, 1 stream", "sni-router"),
        med(res, b, "bulk, 1 stream", "direct"),
        0.5,
        "Gbit/s",
    );
    ratio_at_least(
        &mut rows,
        "sni-router bulk (64 streams) ≥ 0.5× direct",
        med(res, b, "bulk, 64", "sni-router"),
        med(res, b, "bulk, 64", "direct"),
        0.5,
        "Gbit/s",
    );
    ratio_at_least(
        &mut rows,
        "sni-router bulk (1 stream) ahead of haproxy splice-auto",
        med(res, b, "bulk, 1 stream", "sni-router"),
        med(res, b, "bulk, 1 stream", "haproxy splice"),
        1.0,
        "Gbit/s",
    );
    ratio_at_least(
        &mut rows,
        "sni-router bulk (64 streams) ahead of haproxy splice-auto",
        med(res, b, "bulk, 64", "sni-router"),
        med(res, b, "bulk, 64", "haproxy splice"),
        1.0,
        "Gbit/s",
    );
    let c = "sni-connrate";
    ratio_at_least(
        &mut rows,
        "full-TLS connections/s ≥ 0.8× direct",
        med(res, c, "full-TLS", "sni-router"),
        med(res, c, "full-TLS", "direct"),
        0.8,
        "conn/s",
    );
    let p50 = |sys: &str| med(res, c, "time to first byte p50 at 200", sys);
    let p99 = |sys: &str| med(res, c, "time to first byte p99 at 200", sys);
    if let (Some(o), Some(d)) = (p50("sni-router"), p50("direct")) {
        rows.push(("added median latency ≤ 15 µs".into(), format!("{:+.0} µs (at 200 conn/s)", o - d), o - d <= 15.0));
    }
    if let (Some(o), Some(h), Some(d)) = (p99("sni-router"), p99("haproxy"), p99("direct")) {
        let (ao, ah) = (o - d, h - d);
        rows.push((
            "added p99 latency ≤ ½ haproxy's".into(),
            format!("{ao:+.0} µs vs haproxy {ah:+.0} µs"),
            ao <= ah / 2.0,
        ));
    }
    let pp = "proxy-protocol";
    let best = [
        med(res, pp, "PROXY-v2 listener alone, connections", "haproxy"),
        med(res, pp, "PROXY-v2 listener alone, connections", "nginx"),
    ]
    .into_iter()
    .flatten()
    .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
    ratio_at_least(
        &mut rows,
        "PROXY-v2 listener connections/s ≥ 1.5× best of haproxy/nginx",
        med(res, pp, "PROXY-v2 listener alone, connections", "sni-router"),
        best,
        1.5,
        "conn/s",
    );
    let im = "idle-memory";
    if let Some(v) = med(res, im, "SNI passthrough", "sni-router") {
        rows.push(("idle memory ≤ 2 KiB per routed connection (sni-router)".into(), format!("{v:.1} KiB"), v <= 2.0));
    }
    if let Some(v) = med(res, im, "reverse tunnel", "proxy-server") {
        rows.push(("idle memory ≤ 4.5 KiB per tunnel stream (both ends)".into(), format!("{v:.2} KiB"), v <= 4.5));
    }
    let t = "tunnel";
    let (h2, quic) = ("proxy-server + proxy-agent (h2)", "proxy-server + proxy-agent (quic)");
    // "download, 50 streams" also starts the stalled-reader figure's name: match names exactly.
    let bulks = [
        ("1 stream", "bulk upload, 1 stream"),
        ("64 streams", "bulk upload, 64 streams"),
        ("download", "download, 50 streams"),
    ];
    for (what, name) in bulks {
        for (anchor, min) in [("rathole (tls)", 1.5), ("rathole (tcp)", 1.0)] {
            ratio_at_least(
                &mut rows,
                &format!("tunnel h2 bulk ({what}) ≥ {min:.1}× {anchor}"),
                med_exact(res, t, name, h2),
                med_exact(res, t, name, anchor),
                min,
                "Gbit/s",
            );
        }
        ratio_at_least(
            &mut rows,
            &format!("tunnel QUIC bulk ({what}) ≥ 0.8× h2"),
            med_exact(res, t, name, quic),
            med_exact(res, t, name, h2),
            0.8,
            "Gbit/s",
        );
    }
    let cpu = "CPU per GB moved";
    ratio_at_most(
        &mut rows,
        "tunnel h2 CPU per GB ≤ 1.15× rathole (tcp)",
        med(res, t, cpu, h2),
        med(res, t, cpu, "rathole (tcp)"),
        1.15,
        "s",
    );
    ratio_at_most(
        &mut rows,
        "tunnel QUIC CPU per GB ≤ 1.25× h2",
        med(res, t, cpu, quic),
        med(res, t, cpu, h2),
        1.25,
        "s",
    );
    for q in ["p50", "p99"] {
        let name = format!("time to first byte {q} at 200");
        for sys in [h2, quic] {
            let label = if sys == h2 { "h2" } else { "QUIC" };
            ratio_at_most(
                &mut rows,
                &format!("tunnel {label} time to first byte {q} ≤ rathole (tcp)"),
                med(res, t, &name, sys),
                med(res, t, &name, "rathole (tcp)"),
                1.0,
                "µs",
            );
        }
    }
    ratio_at_least(
        &mut rows,
        "CONNECT through the tunnel ≥ 3× squid+rathole opens/s",
        med(res, t, "CONNECT through a reverse tunnel, opens", h2),
        med(res, t, "CONNECT through a reverse tunnel, opens", "squid"),
        3.0,
        "opens/s",
    );
    if let Some(v) = med(res, t, "CONNECT through a reverse tunnel, open latency p99 at 200", h2) {
        rows.push((
            "CONNECT through the tunnel: p99 open latency ≤ 4 ms".into(),
            format!("{:.2} ms (at 200 conn/s)", v / 1000.0),
            v <= 4000.0,
        ));
    }
    if let Some(v) = med(res, t, "head-of-line ratio", h2) {
        rows.push(("tunnel h2 head-of-line ratio ≥ 0.95".into(), format!("{v:.2}"), v >= 0.95));
    }
    if let Some(v) = med(res, t, "memory per open stream at 10000", h2) {
        rows.push((
            "tunnel h2 memory per open stream ≤ 4.5 KiB (10,000 streams, both ends)".into(),
            format!("{v:.2} KiB"),
            v <= 4.5,
        ));
    }
    for m in res.metrics.iter().filter(|m| m.scenario == t && m.name.starts_with("streams completing")) {
        let n: f64 = m.name.rsplit(' ').next().and_then(|x| x.parse().ok()).unwrap_or(0.0);
        if let Some(v) = m.rows.iter().find(|r| r.system.starts_with("proxy-server")).and_then(Row::median) {
            rows.push((format!("{n:.0} concurrent streams all complete"), format!("{v:.0} of {n:.0}"), v >= n));
        }
    }
    let rl = "reload";
    if let Some(v) = med(res, rl, "connections reset", "sni-router") {
        rows.push(("reload resets 0 connections".into(), format!("{v:.0}"), v == 0.0));
    }
    if let Some(v) = med(res, rl, "new route live", "sni-router (SIGHUP)") {
        rows.push(("new route live < 100 ms at 10,000 routes (full reload)".into(), format!("{v:.0} ms"), v < 100.0));
    }
    if let Some(v) = med(res, rl, "new route live", "sni-router (routes_dir") {
        rows.push(("one new shoot file live < 20 ms at 10,000 routes".into(), format!("{v:.1} ms"), v < 20.0));
    }
    let nn = "noisy-neighbour";
    if let (Some(quiet), Some(flood)) = (
        med(res, nn, "shoot B time to first byte p99, quiet", "sni-router"),
        med(res, nn, "shoot B time to first byte p99, shoot A flooding", "sni-router"),
    ) && quiet > 0.0
    {
        let r = flood / quiet;
        rows.push((
            "shoot B's p99 with shoot A flooding ≤ 1.5× quiet".into(),
            format!("{} ÷ {} µs = {r:.2}×", fmt_num(flood), fmt_num(quiet)),
            r <= 1.5,
        ));
    }
    let mut rows: Vec<(String, String, Option<bool>)> = rows.into_iter().map(|(w, v, ok)| (w, v, Some(ok))).collect();
    rows.extend(crate::scenarios::scaling_targets(res).into_iter().map(|(w, v, ok)| (w, v, Some(ok))));
    rows.extend(crate::scenarios::wan::targets(res));
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n### targets\n\n| target | seedgate now | met |\n|---|---|---|\n");
    for (what, value, ok) in rows {
        let met = match ok {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "—",
        };
        let _ = writeln!(out, "| {what} | {value} | {met} |");
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
    fn tunnel_targets_compare_h2_with_rathole_and_quic_with_h2() {
        let (h2, quic) = ("proxy-server + proxy-agent (h2)", "proxy-server + proxy-agent (quic)");
        let mut r = Results::default();
        let bulk = r.metric("tunnel", "bulk upload, 1 stream", "Gbit/s", Better::Higher);
        for (sys, kind, v) in [
            (h2, Kind::Seedgate, 6.0),
            (quic, Kind::Seedgate, 4.0),
            ("rathole (tcp)", Kind::Anchor, 6.5),
            ("rathole (tls)", Kind::Anchor, 3.0),
        ] {
            r.add(bulk, sys, kind, v);
        }
        let cpu = r.metric("tunnel", "CPU per GB moved, bulk upload 1 stream (both ends)", "CPU s/GB", Better::Lower);
        for (sys, kind, v) in
            [(h2, Kind::Seedgate, 1.40), (quic, Kind::Seedgate, 1.80), ("rathole (tcp)", Kind::Anchor, 1.25)]
        {
            r.add(cpu, sys, kind, v);
        }
        let p50 = r.metric("tunnel", "time to first byte p50 at 200 conn/s", "µs", Better::Lower);
        for (sys, kind, v) in
            [(h2, Kind::Seedgate, 300.0), (quic, Kind::Seedgate, 500.0), ("rathole (tcp)", Kind::Anchor, 400.0)]
        {
            r.add(p50, sys, kind, v);
        }
        // The stalled-reader figure's name starts with the plain download's: recorded first here,
        // it must not be taken for it.
        let stalled = r.metric("tunnel", "download, 50 streams + 1 stalled reader", "Gbit/s", Better::Higher);
        r.add(stalled, h2, Kind::Seedgate, 1.0);
        r.add(stalled, "rathole (tcp)", Kind::Anchor, 9.0);
        let dl = r.metric("tunnel", "download, 50 streams", "Gbit/s", Better::Higher);
        r.add(dl, h2, Kind::Seedgate, 5.0);
        r.add(dl, "rathole (tcp)", Kind::Anchor, 4.0);
        let t = targets(&r);
        let line = |what: &str| {
            t.lines().find(|l| l.contains(what)).unwrap_or_else(|| panic!("no {what:?} in\n{t}")).to_owned()
        };
        assert!(line("tunnel h2 bulk (1 stream) ≥ 1.5× rathole (tls)").ends_with("| yes |"), "{t}");
        assert!(line("tunnel h2 bulk (1 stream) ≥ 1.0× rathole (tcp)").contains("6 ÷ 6.50 Gbit/s = 0.92×"), "{t}");
        assert!(line("tunnel h2 bulk (1 stream) ≥ 1.0× rathole (tcp)").ends_with("| **no** |"), "{t}");
        // QUIC at 4.0 of h2's 6.0 is 0.67×: below 0.8.
        assert!(line("tunnel QUIC bulk (1 stream) ≥ 0.8× h2").ends_with("| **no** |"), "{t}");
        // 1.40 ÷ 1.25 = 1.12: within 1.15. QUIC 1.80 ÷ 1.40 = 1.29: over 1.25.
        assert!(line("tunnel h2 CPU per GB ≤ 1.15× rathole (tcp)").ends_with("| yes |"), "{t}");
        assert!(line("tunnel QUIC CPU per GB ≤ 1.25× h2").ends_with("| **no** |"), "{t}");
        assert!(line("tunnel h2 time to first byte p50 ≤ rathole (tcp)").ends_with("| yes |"), "{t}");
        assert!(line("tunnel QUIC time to first byte p50 ≤ rathole (tcp)").ends_with("| **no** |"), "{t}");
        assert!(line("tunnel h2 bulk (download) ≥ 1.0× rathole (tcp)").contains("5 ÷ 4 Gbit/s = 1.25×"), "{t}");
        // Figures this run did not measure leave their targets out.
        assert!(!t.contains("64 streams") && !t.contains("p99"), "{t}");
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
