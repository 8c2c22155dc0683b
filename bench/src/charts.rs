//! The README's and the book's charts: small SVGs drawn from a results file (`bench report --charts DIR`).
//!
//! Four charts, each 800 px wide and under [`MAX_HEIGHT`] tall, plain SVG (no script, no external
//! asset, generic font families) so that a forge shows them as images: the gateway beside haproxy
//! and nginx, the tunnel beside rathole and `ssh -R`, one stream across an emulated WAN by round
//! trip and by loss, and the dials through each fault on the path over time. Each is drawn only
//! from what the results hold; a chart whose figures are not there is not drawn, and says why.

use crate::report::{Answer, Kind, Metric, Moment, Results, Row, Timeline, esc, fmt_num, unavailable};
use crate::scenarios::{FAULTS, WAN_ONE_STREAM, WanProfile};
use std::fmt::Write as _;

/// The width of every chart, and the height none may reach (px).
const WIDTH: f64 = 800.0;
pub(crate) const MAX_HEIGHT: f64 = 1000.0;
/// Two panels side by side, each this wide, with the margins between.
const PANEL_W: f64 = 385.0;
const MARGIN: f64 = 10.0;

const SEEDGATE: &str = "#2e7d32";
const ANCHOR: &str = "#1565c0";
const DIRECT: &str = "#616161";
const GRID: &str = "#e0e0e0";

/// The charts by file name: each drawn, or why the results hold nothing to draw it from.
pub(crate) fn all(res: &Results) -> Vec<(&'static str, Result<String, String>)> {
    vec![("gateway.svg", gateway(res)), ("tunnel.svg", tunnel(res)), ("wan.svg", wan(res)), ("faults.svg", faults(res))]
}

// ---------------------------------------------------------------------------------------------
// Drawing

/// Extra attributes of a text.
const BOLD: &str = r#" font-weight="bold""#;
const RIGHT: &str = r#" text-anchor="end""#;
const MIDDLE: &str = r#" text-anchor="middle""#;
const FAINT: &str = r##" fill="#666""##;

/// An SVG being drawn: elements appended in order, wrapped by [`Svg::finish`].
#[derive(Default)]
struct Svg {
    body: String,
}

