//! The status page every binary serves on its admin listener — `/status` (its typed status as versioned JSON) and `/` (HTML over the same data) — with one renderer: the page's table model, the escaping, the assets and the Content-Security-Policy.
//!
//! A binary builds its typed status (serde structs with a [`Header`]) and names, in a static
//! [`Page`], which arrays of that JSON are tables and which fields their columns. The server
//! renders the page from the JSON and the [`Page`] (readable without JavaScript: tables, a
//! `<details>` per row with nested rows, a filter form, paging links); `status.js` reads the same
//! [`Page`] from the page and re-renders the tables from `/status` every two seconds, with
//! sorting and live filtering. What a peer sent (an agent's node name, a client's SNI) is data:
//! escaped here, set with `textContent` there.

use serde::Serialize;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The version of every binary's `/status` document: a change that removes or renames a field,
/// or changes its meaning, bumps it.
pub const VERSION: u32 = 1;

/// Rows of the paged table a request gets unless it asks (`?limit=`).
pub const DEFAULT_LIMIT: usize = 100;
/// The most rows of the paged table one request gets.
pub const MAX_LIMIT: usize = 1000;

/// The script and style of the page, served from the binary.
pub const SCRIPT: &str = include_str!("status/status.js");
pub const STYLE: &str = include_str!("status/status.css");

/// The Content-Security-Policy of the page and its assets: nothing but this origin's script,
/// style and `/status`; no inline script or style, no frames.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                       connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// How a state word colours its row, as haproxy colours its servers: each word and its class.
pub const STATES: &[(&str, &str)] = &[
    ("up", "up"),
    ("active", "up"),
    ("healthy", "up"),
    ("connected", "up"),
    ("listening", "up"),
    ("serving", "up"),
    ("suspect", "warn"),
    ("doubted", "warn"),
    ("superseded", "warn"),
    ("degraded", "warn"),
    ("backoff", "warn"),
    ("connecting", "warn"),
    ("draining", "drain"),
    ("down", "down"),
    ("fenced", "down"),
    ("no-agents", "down"),
    ("not-connected", "down"),
    ("failed", "down"),
    ("hibernated", "idle"),
    ("parked", "idle"),
    ("idle", "idle"),
];

/// The class of a state word (`idle` for words it does not know).
pub fn state_class(word: &str) -> &'static str {
    STATES.iter().find(|(w, _)| *w == word).map_or("idle", |(_, c)| c)
}

/// How a column shows its value (the same in the server's rendering and in `status.js`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// A string as it is (escaped).
    Text,
    /// A number.
    Int,
    /// A number of bytes: `512 B`, `1.5 KiB`, `3.0 MiB`.
    Bytes,
    /// A number of seconds: `45s`, `3m 12s`, `2h 5m`, `3d 4h`.
    Secs,
    /// A state word, coloured by [`STATES`].
    State,
    /// An object of counts (`{"no_agent": 3}`; a value that is an array is summed): the largest
    /// first, `no_agent 3, refused 1`.
    Counts,
    /// An array of per-minute counts, oldest first: `last / all` (the current minute's and the
    /// window's).
    Series,
    /// `yes` or `no`.
    Bool,
    /// An array of strings, comma-separated.
    List,
}

/// One column (or one summary line): where its value is in the row (a dotted path) and how it
/// shows.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Field {
    pub key: &'static str,
    pub label: &'static str,
    pub format: Format,
}

/// A column.
pub const fn col(key: &'static str, label: &'static str, format: Format) -> Field {
    Field { key, label, format }
}

/// One table of the page: the array `key` of the status document, a row per element.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Table {
    pub key: &'static str,
    pub title: &'static str,
    /// The field that names a row (its open `<details>` are kept across refreshes by it).
    pub row_key: &'static str,
    /// The field whose state word colours the row; empty: none.
    pub state: &'static str,
    pub columns: &'static [Field],
    /// Rows of each row: the array `nested.key` of the row, shown in a `<details>` under it.
    pub nested: Option<&'static Table>,
    /// The document's `page` (offset, limit, totals) is this table's.
    pub paged: bool,
    /// What the table says when it has no row.
    pub empty: &'static str,
}

/// A binary's page: its summary lines (paths from the document's root) and its tables.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Page {
    pub title: &'static str,
    pub summary: &'static [Field],
    pub tables: &'static [Table],
}

/// What every binary's status document starts with.
#[derive(Debug, Clone, Serialize)]
pub struct Header {
    /// [`VERSION`].
    pub version: u32,
    /// `sni-router`, `proxy-server` or `proxy-agent`.
    pub binary: &'static str,
    /// When the document was made (Unix time, milliseconds).
    pub generated_at_ms: u64,
    /// Seconds since the process started.
    pub uptime_s: u64,
    /// The minutes the per-minute series cover (the last element is the current minute).
    pub minutes: usize,
}

/// When the process started (the first call: the lifecycle makes it at bind).
pub fn started() -> Instant {
    static STARTED: OnceLock<Instant> = OnceLock::new();
    *STARTED.get_or_init(Instant::now)
}

impl Header {
    pub fn new(binary: &'static str) -> Self {
        let generated_at_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        Self {
            version: VERSION,
            binary,
            generated_at_ms,
            uptime_s: started().elapsed().as_secs(),
            minutes: super::minutes::MINUTES,
        }
    }
}

/// Which rows the paged table holds, and how many there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Paging {
    pub offset: usize,
    pub limit: usize,
    /// Rows before any filter.
    pub total: usize,
    /// Rows the filter kept.
    pub matched: usize,
    /// Rows in this document.
    pub returned: usize,
}

/// What a request for the status asks: a filter (`q`, a substring; or an exact name such as
/// `cluster=`), and a page of the paged table (`limit`, `offset`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusQuery {
    params: Vec<(String, String)>,
    pub limit: usize,
    pub offset: usize,
}

impl StatusQuery {
    /// Read a query string (`a=b&c=d`, percent- and `+`-encoded); bad numbers fall back to the
    /// defaults, and `limit` is held within [`MAX_LIMIT`].
    pub fn parse(query: Option<&str>) -> Self {
        let decode = |s: &str| -> String {
            let s = s.replace('+', " ");
            percent_encoding::percent_decode_str(&s).decode_utf8_lossy().into_owned()
        };
        let params: Vec<(String, String)> = query
            .unwrap_or_default()
            .split('&')
            .filter(|kv| !kv.is_empty())
            .take(32)
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (decode(k), decode(v)),
                None => (decode(kv), String::new()),
            })
            .collect();
        let num = |k: &str| params.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.trim().parse::<usize>().ok());
        let limit = num("limit").unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
        Self { limit, offset: num("offset").unwrap_or(0), params }
    }

    /// The value of parameter `key` (the first; empty values count as absent).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }

    /// The substring filter `q`, lower-cased.
    pub fn needle(&self) -> Option<String> {
        self.get("q").map(str::to_lowercase)
    }

    /// Whether any of `texts` contains the filter `q` (case aside); true without one.
    pub fn matches<'a>(&self, texts: impl IntoIterator<Item = &'a str>) -> bool {
        let Some(q) = self.needle() else { return true };
        texts.into_iter().any(|t| t.to_lowercase().contains(&q))
    }

    /// This request's page of `matched` (the rows the filter kept, out of `total`).
    pub fn page<T>(&self, matched: Vec<T>, total: usize) -> (Vec<T>, Paging) {
        let n = matched.len();
        let rows: Vec<T> = matched.into_iter().skip(self.offset).take(self.limit).collect();
        let paging = Paging { offset: self.offset, limit: self.limit, total, matched: n, returned: rows.len() };
        (rows, paging)
    }

    /// The query string with `offset` set to `offset` (for the paging links).
    fn with_offset(&self, offset: usize) -> String {
        let enc = |s: &str| percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string();
        let mut parts: Vec<String> =
            self.params.iter().filter(|(k, _)| k != "offset").map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect();
        parts.push(format!("offset={offset}"));
        format!("?{}", parts.join("&"))
    }
}

/// A binary's typed status document: serialised straight to `/status`'s text (no JSON tree in
/// between: at ten thousand sessions that tree costs as much as the text), or made a tree for
/// the page's rendering.
pub trait Document: Send {
    fn to_json(&self) -> String;
    fn to_tree(&self) -> Value;
}