impl Svg {
    /// Text with its baseline at `y`; `attrs` adds attributes ([`BOLD`], [`RIGHT`], ...).
    fn text(&mut self, x: f64, y: f64, size: f64, attrs: &str, text: &str) {
        let _ = writeln!(self.body, r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}"{attrs}>{}</text>"#, esc(text));
    }

    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str) {
        let _ = writeln!(self.body, r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{fill}"/>"#);
    }

    /// A line through `points`; `dash` is an SVG dash array ("" for a solid line).
    fn line(&mut self, points: &[(f64, f64)], stroke: &str, width: f64, dash: &str) {
        let d: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let dash = if dash.is_empty() { String::new() } else { format!(r#" stroke-dasharray="{dash}""#) };
        let _ = writeln!(
            self.body,
            r#"<polyline points="{}" fill="none" stroke="{stroke}" stroke-width="{width}"{dash}/>"#,
            d.join(" ")
        );
    }

    fn marker(&mut self, shape: Shape, x: f64, y: f64, color: &str) {
        let _ = match shape {
            Shape::None => Ok(()),
            Shape::Circle => writeln!(self.body, r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.2" fill="{color}"/>"#),
            Shape::Square => {
                writeln!(
                    self.body,
                    r#"<rect x="{:.1}" y="{:.1}" width="6" height="6" fill="{color}"/>"#,
                    x - 3.0,
                    y - 3.0
                )
            }
            Shape::Triangle => writeln!(
                self.body,
                r#"<path d="M{x:.1},{:.1}L{:.1},{:.1}L{:.1},{:.1}Z" fill="{color}"/>"#,
                y - 4.0,
                x + 3.8,
                y + 3.0,
                x - 3.8,
                y + 3.0
            ),
            Shape::Diamond => writeln!(
                self.body,
                r#"<path d="M{x:.1},{:.1}L{:.1},{y:.1}L{x:.1},{:.1}L{:.1},{y:.1}Z" fill="{color}"/>"#,
                y - 4.0,
                x + 4.0,
                y + 4.0,
                x - 4.0
            ),
            Shape::Cross => writeln!(
                self.body,
                r#"<path d="M{:.1},{:.1}L{:.1},{:.1}M{:.1},{:.1}L{:.1},{:.1}" stroke="{color}" stroke-width="1.6"/>"#,
                x - 3.0,
                y - 3.0,
                x + 3.0,
                y + 3.0,
                x - 3.0,
                y + 3.0,
                x + 3.0,
                y - 3.0
            ),
            Shape::Down => writeln!(
                self.body,
                r#"<path d="M{:.1},{:.1}L{:.1},{:.1}L{x:.1},{y:.1}Z" fill="{color}"/>"#,
                x - 4.0,
                y - 6.0,
                x + 4.0,
                y - 6.0
            ),
        };
    }

    /// The whole SVG, `height` tall, on a white background (forges in a dark theme show an SVG's
    /// transparent parts dark), its title also as the accessible name.
    fn finish(self, title: &str, height: f64) -> String {
        let h = height.ceil();
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{h}\" viewBox=\"0 0 {WIDTH} {h}\" \
             font-family=\"sans-serif\">\n<title>{}</title>\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n{}</svg>\n",
            esc(title),
            self.body
        )
    }
}

/// A marker on a line or a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    None,
    Circle,
    Square,
    Triangle,
    Diamond,
    Cross,
    /// A triangle pointing down at its point (a moment on a time axis).
    Down,
}

/// One entry of a legend.
enum Key<'a> {
    /// A filled box (a bar's colour, a shaded span).
    Box(&'a str),
    /// A line with its marker.
    Line(&'a Style),
    /// A marker alone.
    Point(Shape, &'a str),
    /// A min–max whisker.
    Whisker,
}

/// About how wide `text` is at `size` px (sans-serif averages a little over half an em).
fn text_w(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.56
}

/// The chart's title, its subtitle lines and its legend; returns where the panels start.
fn header(svg: &mut Svg, title: &str, lines: &[String], legend: &[(Key<'_>, &str)]) -> f64 {
    svg.text(MARGIN, 22.0, 16.0, BOLD, title);
    let mut y = 22.0;
    for l in lines {
        y += 16.0;
        svg.text(MARGIN, y, 11.5, FAINT, l);
    }
    y += 18.0;
    let mut x = MARGIN;
    for (key, label) in legend {
        let w = 30.0 + text_w(label, 11.0) + 14.0;
        if x + w > WIDTH - MARGIN {
            x = MARGIN;
            y += 16.0;
        }
        match key {
            Key::Box(c) => svg.rect(x + 6.0, y - 9.0, 14.0, 10.0, c),
            Key::Line(s) => {
                svg.line(&[(x, y - 4.0), (x + 26.0, y - 4.0)], s.color, s.width, s.dash);
                svg.marker(s.shape, x + 13.0, y - 4.0, s.color);
            }
            Key::Point(shape, c) => {
                svg.marker(*shape, x + 13.0, y - 4.0 + if *shape == Shape::Down { 3.0 } else { 0.0 }, c)
            }
            Key::Whisker => whisker(svg, x + 4.0, x + 24.0, y - 4.0),
        }
        svg.text(x + 30.0, y, 11.0, "", label);
        x += w;
    }
    y + 14.0
}

fn whisker(svg: &mut Svg, x0: f64, x1: f64, y: f64) {
    svg.line(&[(x0, y - 3.5), (x0, y + 3.5)], "#000", 1.0, "");
    svg.line(&[(x0, y), (x1, y)], "#000", 1.0, "");
    svg.line(&[(x1, y - 3.5), (x1, y + 3.5)], "#000", 1.0, "");
}

/// A step of 1, 2 or 5 × 10ⁿ that cuts `0..max` into about `n` parts.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag)
}

/// Which runs the chart draws on: the scenarios, the dates they ran and, for `medians`, their
/// repeats (a smoke run says so).
fn provenance(res: &Results, scenarios: &[&str], medians: bool) -> String {
    let runs: Vec<_> = res.runs.iter().filter(|r| scenarios.contains(&r.scenario.as_str())).collect();
    let mut dates: Vec<&str> = runs.iter().map(|r| r.date_utc.get(..10).unwrap_or(&r.date_utc)).collect();
    dates.sort_unstable();
    dates.dedup();
    let mut repeats: Vec<usize> = runs.iter().map(|r| r.repeats).collect();
    repeats.sort_unstable();
    repeats.dedup();
    let repeats: Vec<String> = repeats.iter().map(usize::to_string).collect();
    let mut s = format!("bench {}", scenarios.join(", "));
    if !dates.is_empty() {
        let _ = write!(s, " · {}", dates.join(", "));
    }
    if medians && !repeats.is_empty() {
        let _ = write!(s, " · medians of {}", repeats.join(" or "));
    }
    if runs.iter().any(|r| r.smoke) {
        s.push_str(" · SMOKE RUN: not figures to quote");
    }
    s
}

/// A figure with its unit ("1.01×" for a ratio).
fn with_unit(v: f64, unit: &str) -> String {
    if unit == "ratio" { format!("{}×", fmt_num(v)) } else { format!("{} {unit}", fmt_num(v)) }
}

/// A short reason for a row with no figure: where it failed, if it says.
fn short_why(r: &Row) -> String {
    let why = unavailable(r);
    let why = why.split(" before the first failure").next().unwrap_or(&why);
    match why.char_indices().nth(52) {
        Some((i, _)) => format!("{}…", &why[..i]),
        None => why.to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// Bar charts: the gateway and the tunnel

/// One panel of a bar chart: a figure across systems.
struct Bars<'a> {
    /// The heading (the unit follows it); `None`: the figure's own name.
    title: Option<&'a str>,
    scenario: &'a str,
    /// The figure: the metric of the scenario with this name, else the first whose name starts
    /// with it (the last with `last`: of "... at 1000 streams" and "... at 10000 streams", the
    /// bigger).
    figure: &'a str,
    last: bool,
    /// Drawn as the difference from direct's median (what a proxy adds), not as measured.
    added: bool,
    /// The systems shown, by their row's name, each with its label; a system the figure has no
    /// row for is left out.
    systems: &'a [(&'a str, &'a str)],
}

impl Bars<'_> {
    fn metric<'r>(&self, res: &'r Results) -> Option<&'r Metric> {
        let of = || res.metrics.iter().filter(|m| m.scenario == self.scenario);
        if let Some(m) = of().find(|m| m.name == self.figure) {
            return Some(m);
        }
        let mut named = of().filter(|m| m.name.starts_with(self.figure));
        if self.last { named.next_back() } else { named.next() }
    }
}

/// What a bar shows.
enum Bar {
    /// The median, and the spread of the repeats.
    Measured { median: f64, lo: f64, hi: f64 },
    /// The median less direct's.
    Added(f64),
    /// No figure: why.
    Not(String),
}

const ROW_H: f64 = 17.0;
const LABEL_W: f64 = 120.0;
const BAR_MAX: f64 = 185.0;

/// A grid of bar panels, two a row; `Err` when the results have none of the figures.
fn bar_chart(res: &Results, title: &str, scenarios: &[&str], panels: &[Bars<'_>]) -> Result<String, String> {
    if panels.iter().all(|p| p.metric(res).is_none()) {
        return Err(format!("no figures of {} in these results", scenarios.join(", ")));
    }
    let mut svg = Svg::default();
    let legend =
        [(Key::Box(SEEDGATE), "seedgate"), (Key::Box(ANCHOR), "the others"), (Key::Whisker, "min–max of the repeats")];
    let lines = [
        provenance(res, scenarios, true),
        "bar: the median; in each panel every system ran the same load in the same run".to_owned(),
    ];
    let mut y = header(&mut svg, title, &lines, &legend);
    for pair in panels.chunks(2) {
        let mut h: f64 = 0.0;
        for (i, p) in pair.iter().enumerate() {
            let x = MARGIN + i as f64 * (PANEL_W + MARGIN);
            h = h.max(bar_panel(&mut svg, res, p, x, y));
        }
        y += h;
    }
    Ok(svg.finish(title, y + 4.0))
}

/// One panel at (x, y); returns its height.
fn bar_panel(svg: &mut Svg, res: &Results, p: &Bars<'_>, x: f64, y: f64) -> f64 {
    let Some(m) = p.metric(res) else {
        svg.text(x, y + 13.0, 12.5, BOLD, p.title.unwrap_or(p.figure));
        svg.text(x + 8.0, y + 30.0, 11.0, FAINT, "not in these results");
        return 48.0;
    };
    let direct = m.rows.iter().find(|r| r.kind == Kind::Direct).and_then(Row::median);
    let title = p.title.unwrap_or(&m.name);
    let title = if m.unit == "ratio" { title.to_owned() } else { format!("{title} ({})", m.unit) };
    svg.text(x, y + 13.0, 12.5, BOLD, &title);
    let better = match m.better {
        crate::report::Better::Higher => "higher is better",
        crate::report::Better::Lower => "lower is better",
    };
    let note = match (p.added, direct) {
        (true, Some(d)) => format!("{better}; over direct's {} without a proxy", with_unit(d, &m.unit)),
        (false, Some(d)) => format!("{better}; direct, without a proxy: {}", with_unit(d, &m.unit)),
        (_, None) => better.to_owned(),
    };
    svg.text(x, y + 27.0, 11.0, FAINT, &note);
    let bars: Vec<(&str, Kind, Bar)> = (p.systems.iter())
        .filter_map(|(system, label)| {
            let r = m.rows.iter().find(|r| r.system == *system)?;
            let bar = match (r.median(), p.added, direct) {
                (Some(med), true, Some(d)) => Bar::Added(med - d),
                (Some(_), true, None) => Bar::Not("no direct figure to add to".to_owned()),
                (Some(median), false, _) => {
                    let (lo, hi) = r.min_max().unwrap_or((median, median));
                    Bar::Measured { median, lo, hi }
                }
                (None, _, _) => Bar::Not(short_why(r)),
            };
            Some((*label, r.kind, bar))
        })
        .collect();
    let value = |b: &Bar| match b {
        Bar::Measured { median, .. } => with_unit(*median, &m.unit),
        Bar::Added(v) => format!("{}{}", if *v < 0.0 { "−" } else { "+" }, with_unit(v.abs(), &m.unit)),
        Bar::Not(why) => why.clone(),
    };
    // The longest bar, or less where its figure would not fit beside it in the panel.
    let room = PANEL_W - LABEL_W - 6.0 - 5.0;
    let scale = (bars.iter())
        .filter_map(|(_, _, b)| {
            let end = match b {
                Bar::Measured { hi, .. } => *hi,
                Bar::Added(v) => *v,
                Bar::Not(_) => return None,
            };
            (end > 0.0).then(|| (BAR_MAX / end).min((room - text_w(&value(b), 11.0)) / end))
        })
        .fold(f64::INFINITY, f64::min);
    let scale = if scale.is_finite() { scale } else { 0.0 };
    let x0 = x + LABEL_W + 6.0;
    let mut row_y = y + 34.0;
    for (label, kind, bar) in &bars {
        svg.text(x + LABEL_W, row_y + 11.0, 11.0, RIGHT, label);
        let color = if *kind == Kind::Seedgate { SEEDGATE } else { ANCHOR };
        let end = match bar {
            Bar::Measured { median, lo, hi } => {
                svg.rect(x0, row_y + 2.0, (median * scale).max(1.0), ROW_H - 5.0, color);
                if hi > lo {
                    whisker(svg, x0 + lo * scale, x0 + hi * scale, row_y + ROW_H / 2.0 - 0.5);
                }
                x0 + hi.max(*median) * scale + 5.0
            }
            Bar::Added(v) => {
                svg.rect(x0, row_y + 2.0, (v * scale).max(1.0), ROW_H - 5.0, color);
                x0 + v.max(0.0) * scale + 5.0
            }
            Bar::Not(_) => x0,
        };
        let faint = if matches!(bar, Bar::Not(_)) { FAINT } else { "" };
        svg.text(end, row_y + 11.0, 11.0, faint, &value(bar));
        row_y += ROW_H;
    }
    row_y - y + 14.0
}

const ROUTERS: &[(&str, &str)] = &[
    ("sni-router", "sni-router"),
    ("haproxy", "haproxy"),
    ("haproxy splice-auto", "haproxy splice-auto"),
    ("nginx", "nginx"),
];
const CONNECT_PROXIES: &[(&str, &str)] =
    &[("sni-router", "sni-router"), ("squid", "squid"), ("tinyproxy", "tinyproxy"), ("nginx njs", "nginx njs")];
const H2: &str = "proxy-server + proxy-agent (h2)";
const QUIC: &str = "proxy-server + proxy-agent (quic)";
const TUNNELS: &[(&str, &str)] = &[
    (H2, "seedgate h2"),
    (QUIC, "seedgate QUIC"),
    ("rathole (tcp)", "rathole tcp"),
    ("rathole (tls)", "rathole tls"),
    ("ssh -R", "ssh -R"),
];

/// A bar panel of `figure` in `scenario` for `systems`.
const fn bars<'a>(title: &'a str, scenario: &'a str, figure: &'a str, systems: &'a [(&'a str, &'a str)]) -> Bars<'a> {
    Bars { title: Some(title), scenario, figure, last: false, added: false, systems }
}

/// The gateway on one CPU beside haproxy and nginx (and, for CONNECT, squid and tinyproxy).
fn gateway(res: &Results) -> Result<String, String> {
    let added = |title, figure| Bars { added: true, ..bars(title, "sni-connrate", figure, ROUTERS) };
    bar_chart(
        res,
        "The gateway: sni-router beside haproxy and nginx",
        &["sni-bulk", "sni-connrate", "proxy-protocol", "connect", "idle-memory"],
        &[
            bars("SNI passthrough bulk, 1 stream", "sni-bulk", "bulk, 1 stream", ROUTERS),
            bars("SNI passthrough bulk, 64 streams", "sni-bulk", "bulk, 64 streams", ROUTERS),
            bars("full-TLS connections/s, SNI routing", "sni-connrate", "full-TLS connections/s", ROUTERS),
            bars(
                "PROXY-v2 listener, connections/s",
                "proxy-protocol",
                "PROXY-v2 listener alone, connections/s",
                ROUTERS,
            ),
            added("added time to first byte, p50", "time to first byte p50 at 200 conn/s"),
            added("added time to first byte, p99", "time to first byte p99 at 200 conn/s"),
            bars(
                "memory per idle routed connection",
                "idle-memory",
                "SNI passthrough: RSS per idle connection",
                ROUTERS,
            ),
            bars("HTTP CONNECT opens/s", "connect", "CONNECT opens/s", CONNECT_PROXIES),
        ],
    )
}

/// The reverse tunnel beside rathole and `ssh -R`.
fn tunnel(res: &Results) -> Result<String, String> {
    let t = |title, figure| bars(title, "tunnel", figure, TUNNELS);
    let memory = |last| Bars { title: None, last, ..t("", "memory per open stream at ") };
    bar_chart(
        res,
        "The reverse tunnel: proxy-server + proxy-agent beside rathole and ssh -R",
        &["tunnel"],
        &[
            t("bulk upload, 1 stream", "bulk upload, 1 stream"),
            t("bulk upload, 64 streams", "bulk upload, 64 streams"),
            t("download, 50 streams", "download, 50 streams"),
            t("head-of-line: with one reader stalled ÷ without", "head-of-line ratio"),
            t("CPU per GB moved, both ends", "CPU per GB moved"),
            t("new connections/s", "new connections/s"),
            memory(false),
            memory(true),
        ],
    )
}

// ---------------------------------------------------------------------------------------------
// Line charts: one stream across a WAN

/// How a system's line looks.
struct Style {
    system: &'static str,
    label: &'static str,
    color: &'static str,
    width: f64,
    dash: &'static str,
    shape: Shape,
}

const STYLES: &[Style] = &[
    Style { system: H2, label: "seedgate h2", color: SEEDGATE, width: 2.5, dash: "", shape: Shape::Circle },
    Style { system: QUIC, label: "seedgate QUIC", color: "#7b1fa2", width: 2.5, dash: "", shape: Shape::Square },
    Style {
        system: "rathole (tcp)",
        label: "rathole tcp",
        color: ANCHOR,
        width: 1.5,
        dash: "",
        shape: Shape::Triangle,
    },
    Style { system: "ssh -R", label: "ssh -R", color: "#ef6c00", width: 1.5, dash: "", shape: Shape::Diamond },
    Style {
        system: "direct TCP (bbr)",
        label: "direct TCP, BBR",
        color: DIRECT,
        width: 1.5,
        dash: "6 3",
        shape: Shape::None,
    },
    Style {
        system: "direct TCP (cubic)",
        label: "direct TCP, Cubic",
        color: "#9e9e9e",
        width: 1.5,
        dash: "2 3",
        shape: Shape::None,
    },
];

/// The style of a system [`STYLES`] does not list (labelled with its own name).
const OTHER: Style = Style { system: "", label: "", color: "#9e9e9e", width: 1.2, dash: "", shape: Shape::Cross };

/// One panel of a line chart: systems' figures against a parameter.
struct Lines<'a> {
    title: String,
    /// The x axis: its ticks (value, label) and where it ends.
    ticks: Vec<(f64, String)>,
    x_max: f64,
    /// A reference drawn across (the link's rate).
    reference: Option<(f64, &'a str)>,
    unit: &'a str,
    /// Per style, its points (x, y).
    lines: Vec<(&'a Style, Vec<(f64, f64)>)>,
}

const LINES_H: f64 = 190.0;

/// One panel at (x, y); returns its height.
fn line_panel(svg: &mut Svg, p: &Lines<'_>, x: f64, y: f64) -> f64 {
    svg.text(x, y + 13.0, 12.5, BOLD, &p.title);
    let (left, top, w, h) = (x + 44.0, y + 34.0, PANEL_W - 56.0, LINES_H - 66.0);
    let y_max = (p.lines.iter().flat_map(|(_, pts)| pts.iter().map(|(_, v)| *v)))
        .chain(p.reference.map(|(v, _)| v))
        .fold(0.0, f64::max)
        * 1.1;
    let step = nice_step(y_max, 4.0);
    let px = |v: f64| left + v / p.x_max * w;
    let py = |v: f64| top + h - v / y_max.max(f64::MIN_POSITIVE) * h;
    let mut t = 0.0;
    while t <= y_max {
        svg.line(&[(left, py(t)), (left + w, py(t))], GRID, 1.0, "");
        svg.text(left - 5.0, py(t) + 4.0, 10.0, &format!("{RIGHT}{FAINT}"), &fmt_num(t));
        t += step;
    }
    svg.text(x, top - 8.0, 10.0, FAINT, p.unit);
    svg.line(&[(left, top + h), (left + w, top + h)], "#999", 1.0, "");
    for (v, label) in &p.ticks {
        svg.line(&[(px(*v), top + h), (px(*v), top + h + 4.0)], "#999", 1.0, "");
        svg.text(px(*v), top + h + 16.0, 10.0, &format!("{MIDDLE}{FAINT}"), label);
    }
    if let Some((v, label)) = p.reference {
        svg.line(&[(left, py(v)), (left + w, py(v))], "#bdbdbd", 1.0, "1 2");
        svg.text(left + w, py(v) - 4.0, 10.0, &format!("{RIGHT}{FAINT}"), label);
    }
    // Seedgate's lines last, on top.
    for (style, pts) in p.lines.iter().rev() {
        let pts: Vec<(f64, f64)> = pts.iter().map(|&(a, b)| (px(a), py(b))).collect();
        svg.line(&pts, style.color, style.width, style.dash);
        for &(a, b) in &pts {
            svg.marker(style.shape, a, b, style.color);
        }
    }
    LINES_H
}

/// One stream up and down across the emulated WAN, by round trip at each link rate and by random
/// loss, through every system.
fn wan<'a>(res: &'a Results) -> Result<String, String> {
    // (profile, up or down, system, median)
    let mut seen: Vec<(WanProfile, usize, &str, f64)> = Vec::new();
    for (dir, id) in WAN_ONE_STREAM.iter().enumerate() {
        for m in res.metrics.iter().filter(|m| m.scenario == id.scenario && m.id.as_deref() == Some(id.key)) {
            let Some(p) = WanProfile::parse(&m.name) else { continue };
            seen.extend(m.rows.iter().filter_map(|r| Some((p, dir, r.system.as_str(), r.median()?))));
        }
    }
    if seen.is_empty() {
        return Err("no one-stream figures of wan in these results".to_owned());
    }
    // The systems measured, in the order of their styles; one without a style of its own last, in grey.
    let mut styles: Vec<(&Style, &str)> =
        (STYLES.iter()).filter(|s| seen.iter().any(|(_, _, sys, _)| *sys == s.system)).map(|s| (s, s.system)).collect();
    for (_, _, sys, _) in &seen {
        if !styles.iter().any(|(_, s)| s == sys) {
            styles.push((&OTHER, sys));
        }
    }
    let mut rates: Vec<f64> = seen.iter().filter(|(p, ..)| p.loss_pct == 0.0).map(|(p, ..)| p.mbit).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    // The first path measured with loss, beside its measurement without.
    let lossy = seen.iter().find(|(p, ..)| p.loss_pct > 0.0).map(|(p, ..)| (p.rtt_ms, p.mbit));
    const DIRS: [&str; 2] = ["up", "down"];
    let rtts = |on: &dyn Fn(&WanProfile) -> bool| {
        let mut v: Vec<u32> = seen.iter().filter(|(p, ..)| on(p)).map(|(p, ..)| p.rtt_ms).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let panel = |title: String,
                 ticks: Vec<(f64, String)>,
                 x_max: f64,
                 rate: f64,
                 dir: usize,
                 x_of: &dyn Fn(&WanProfile) -> Option<f64>| {
        let lines = (styles.iter())
            .map(|&(style, system)| {
                let mut pts: Vec<(f64, f64)> = (seen.iter())
                    .filter(|(_, d, sys, _)| *d == dir && *sys == system)
                    .filter_map(|(p, _, _, v)| Some((x_of(p)?, *v)))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                (style, pts)
            })
            .collect();
        Lines { title, ticks, x_max, reference: Some((rate, "link rate")), unit: "Mbit/s", lines }
    };
    let mut rows: Vec<[Lines<'_>; 2]> = Vec::new();
    for &rate in &rates {
        let on = |p: &WanProfile| p.loss_pct == 0.0 && p.mbit == rate;
        let ticks: Vec<(f64, String)> = rtts(&on).into_iter().map(|r| (f64::from(r), format!("{r} ms"))).collect();
        let x_max = ticks.iter().map(|t| t.0).fold(0.0, f64::max) * 1.08;
        rows.push(DIRS.map(|d| {
            let dir = usize::from(d == "down");
            let title = format!("one stream {d}, {} Mbit/s link, by round trip", fmt_num(rate));
            panel(title, ticks.clone(), x_max, rate, dir, &|p| on(p).then_some(f64::from(p.rtt_ms)))
        }));
    }
    if let Some((rtt, rate)) = lossy {
        let on = |p: &WanProfile| p.rtt_ms == rtt && p.mbit == rate;
        let mut losses: Vec<f64> = seen.iter().filter(|(p, ..)| on(p)).map(|(p, ..)| p.loss_pct).collect();
        losses.sort_by(f64::total_cmp);
        losses.dedup();
        let ticks: Vec<(f64, String)> = losses.iter().map(|&l| (l, format!("{l} %"))).collect();
        let x_max = losses.last().copied().unwrap_or(1.0) * 1.15;
        rows.push(DIRS.map(|d| {
            let dir = usize::from(d == "down");
            let title = format!("one stream {d}, {rtt} ms, {} Mbit/s, by random loss", fmt_num(rate));
            panel(title, ticks.clone(), x_max, rate, dir, &|p| on(p).then_some(p.loss_pct))
        }));
    }
    let title = "One stream across a WAN: throughput by round trip and by loss";
    let mut svg = Svg::default();
    let label = |(style, system): &(&Style, &'a str)| if style.system.is_empty() { *system } else { style.label };
    let legend: Vec<(Key<'_>, &str)> = styles.iter().map(|s| (Key::Line(s.0), label(s))).collect();
    let lines = [
        provenance(res, &["wan"], true),
        "an emulated link with a bottleneck queue, the same for every system in the same run; one stream each"
            .to_owned(),
    ];
    let mut y = header(&mut svg, title, &lines, &legend);
    for row in &rows {
        for (i, p) in row.iter().enumerate() {
            line_panel(&mut svg, p, MARGIN + i as f64 * (PANEL_W + MARGIN), y);
        }
        y += LINES_H;
    }
    Ok(svg.finish(title, y))
}

// ---------------------------------------------------------------------------------------------
// Timelines: the dials through a fault

const SERVED: &str = "#2e7d32";
const REFUSED: &str = "#f9a825";
const UNANSWERED: &str = "#c62828";
const RESUMED: &str = "#212121";
const FIRST_SERVED: &str = SERVED;
const DOWN: &str = "#e3e7ea";
const TIMELINE_H: f64 = 108.0;

/// What each fault did over time, over each transport: when the path was down, each dial made
/// meanwhile (when, how long it waited, what it got), and when the open stream and the dials
/// came back after the heal.
fn faults(res: &Results) -> Result<String, String> {
    let all: Vec<&Timeline> = res.timelines.iter().filter(|t| t.scenario == FAULTS).collect();
    if all.is_empty() {
        return Err("no faults timelines in these results (bench faults records them)".to_owned());
    }
    let mut names: Vec<&str> = Vec::new();
    for t in &all {
        if !names.contains(&t.name.as_str()) {
            names.push(&t.name);
        }
    }
    let title = "Faults on the path: each dial through the tunnel, over time";
    let mut svg = Svg::default();
    let legend = [
        (Key::Box(DOWN), "path down"),
        (Key::Point(Shape::Circle, SERVED), "dial served"),
        (Key::Point(Shape::Circle, REFUSED), "refused with a reason"),
        (Key::Point(Shape::Cross, UNANSWERED), "unanswered"),
        (Key::Point(Shape::Down, RESUMED), "open stream carries bytes again"),
        (Key::Point(Shape::Down, FIRST_SERVED), "first dial served after the heal"),
    ];
    let lines = [
        provenance(res, &[FAULTS], false),
        "a dial's height: how long it waited for its answer (the client gives up at 4 s)".to_owned(),
    ];
    let mut y = header(&mut svg, title, &lines, &legend);
    let fit = ((MAX_HEIGHT - 4.0 - y) / TIMELINE_H).floor().max(0.0) as usize;
    if names.len() > fit {
        svg.text(
            WIDTH - MARGIN,
            22.0,
            11.0,
            &format!("{RIGHT}{FAINT}"),
            &format!("the first {fit} of {} faults", names.len()),
        );
        names.truncate(fit);
    }
    for name in names {
        let row: Vec<&&Timeline> = all.iter().filter(|t| t.name == name).take(2).collect();
        // One time axis for the row, so that its transports compare.
        let end = (row.iter())
            .flat_map(|t| {
                let marks = t.marks.iter().map(|m| m.at);
                marks.chain(t.requests.iter().map(|r| r.at + r.waited)).chain(t.down.iter().map(|d| d.1))
            })
            .fold(1.0, f64::max);
        let x_max = end * 1.04;
        for (i, t) in row.iter().enumerate() {
            timeline_panel(&mut svg, t, x_max, MARGIN + i as f64 * (PANEL_W + MARGIN), y);
        }
        y += TIMELINE_H;
    }
    Ok(svg.finish(title, y + 4.0))
}

/// One timeline at (x, y), its time axis `0..x_max` s.
fn timeline_panel(svg: &mut Svg, t: &Timeline, x_max: f64, x: f64, y: f64) {
    let short = STYLES.iter().find(|s| s.system == t.system).map_or(t.system.as_str(), |s| s.label);
    svg.text(x, y + 13.0, 12.5, BOLD, &format!("{}, {short}", t.name));
    let healed = t.marks.iter().find(|m| m.what == Moment::Healed).map(|m| m.at);
    let after = |what: Moment| {
        let at = t.marks.iter().find(|m| m.what == what)?.at;
        Some(format!("{:.2} s", at - healed?))
    };
    let never = || "none".to_owned();
    let note = format!(
        "after the heal: the open stream back in {}, the first dial served in {}",
        after(Moment::StreamResumed).unwrap_or_else(never),
        after(Moment::FirstServed).unwrap_or_else(never)
    );
    svg.text(x, y + 27.0, 10.5, FAINT, &note);
    let (left, top, w, h) = (x + 30.0, y + 40.0, PANEL_W - 40.0, 46.0);
    // Whole seconds, at least the client's 4 s of patience.
    let y_max = t.requests.iter().map(|r| r.waited).fold(4.0, f64::max).ceil();
    let px = |s: f64| left + s / x_max * w;
    let py = |s: f64| top + h - s / y_max * h;
    for &(a, b) in &t.down {
        svg.rect(px(a), top, (px(b) - px(a)).max(0.5), h, DOWN);
    }
    for s in [0.0, y_max / 2.0, y_max] {
        svg.line(&[(left, py(s)), (left + w, py(s))], GRID, 0.8, "");
        svg.text(left - 4.0, py(s) + 3.5, 9.5, &format!("{RIGHT}{FAINT}"), &format!("{} s", fmt_num(s)));
    }
    svg.line(&[(left, top + h), (left + w, top + h)], "#999", 1.0, "");
    let step = nice_step(x_max, 6.0);
    let mut s = 0.0;
    while s <= x_max {
        svg.line(&[(px(s), top + h), (px(s), top + h + 3.0)], "#999", 1.0, "");
        svg.text(px(s), top + h + 13.0, 9.5, &format!("{MIDDLE}{FAINT}"), &format!("{} s", fmt_num(s)));
        s += step;
    }
    for r in &t.requests {
        let (shape, color) = match r.outcome {
            Answer::Served => (Shape::Circle, SERVED),
            Answer::Refused => (Shape::Circle, REFUSED),
            Answer::Unanswered => (Shape::Cross, UNANSWERED),
        };
        svg.marker(shape, px(r.at), py(r.waited.min(y_max)), color);
    }
    for m in &t.marks {
        let color = match m.what {
            Moment::Healed => continue,
            Moment::StreamResumed => RESUMED,
            Moment::FirstServed => FIRST_SERVED,
        };
        svg.marker(Shape::Down, px(m.at), top, color);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Better, Mark, Request, ScenarioRun};

    /// Every figure each chart reads, a few systems each, and one timeline.
    fn fixture(odd: &str) -> Results {
        let mut r = Results::default();
        let mut add = |sc: &str, name: &str, unit: &str, better: Better, rows: &[(&str, Kind, f64)]| {
            let m = r.metric(sc, name, unit, better);
            for &(sys, kind, v) in rows {
                r.add(m, sys, kind, v);
                r.add(m, sys, kind, v * 1.1);
            }
        };
        let routers = |a: f64| {
            [("direct", Kind::Direct, a * 2.0), ("sni-router", Kind::Seedgate, a), ("haproxy", Kind::Anchor, a * 0.7)]
        };
        for (sc, name) in [
            ("sni-bulk", "bulk, 1 stream"),
            ("sni-bulk", "bulk, 64 streams"),
            ("sni-connrate", "full-TLS connections/s (32 concurrent)"),
            ("sni-connrate", "time to first byte p50 at 200 conn/s"),
            ("sni-connrate", "time to first byte p99 at 200 conn/s"),
            ("proxy-protocol", "PROXY-v2 listener alone, connections/s (32 concurrent)"),
            ("connect", "CONNECT opens/s (32 concurrent)"),
            ("idle-memory", "SNI passthrough: RSS per idle connection, 300 held"),
        ] {
            add(sc, name, odd, Better::Higher, &routers(10.0));
        }
        let tunnels = [
            (H2, Kind::Seedgate, 6.0),
            (QUIC, Kind::Seedgate, 5.0),
            ("rathole (tcp)", Kind::Anchor, 5.5),
            (odd, Kind::Anchor, 1.0),
        ];
        for name in [
            "bulk upload, 1 stream",
            "bulk upload, 64 streams",
            "download, 50 streams",
            "download, 50 streams + 1 stalled reader",
            "head-of-line ratio (with stalled ÷ without)",
            "CPU per GB moved, bulk upload 1 stream (both ends)",
            "new connections/s, small requests (32 concurrent)",
            "memory per open stream at 100 streams (both ends)",
            "memory per open stream at 1000 streams (both ends)",
        ] {
            add("tunnel", name, "Gbit/s", Better::Higher, &tunnels);
        }
        let failed = r.metrics.iter().position(|m| m.name.contains("1000 streams")).map(crate::report::MetricId);
        if let Some(m) = failed {
            r.note(
                m,
                "ssh -R",
                Kind::Anchor,
                "error: 4191 of 1000 connections opened before the first failure: timed out",
            );
            r.note(m, "rathole (tls)", Kind::Anchor, &format!("error: {odd}"));
        }
        for (rtt, mbit, loss) in [(50, 100.0, 0.0), (300, 100.0, 0.0), (50, 300.0, 0.0), (50, 100.0, 1.0)] {
            let p = WanProfile { rtt_ms: rtt, mbit, loss_pct: loss };
            for id in WAN_ONE_STREAM {
                let m = r.figure_at(id, "x", &format!("{}: {}", p_name(&p), id.key), "Mbit/s", Better::Higher);
                for (sys, kind, v) in [
                    ("direct TCP (bbr)", Kind::Direct, mbit * 0.9),
                    (H2, Kind::Seedgate, mbit * 0.95),
                    (odd, Kind::Anchor, 20.0),
                ] {
                    r.add(m, sys, kind, v);
                }
            }
        }
        for sys in [H2, QUIC] {
            r.timelines.push(Timeline {
                scenario: FAULTS.to_owned(),
                name: format!("black hole 5 s {odd}"),
                system: sys.to_owned(),
                kind: Kind::Seedgate,
                down: vec![(0.0, 5.0)],
                requests: (0..5)
                    .map(|i| Request {
                        at: f64::from(i),
                        waited: if i == 0 { 2.0 } else { 0.01 },
                        outcome: if i == 4 { Answer::Unanswered } else { Answer::Refused },
                    })
                    .chain([Request { at: 5.4, waited: 0.05, outcome: Answer::Served }])
                    .collect(),
                marks: vec![
                    Mark { at: 5.0, what: Moment::Healed },
                    Mark { at: 5.5, what: Moment::StreamResumed },
                    Mark { at: 5.4, what: Moment::FirstServed },
                ],
            });
        }
        r.runs.push(ScenarioRun {
            scenario: "tunnel".into(),
            date_utc: "2026-01-02 03:04 UTC".into(),
            loadavg_start: String::new(),
            loadavg_end: String::new(),
            repeats: 2,
            window_s: 1.0,
            smoke: false,
            seconds: 1.0,
            glibc_tunables: None,
            completed: true,
        });
        r
    }

    /// The profile's name as the wan scenario writes it.
    fn p_name(p: &WanProfile) -> String {
        let mut n = format!("{} ms, {} Mbit/s", p.rtt_ms, fmt_num(p.mbit));
        if p.loss_pct > 0.0 {
            n.push_str(&format!(", {} % loss", p.loss_pct));
        }
        n
    }

    /// The SVG's `height` attribute.
    fn height(svg: &str) -> f64 {
        let h = svg.split("height=\"").nth(1).and_then(|s| s.split('"').next()).expect("a height");
        h.parse().expect("a number")
    }

    /// Every element closed in order, no script, no external reference.
    fn well_formed(name: &str, svg: &str) {
        let mut open: Vec<&str> = Vec::new();
        let mut rest = svg;
        while let Some(at) = rest.find('<') {
            let tag =
                &rest[at + 1..rest[at..].find('>').map(|e| at + e).unwrap_or_else(|| panic!("{name}: unclosed <"))];
            rest = &rest[at + 1 + tag.len()..];
            let tag_name = tag.trim_start_matches('/').split([' ', '/']).next().unwrap_or("");
            if let Some(closing) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(closing.trim()), "{name}: </{closing}> closes another element");
            } else if !tag.ends_with('/') {
                open.push(tag_name);
            }
        }
        assert!(open.is_empty(), "{name}: left open: {open:?}");
        for banned in ["<script", "href", "url(", "@import", "<image", "<foreignObject"] {
            assert!(!svg.contains(banned), "{name} contains {banned}");
        }
        assert!(svg.contains(r#"font-family="sans-serif""#), "{name}: a generic font family");
    }

    #[test]
    fn each_chart_draws_from_a_small_fixture_under_1000_px_and_escapes_its_text() {
        let odd = "x<y> & \"z\"";
        let res = fixture(odd);
        let charts = all(&res);
        assert_eq!(
            charts.iter().map(|c| c.0).collect::<Vec<_>>(),
            ["gateway.svg", "tunnel.svg", "wan.svg", "faults.svg"]
        );
        for (name, svg) in charts {
            let svg = svg.unwrap_or_else(|e| panic!("{name}: {e}"));
            well_formed(name, &svg);
            let h = height(&svg);
            assert!(h > 100.0 && h < MAX_HEIGHT, "{name}: {h} px tall");
            assert!(svg.contains(r#"width="800""#), "{name}");
            assert!(svg.contains("x&lt;y&gt; &amp; &quot;z&quot;"), "{name} shows the odd text escaped:\n{svg}");
            assert!(!svg.contains("x<y>"), "{name} has the odd text unescaped");
        }
        let tunnel = tunnel(&res).unwrap();
        // The bigger of the two stream counts, with the anchor that failed at it.
        assert!(tunnel.contains("memory per open stream at 1000 streams (both ends)"), "{tunnel}");
        assert!(tunnel.contains("failed: 4191 of 1000 connections opened<"), "{tunnel}");
        let gateway = gateway(&res).unwrap();
        // Added time: the system's median less direct's (10.5 less 21).
        assert!(gateway.contains(">−10.5 x&lt;y&gt; &amp; &quot;z&quot;<"), "{gateway}");
        assert!(!gateway.contains("not in these results"), "{gateway}");
        // Only the runs of the chart's scenarios.
        assert!(tunnel.contains("bench tunnel · 2026-01-02 · medians of 2<"), "{tunnel}");
        assert!(!gateway.contains("2026"), "{gateway}");
    }

    #[test]
    fn a_chart_whose_figures_are_absent_is_not_drawn_and_says_why() {
        for (name, chart) in all(&Results::default()) {
            let why = chart.expect_err(name);
            assert!(why.contains("in these results"), "{name}: {why}");
        }
        let mut only_tunnel = fixture("o");
        only_tunnel.metrics.retain(|m| m.scenario == "tunnel");
        only_tunnel.timelines.clear();
        let drawn: Vec<&str> = all(&only_tunnel).into_iter().filter(|c| c.1.is_ok()).map(|c| c.0).collect();
        assert_eq!(drawn, ["tunnel.svg"]);
    }

    /// The committed charts are what `bench report --charts docs/images` draws from the committed
    /// results, and no other chart is there.
    #[test]
    fn the_committed_charts_are_drawn_from_the_committed_results() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let json = std::fs::read(root.join("bench/results/latest.json")).expect("the committed results");
        let v: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
        let res: Results = serde_json::from_value(v["results"].clone()).expect("results");
        let dir = root.join("docs/images");
        let update = std::env::var_os("SEEDGATE_UPDATE_DOCS").is_some();
        let mut stale = Vec::new();
        for (name, chart) in all(&res) {
            let path = dir.join(name);
            let have = std::fs::read_to_string(&path).ok();
            let want = chart.ok();
            if have == want {
                continue;
            }
            if update {
                match &want {
                    Some(svg) => std::fs::write(&path, svg).expect("writing the chart"),
                    None => std::fs::remove_file(&path).expect("removing the chart"),
                }
            } else {
                stale.push(name);
            }
        }
        assert!(
            stale.is_empty(),
            "docs/images/{stale:?} differ from what the committed results draw: run\n  cargo run -p bench -- report \
             --charts docs/images\n(or SEEDGATE_UPDATE_DOCS=1 cargo test -p bench charts::) and commit the result"
        );
    }
}