impl<T: Serialize + Send> Document for T {
    fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
    fn to_tree(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// What a binary's status hook answers: its document and its page.
pub struct StatusPage {
    pub doc: Box<dyn Document>,
    pub page: &'static Page,
}

impl StatusPage {
    pub fn new(doc: impl Document + 'static, page: &'static Page) -> Self {
        Self { doc: Box::new(doc), page }
    }
}

impl std::fmt::Debug for StatusPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusPage").field("page", &self.page.title).finish_non_exhaustive()
    }
}

/// One series of a metric: its labels and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Reading {
    /// The value of label `name` (empty when absent).
    pub fn label(&self, name: &str) -> &str {
        self.labels.iter().find(|(n, _)| n == name).map_or("", |(_, v)| v.as_str())
    }
}

/// Every series of the counters or gauges `c` holds, read without creating any (as
/// `with_label_values` would): what a status page derives from the metrics a process keeps.
pub fn readings(c: &dyn prometheus::core::Collector) -> Vec<Reading> {
    let mut out = Vec::new();
    use prometheus::proto::MetricType;
    for family in c.collect() {
        let kind = family.get_field_type();
        for m in family.get_metric() {
            let value = match kind {
                MetricType::COUNTER => m.get_counter().get_value(),
                MetricType::GAUGE => m.get_gauge().get_value(),
                _ => continue,
            };
            let labels = m.get_label().iter().map(|l| (l.name().to_owned(), l.value().to_owned())).collect();
            out.push(Reading { labels, value });
        }
    }
    out
}

/// The values of `readings` whose label `filter.0` is `filter.1` (all, with `None`), summed by
/// their label `by`.
pub fn sum_by(readings: &[Reading], filter: Option<(&str, &str)>, by: &str) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for r in readings {
        if filter.is_some_and(|(k, v)| r.label(k) != v) {
            continue;
        }
        *out.entry(r.label(by).to_owned()).or_insert(0) += r.value as u64;
    }
    out.retain(|_, n| *n > 0);
    out
}

/// The values of `readings` summed by their label `by`, for each value of their label `key`
/// (in one pass: a page of a thousand rows looks each up instead of filtering every series).
pub fn group_by(
    readings: &[Reading],
    key: &str,
    by: &str,
) -> std::collections::HashMap<String, std::collections::BTreeMap<String, u64>> {
    let mut out: std::collections::HashMap<String, std::collections::BTreeMap<String, u64>> = Default::default();
    for r in readings.iter().filter(|r| r.value > 0.0) {
        *out.entry(r.label(key).to_owned()).or_default().entry(r.label(by).to_owned()).or_insert(0) += r.value as u64;
    }
    out
}

/// `s` with `&`, `<`, `>`, `"` and `'` escaped for HTML text and attribute values.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.contains(['&', '<', '>', '"', '\'']) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// The value at the dotted `path` of `v` (`Null` when absent).
pub fn lookup<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').try_fold(v, |v, k| v.get(k)).unwrap_or(&Value::Null)
}

/// A number of bytes as the page shows it.
pub fn fmt_bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024.0 {
        return format!("{n:.0} B");
    }
    let mut v = n / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// A number of seconds as the page shows it.
pub fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

/// A Unix time in milliseconds as `YYYY-MM-DD hh:mm:ss UTC`.
pub fn fmt_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86400, secs % 86400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rest / 3600, rest % 3600 / 60, rest % 60)
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn sum(v: &Value) -> f64 {
    match v {
        Value::Array(a) => a.iter().map(num).sum(),
        v => num(v),
    }
}

/// A cell: its text, and the number it sorts by (`None`: by its text).
pub fn cell(format: Format, v: &Value) -> (String, Option<f64>) {
    match format {
        Format::Text | Format::State => (text_of(v), None),
        Format::Int => match v {
            Value::Null => (String::new(), Some(-1.0)),
            v => (text_of(v), Some(num(v))),
        },
        Format::Bytes => (fmt_bytes(num(v)), Some(num(v))),
        Format::Secs => match v {
            Value::Null => (String::new(), Some(-1.0)),
            v => (fmt_secs(num(v)), Some(num(v))),
        },
        Format::Counts => {
            let mut counts: Vec<(&String, f64)> = v
                .as_object()
                .map(|o| o.iter().map(|(k, v)| (k, sum(v))).filter(|(_, n)| *n > 0.0).collect())
                .unwrap_or_default();
            counts.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            let total = counts.iter().map(|(_, n)| n).sum();
            let text: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
            // Counted but none yet reads `0`; a count the document does not have stays blank.
            match text.is_empty() && v.is_object() {
                true => ("0".into(), Some(total)),
                false => (text.join(", "), Some(total)),
            }
        }
        Format::Series => {
            let a = v.as_array().map(Vec::as_slice).unwrap_or_default();
            let last = a.last().map(num).unwrap_or(0.0);
            let all: f64 = a.iter().map(num).sum();
            (format!("{last} / {all}"), Some(all))
        }
        Format::Bool => match v.as_bool() {
            Some(true) => ("yes".into(), Some(1.0)),
            Some(false) => ("no".into(), Some(0.0)),
            None => (String::new(), Some(-1.0)),
        },
        Format::List => {
            let a = v.as_array().map(Vec::as_slice).unwrap_or_default();
            (a.iter().map(text_of).collect::<Vec<_>>().join(", "), None)
        }
    }
}

fn text_of(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// The spec `status.js` reads from the page: the [`Page`] and the state classes.
#[derive(Serialize)]
struct Spec<'a> {
    page: &'a Page,
    states: &'a [(&'a str, &'a str)],
}

/// The HTML page of `doc` as `page` lays it out, for the request `query`.
pub fn render(page: &Page, doc: &Value, query: &StatusQuery) -> String {
    let mut h = String::with_capacity(64 * 1024);
    let binary = escape(page.title);
    let at = lookup(doc, "generated_at_ms").as_u64().unwrap_or(0);
    let spec = serde_json::to_string(&Spec { page, states: STATES }).unwrap_or_default().replace('<', "\\u003c");
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{binary} status</title><link rel=\"icon\" href=\"data:,\"><link rel=\"stylesheet\" href=\"/status.css\">\
         <script src=\"/status.js\" defer></script></head>\n<body>\n\
         <script type=\"application/json\" id=\"spec\">{spec}</script>\n\
         <header><h1>seedgate {binary}</h1>\
         <p class=\"updated\">updated at <time id=\"updated\" data-ms=\"{at}\">{}</time> \
         <span id=\"refresh\">(reload the page to refresh)</span></p>\
         <form method=\"get\" action=\"/\" class=\"filter\"><input type=\"search\" id=\"filter\" name=\"q\" \
         value=\"{}\" placeholder=\"filter\" aria-label=\"filter\"> <button type=\"submit\">filter</button></form>\
         </header>\n<main>\n",
        fmt_time(at),
        escape(query.get("q").unwrap_or_default()),
    );
    render_summary(&mut h, page, doc);
    for t in page.tables {
        render_table(&mut h, t, doc, query);
    }
    h.push_str("</main>\n<footer>JSON: <a href=\"/status\">/status</a> · <a href=\"/metrics\">/metrics</a> · <a href=\"/readyz?verbose\">/readyz?verbose</a></footer>\n</body></html>\n");
    h
}

fn render_summary(h: &mut String, page: &Page, doc: &Value) {
    h.push_str("<section id=\"summary\"><dl>");
    for f in page.summary {
        let (text, _) = cell(f.format, lookup(doc, f.key));
        let class = match f.format {
            Format::State => format!(" class=\"st-{}\"", state_class(&text)),
            _ => String::new(),
        };
        let _ = write!(
            h,
            "<div data-key=\"{}\"><dt>{}</dt><dd{class}>{}</dd></div>",
            escape(f.key),
            escape(f.label),
            escape(&text)
        );
    }
    h.push_str("</dl></section>\n");
}

fn render_table(h: &mut String, t: &Table, doc: &Value, query: &StatusQuery) {
    let rows = lookup(doc, t.key).as_array().map(Vec::as_slice).unwrap_or_default();
    let _ = write!(h, "<section class=\"table\" id=\"s-{}\"><h2>{}</h2>", escape(t.key), escape(t.title));
    if t.paged {
        render_paging(h, t, doc, query);
    }
    let _ = write!(h, "<table id=\"t-{}\" data-key=\"{}\">", escape(t.key), escape(t.key));
    render_head(h, t);
    if rows.is_empty() {
        let _ = write!(
            h,
            "<tbody class=\"empty\"><tr><td colspan=\"{}\">{}</td></tr></tbody>",
            t.columns.len(),
            escape(t.empty)
        );
    }
    for row in rows {
        render_row(h, t, row);
    }
    h.push_str("</table></section>\n");
}

fn render_head(h: &mut String, t: &Table) {
    h.push_str("<thead><tr>");
    for c in t.columns {
        let _ = write!(h, "<th data-key=\"{}\" scope=\"col\">{}</th>", escape(c.key), escape(c.label));
    }
    h.push_str("</tr></thead>");
}

fn render_row(h: &mut String, t: &Table, row: &Value) {
    let key = text_of(lookup(row, t.row_key));
    let class = match t.state {
        "" => String::new(),
        s => format!(" class=\"st-{}\"", state_class(&text_of(lookup(row, s)))),
    };
    let _ = write!(h, "<tbody data-row=\"{}\"{class}><tr>", escape(&key));
    for c in t.columns {
        let (text, sort) = cell(c.format, lookup(row, c.key));
        let sort = sort.map(|n| format!(" data-sort=\"{n}\"")).unwrap_or_default();
        match c.format {
            Format::State => {
                let _ = write!(
                    h,
                    "<td{sort}><span class=\"badge st-{}\">{}</span></td>",
                    state_class(&text),
                    escape(&text)
                );
            }
            _ => {
                let _ = write!(h, "<td{sort}>{}</td>", escape(&text));
            }
        }
    }
    h.push_str("</tr>");
    if let Some(n) = t.nested {
        let inner = lookup(row, n.key).as_array().map(Vec::as_slice).unwrap_or_default();
        let _ = write!(
            h,
            "<tr class=\"nested\"><td colspan=\"{}\"><details data-row=\"{}\"><summary>{} {}</summary>",
            t.columns.len(),
            escape(&key),
            inner.len(),
            escape(n.title)
        );
        if !inner.is_empty() {
            let _ = write!(h, "<table class=\"inner\" data-key=\"{}\">", escape(n.key));
            render_head(h, n);
            for r in inner {
                render_row(h, n, r);
            }
            h.push_str("</table>");
        }
        h.push_str("</details></td></tr>");
    }
    h.push_str("</tbody>");
}

fn render_paging(h: &mut String, t: &Table, doc: &Value, query: &StatusQuery) {
    let p = lookup(doc, "page");
    let n = |k: &str| lookup(p, k).as_u64().unwrap_or(0) as usize;
    let (offset, limit, total, matched, returned) = (n("offset"), n("limit"), n("total"), n("matched"), n("returned"));
    let first = if returned == 0 { 0 } else { offset + 1 };
    let _ = write!(
        h,
        "<p class=\"paging\" id=\"paging\">{} {first}–{} of {matched}",
        escape(t.title).to_lowercase(),
        offset + returned
    );
    if matched != total {
        let _ = write!(h, " (filtered from {total})");
    }
    if offset > 0 {
        let _ = write!(h, " <a href=\"{}\">previous</a>", escape(&query.with_offset(offset.saturating_sub(limit))));
    }
    if offset + returned < matched {
        let _ = write!(h, " <a href=\"{}\">next</a>", escape(&query.with_offset(offset + limit)));
    }
    h.push_str("</p>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SESSIONS: Table = Table {
        key: "sessions",
        title: "Sessions",
        row_key: "id",
        state: "standing",
        columns: &[col("node", "node", Format::Text), col("standing", "standing", Format::State)],
        nested: None,
        paged: false,
        empty: "no sessions",
    };
    const PAGE: Page = Page {
        title: "proxy-server",
        summary: &[col("replica.id", "replica", Format::Text)],
        tables: &[Table {
            key: "clusters",
            title: "Clusters",
            row_key: "name",
            state: "health",
            columns: &[
                col("name", "cluster", Format::Text),
                col("health", "health", Format::State),
                col("bytes", "bytes", Format::Bytes),
                col("refusals", "refusals", Format::Counts),
                col("dials", "dials", Format::Series),
            ],
            nested: Some(&SESSIONS),
            paged: true,
            empty: "no clusters",
        }],
    };

    #[test]
    fn what_a_peer_sent_is_escaped_and_the_page_has_no_inline_script() {
        let evil = "<img src=x onerror=alert(1)><script>alert(2)</script>\"'&";
        let doc = json!({
            "generated_at_ms": 0,
            "replica": {"id": evil},
            "page": {"offset": 0, "limit": 100, "total": 1, "matched": 1, "returned": 1},
            "clusters": [{"name": evil, "health": "up", "bytes": 2048, "refusals": {"no_agent": [1, 2], "x": 0},
                          "dials": [1, 2, 3], "sessions": [{"id": 1, "node": evil, "standing": "suspect"}]}],
        });
        let q = StatusQuery::parse(Some("q=%3Cb%3E"));
        let html = render(&PAGE, &doc, &q);
        assert!(!html.contains("<img"), "{html}");
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(!html.contains("<b>"), "the filter is escaped too");
        assert!(
            html.contains("&lt;img src=x onerror=alert(1)&gt;&lt;script&gt;alert(2)&lt;/script&gt;&quot;&#39;&amp;")
        );
        // The only script elements: the external one and the spec (JSON, not executed).
        assert_eq!(html.matches("<script").count(), 2, "{html}");
        assert!(html.contains("<script src=\"/status.js\" defer></script>"));
        assert!(!html.contains("style=\""), "no inline style");
        // `onerror` only as the escaped text it came as, never as an attribute.
        assert_eq!(
            html.matches("onerror").count(),
            html.matches("&lt;img src=x onerror=alert(1)&gt;").count(),
            "{html}"
        );
        // Formats and states.
        assert!(html.contains("<td data-sort=\"2048\">2.0 KiB</td>"), "{html}");
        assert!(html.contains(">no_agent 3</td>"), "{html}");
        assert!(html.contains(">3 / 6</td>"), "{html}");
        assert!(html.contains("<tbody data-row=\"&lt;img"), "{html}");
        assert!(html.contains("class=\"st-up\""));
        assert!(html.contains("<span class=\"badge st-warn\">suspect</span>"));
        assert!(html.contains("<summary>1 Sessions</summary>"));
        assert!(html.contains("1970-01-01 00:00:00 UTC"));
    }

    #[test]
    fn queries_filter_and_page() {
        let q = StatusQuery::parse(Some("cluster=shoot%2Da&q=Node+1&limit=2&offset=1&limit=9"));
        assert_eq!(q.get("cluster"), Some("shoot-a"));
        assert_eq!((q.limit, q.offset), (2, 1), "the first of a repeated parameter counts");
        assert!(q.matches(["my node 1 here"]));
        assert!(!q.matches(["node 2"]));
        let (rows, p) = q.page(vec![1, 2, 3, 4], 10);
        assert_eq!(rows, vec![2, 3]);
        assert_eq!(p, Paging { offset: 1, limit: 2, total: 10, matched: 4, returned: 2 });
        let q = StatusQuery::parse(Some("limit=999999&offset=x"));
        assert_eq!((q.limit, q.offset), (MAX_LIMIT, 0));
        assert_eq!(StatusQuery::parse(None).limit, DEFAULT_LIMIT);
        assert_eq!(StatusQuery::parse(Some("q=a b&offset=3")).with_offset(5), "?q=a%20b&offset=5");
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_bytes(512.0), "512 B");
        assert_eq!(fmt_bytes(1536.0), "1.5 KiB");
        assert_eq!(fmt_bytes(3.0 * 1024.0 * 1024.0), "3.0 MiB");
        assert_eq!(fmt_secs(45.0), "45s");
        assert_eq!(fmt_secs(192.0), "3m 12s");
        assert_eq!(fmt_secs(7500.0), "2h 5m");
        assert_eq!(fmt_secs(3.0 * 86400.0 + 4.0 * 3600.0), "3d 4h");
        assert_eq!(fmt_time(1_796_000_767_000), "2026-11-30 01:06:07 UTC");
        assert_eq!(state_class("suspect"), "warn");
        assert_eq!(state_class("something else"), "idle");
        assert_eq!(cell(Format::Bool, &json!(true)).0, "yes");
        assert_eq!(cell(Format::List, &json!(["a", "b"])).0, "a, b");
        assert_eq!(cell(Format::Int, &Value::Null), (String::new(), Some(-1.0)));
        let counts = json!({"ok": 2, "refused": [1, 4], "none": 0});
        assert_eq!(cell(Format::Counts, &counts), ("refused 5, ok 2".into(), Some(7.0)));
        assert_eq!(cell(Format::Counts, &json!({"ok": 0})), ("0".into(), Some(0.0)));
        assert_eq!(cell(Format::Counts, &json!({})), ("0".into(), Some(0.0)));
        assert_eq!(cell(Format::Counts, &Value::Null).0, "");
    }
}
