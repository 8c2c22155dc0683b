//! What the documentation quotes is what the binaries produce: every `seedgate_…` metric quoted
//! in docs/ or in the deployed alerts and dashboard is registered by some binary (with the labels
//! it names, and, where a label's values are a closed set exported from the start, the value it
//! names), and every log message the guides quote is one the product's source logs.
//!
//! A log message is quoted as a code span right after the word that says it is one: its level
//! (warn `agent session suspect`, info `...`, error `...`, debug `...`) or `logs`, `logged`,
//! `log line`, `log says`; or as a line of a plain fenced block written `<binary>: <message>`.
//! In a quote, `...`, `…` and `<placeholder>` stand for any text; a quote says the start of a
//! message, or of a part of it after a `: `, and may leave out (or go on into) what follows. A
//! message's `{...}` stands for what is formatted in, which may be anything: a quote is checked
//! up to the message's first placeholder. A level given is checked where the message is a
//! `tracing` macro's literal.

use super::*;
use proc_macro2::{Delimiter, TokenStream, TokenTree};
use std::str::FromStr as _;
use testbed::docs::prose;

/// The crates whose sources say what the binaries log.
const PRODUCT: [&str; 6] = ["config", "wire", "proxy-core", "sni-router", "proxy-server", "proxy-agent"];

/// The `tracing` macros by level, and seedgate's own event macro (logged at `info`).
const LEVELS: [(&str, &str); 6] = [
    ("trace", "trace"),
    ("debug", "debug"),
    ("info", "info"),
    ("warn", "warn"),
    ("error", "error"),
    ("access_event", "info"),
];

/// A string literal of the product's source: its text and, inside a `tracing` macro, its level.
#[derive(Debug, Clone)]
struct Literal {
    text: String,
    level: Option<&'static str>,
    file: PathBuf,
}

/// Every `.rs` file under `dir`, tests aside (`tests.rs`, `*_tests.rs`, a `tests/` directory).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("a directory entry").path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if p.is_dir() {
            if name != "tests" {
                sources(&p, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push(p);
        }
    }
}

/// The string literals of the product's non-test source.
fn product_literals() -> Vec<Literal> {
    let root = repo_root();
    let mut files = Vec::new();
    for krate in PRODUCT {
        sources(&root.join(krate).join("src"), &mut files);
    }
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let tokens = TokenStream::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let rel = file.strip_prefix(&root).unwrap_or(&file).to_path_buf();
        literals_in(tokens, None, &rel, &mut out);
    }
    out
}

/// The literals of `tokens`, each with the level of the `tracing` macro it is in (if any);
/// doc comments and `#[cfg(test)]` items left out.
fn literals_in(tokens: TokenStream, level: Option<&'static str>, file: &Path, out: &mut Vec<Literal>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Punct(p) if p.as_char() == '#' => {
                // `#[...]` or `#![...]`.
                let at = if matches!(tokens.get(i + 1), Some(TokenTree::Punct(b)) if b.as_char() == '!') {
                    i + 2
                } else {
                    i + 1
                };
                let Some(TokenTree::Group(attr)) = tokens.get(at) else {
                    i += 1;
                    continue;
                };
                let words: Vec<String> = attr.stream().into_iter().map(|t| t.to_string()).collect();
                let first = words.first().map(String::as_str);
                if first == Some("cfg") && attr.stream().to_string().contains("test") {
                    // Skip the item: up to its body (a braced group) or its `;`.
                    i = at + 1;
                    while i < tokens.len() {
                        let end = matches!(&tokens[i], TokenTree::Group(g) if g.delimiter() == Delimiter::Brace)
                            || matches!(&tokens[i], TokenTree::Punct(p) if p.as_char() == ';');
                        i += 1;
                        if end {
                            break;
                        }
                    }
                    continue;
                }
                if first != Some("doc") {
                    literals_in(attr.stream(), level, file, out);
                }
                i = at + 1;
            }
            TokenTree::Ident(name) => {
                let bang = matches!(tokens.get(i + 1), Some(TokenTree::Punct(b)) if b.as_char() == '!');
                match (bang, tokens.get(i + 2)) {
                    (true, Some(TokenTree::Group(body))) => {
                        let name = name.to_string();
                        let inner = LEVELS.iter().find(|(m, _)| *m == name).map(|(_, l)| *l).or(level);
                        literals_in(body.stream(), inner, file, out);
                        i += 3;
                    }
                    _ => i += 1,
                }
            }
            TokenTree::Group(g) => {
                literals_in(g.stream(), level, file, out);
                i += 1;
            }
            TokenTree::Literal(l) => {
                if let syn::Lit::Str(s) = syn::Lit::new(l.clone()) {
                    out.push(Literal { text: s.value(), level, file: file.to_path_buf() });
                }
                i += 1;
            }
            TokenTree::Punct(_) => i += 1,
        }
    }
}

/// A log message quoted in the documentation.
#[derive(Debug, Clone)]
struct Quote {
    file: PathBuf,
    line: usize,
    level: Option<String>,
    text: String,
}

/// The words that, right before a code span, say it quotes a log message; the first four give
/// its level.
const MARKERS: [&str; 8] = ["warn", "info", "error", "debug", "logs", "logged", "log line", "log says"];

/// The code spans of a paragraph of prose, each with the text before it.
fn spans(text: &str) -> Vec<(String, String)> {
    let parts: Vec<&str> = text.split('`').collect();
    (1..parts.len())
        .step_by(2)
        .filter(|&k| k + 1 < parts.len())
        .map(|k| (parts[..k].concat(), parts[k].to_owned()))
        .collect()
}

/// The paragraphs of prose of `text` (a table row, a heading or a list item starts one), each
/// with its first line's number, its lines joined by spaces.
fn paragraphs(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open = false;
    for (n, l) in prose(text) {
        let t = l.trim();
        let item = t.starts_with(['|', '#', '-', '*', '>'])
            || t.split_once(". ").is_some_and(|(d, _)| d.parse::<u32>().is_ok());
        match (t.is_empty(), open && !item, out.last_mut()) {
            (true, _, _) => open = false,
            (false, true, Some((_, p))) => {
                p.push(' ');
                p.push_str(t);
            }
            _ => {
                out.push((n, t.to_owned()));
                open = !t.starts_with(['|', '#']);
            }
        }
    }
    out
}

/// Every log message quoted in docs/.
fn quoted_log_lines() -> Vec<Quote> {
    let binaries = ["proxy-server:", "proxy-agent:", "sni-router:"];
    let mut out = Vec::new();
    for file in markdown_files().into_iter().filter(|f| f.starts_with("docs")) {
        let text = read(&file);
        for (line, paragraph) in paragraphs(&text) {
            for (before, span) in spans(&paragraph) {
                let before = before.trim_end().trim_end_matches('(').trim_end().to_lowercase();
                let Some(marker) = MARKERS.iter().find(|m| {
                    before.strip_suffix(*m).is_some_and(|rest| rest.is_empty() || rest.ends_with([' ', '(', ',', ';']))
                }) else {
                    continue;
                };
                let level = MARKERS[..4].contains(marker).then(|| (*marker).to_owned());
                out.push(Quote { file: file.clone(), line, level, text: span });
            }
        }
        // A plain fenced block of `<binary>: <message>` lines.
        let mut fenced = false;
        for (i, l) in text.lines().enumerate() {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if let Some(rest) = binaries.iter().find_map(|b| l.strip_prefix(b)).filter(|_| fenced) {
                out.push(Quote { file: file.clone(), line: i + 1, level: None, text: rest.trim().to_owned() });
            }
        }
    }
    out
}

/// A pattern: characters, and wildcards standing for any text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    Char(char),
    Any,
}

/// A quote as a pattern: `...`, `…` and `<placeholder>` are wildcards.
fn quote_pattern(q: &str) -> Vec<Tok> {
    let chars: Vec<char> = q.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let rest: String = chars[i..].iter().collect();
        if rest.starts_with("...") {
            i += 3;
            out.push(Tok::Any);
        } else if chars[i] == '…' {
            i += 1;
            out.push(Tok::Any);
        } else if let Some(len) = rest.strip_prefix('<').and_then(|r| r.find('>')).filter(|&n| {
            n > 0 && rest[1..=n].chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ' '))
        }) {
            i += len + 2;
            out.push(Tok::Any);
        } else {
            out.push(Tok::Char(chars[i]));
            i += 1;
        }
    }
    out
}

/// Whether the quote `q` says the start of the message `l`, or of one of its parts after a
/// `: `: what follows may be left out, and the event's fields after the message may be quoted
/// (`id=...`). Where a part begins with what is formatted in, it is not a start.
fn says(q: &[Tok], l: &[Tok]) -> bool {
    let mut prefix = q.to_vec();
    prefix.push(Tok::Any);
    // Fields are quoted as `key=value`; a message has more than one word.
    let fields = q.contains(&Tok::Char('=')) && l.contains(&Tok::Char(' '));
    let starts = (0..l.len()).filter(|&k| {
        matches!(l[k], Tok::Char(_)) && (k == 0 || (k >= 2 && l[k - 2] == Tok::Char(':') && l[k - 1] == Tok::Char(' ')))
    });
    starts.into_iter().any(|k| {
        let mut with_fields = l[k..].to_vec();
        with_fields.extend([Tok::Char(' '), Tok::Any, Tok::Char('='), Tok::Any]);
        intersect(&prefix, &l[k..]) || (fields && intersect(q, &with_fields))
    })
}

/// A format string as a pattern: `{...}` is a wildcard, `{{` and `}}` are braces.
fn literal_pattern(l: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut chars = l.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push(Tok::Char('{'));
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push(Tok::Char('}'));
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                out.push(Tok::Any);
            }
            c => out.push(Tok::Char(c)),
        }
    }
    out
}

/// Whether some text matches both patterns (each anchored at both ends).
fn intersect(a: &[Tok], b: &[Tok]) -> bool {
    let (n, m) = (a.len(), b.len());
    // can[i][j]: a[i..] and b[j..] match a common text.
    let mut can = vec![vec![false; m + 1]; n + 1];
    can[n][m] = true;
    for i in (0..=n).rev() {
        for j in (0..=m).rev() {
            if i == n && j == m {
                continue;
            }
            can[i][j] = match (a.get(i), b.get(j)) {
                (Some(Tok::Any), _) => can[i + 1][j] || (j < m && can[i][j + 1]),
                (_, Some(Tok::Any)) => can[i][j + 1] || (i < n && can[i + 1][j]),
                (Some(Tok::Char(x)), Some(Tok::Char(y))) => x == y && can[i + 1][j + 1],
                _ => false,
            };
        }
    }
    can[0][0]
}

/// A format string without what is formatted in.
fn fixed_text(l: &str) -> String {
    literal_pattern(l).iter().map(|t| if let Tok::Char(c) = t { *c } else { '\u{0}' }).collect()
}

/// The quote's first word, which the message's own text holds where the quote starts: the
/// cheap test before the match.
fn key_word(q: &str) -> String {
    q.split(|c: char| !c.is_alphanumeric()).find(|w| !w.is_empty()).unwrap_or_default().to_owned()
}

/// What is wrong with `q`: no product literal holds it, or none at the level it names.
fn check_quote(q: &Quote, literals: &[Literal]) -> Option<String> {
    let text = q.text.as_str();
    let pattern = quote_pattern(text);
    let word = key_word(text);
    let found: Vec<&Literal> = literals
        .iter()
        .filter(|l| fixed_text(&l.text).contains(&word))
        .filter(|l| says(&pattern, &literal_pattern(&l.text)))
        .collect();
    let at = format!("{}:{}", q.file.display(), q.line);
    if found.is_empty() {
        return Some(format!("{at}: no message of the product says `{}`", q.text));
    }
    let logged: Vec<&&Literal> = found.iter().filter(|l| l.level.is_some()).collect();
    match &q.level {
        Some(level) if !logged.is_empty() && !logged.iter().any(|l| l.level == Some(level.as_str())) => {
            let said: Vec<String> =
                logged.iter().map(|l| format!("{} in {}", l.level.unwrap_or_default(), l.file.display())).collect();
            Some(format!("{at}: `{}` is quoted at {level}, logged at {}", q.text, said.join(", ")))
        }
        _ => None,
    }
}

/// Quotes known wrong, in pages another change owns now: `(file, the quote's start, what is
/// logged instead)`. Each must still be wrong (the test says when one is fixed).
const KNOWN_WRONG: &[(&str, &str, &str)] = &[];

#[test]
fn every_quoted_log_line_is_one_the_binaries_log() {
    let literals = product_literals();
    assert!(literals.len() > 1000, "only {} literals read", literals.len());
    let quotes = quoted_log_lines();
    assert!(quotes.len() >= 15, "only {} quoted log lines found: {quotes:#?}", quotes.len());
    let known = |q: &Quote| KNOWN_WRONG.iter().any(|(f, start, _)| q.file == Path::new(f) && q.text.starts_with(start));
    let mut wrong = Vec::new();
    for q in &quotes {
        match (check_quote(q, &literals), known(q)) {
            (Some(w), false) => wrong.push(w),
            (None, true) => wrong.push(format!(
                "{}:{}: `{}` is right now: drop it from KNOWN_WRONG",
                q.file.display(),
                q.line,
                q.text
            )),
            _ => {}
        }
    }
    for (f, start, _) in KNOWN_WRONG {
        assert!(
            quotes.iter().any(|q| q.file == Path::new(f) && q.text.starts_with(start)),
            "{f} no longer quotes {start}"
        );
    }
    assert!(wrong.is_empty(), "quoted log lines the binaries do not log:\n  {}", wrong.join("\n  "));
}

#[test]
fn the_matcher_reads_quotes_and_format_strings() {
    let lit = literal_pattern("agent {over} handshake failed: {hint}");
    assert!(says(&quote_pattern("agent TLS handshake failed: the agent's client certificate (x)"), &lit));
    assert!(says(&quote_pattern("agent TLS handshake failed"), &lit), "the start of the message");
    assert!(!says(&quote_pattern("handshake failed"), &lit), "not from the middle of a part");
    assert!(!says(&quote_pattern("the agent's client certificate"), &lit), "not from what is formatted in");
    let suspect = literal_pattern("agent session suspect: its keepalive went unanswered (the path is quiet)");
    assert!(says(&quote_pattern("agent session suspect"), &suspect));
    assert!(says(&quote_pattern("its keepalive went unanswered"), &suspect));
    assert!(!says(&quote_pattern("agent session suspicious"), &suspect));
    let closed = literal_pattern("gRPC front-end connection closed: the client's HTTP/2 is malformed");
    assert!(says(&quote_pattern("the client's HTTP/2 is malformed"), &closed), "a part after `: `");
    assert!(says(&quote_pattern("server replica announced id=..."), &literal_pattern("server replica announced")));
    assert!(!says(&quote_pattern("server replica gone"), &literal_pattern("server replica announced")));
    let refused = literal_pattern("proxy-server refused this agent's session");
    assert!(!says(&quote_pattern("proxy-server refused this agent's session: cluster shoot-a holds ..."), &refused));
    let word = literal_pattern("proxy-server");
    assert!(!says(&quote_pattern("proxy-server refused ..."), &word), "a word is no message with fields");
    let ended = literal_pattern("tunnel session ended");
    assert!(!says(&quote_pattern("tunnel session ended before it proved itself"), &ended), "more words are no fields");
    let none = literal_pattern("no agent of cluster {c} is connected");
    assert!(says(&quote_pattern("no agent of cluster <name> is connected"), &none));
    assert!(says(&quote_pattern("no agent of cluster ..."), &none));
    assert_eq!(fixed_text("a {b} c"), "a \u{0} c");
    assert_eq!(literal_pattern("{{x}}"), [Tok::Char('{'), Tok::Char('x'), Tok::Char('}')]);
    assert_eq!(
        paragraphs("a `b\nc` d\n\n| x | y |\n| z |\n- i\n  j\n- k\n"),
        [
            (1, "a `b c` d".to_owned()),
            (4, "| x | y |".to_owned()),
            (5, "| z |".to_owned()),
            (6, "- i j".to_owned()),
            (8, "- k".to_owned())
        ]
    );
    let found = spans("then info `a b`, and logs the reason: `c d` and `e`");
    assert_eq!(found.len(), 3);
    assert_eq!(found[1], ("then info a b, and logs the reason: ".to_owned(), "c d".to_owned()));
}

/// A label of a quoted selector, with the value it names, if any.
type Selected = (String, Option<String>);

/// A metric as the documentation quotes it: name, and the labels (with values) of a selector.
fn quoted_metrics(text: &str) -> Vec<(String, Vec<Selected>)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("seedgate_") {
        let tail = &rest[at..];
        let end =
            tail.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
        let name = &tail[..end];
        let mut labels = Vec::new();
        if let Some(sel) = tail[end..].strip_prefix('{').and_then(|s| s.split_once('}')).map(|(s, _)| s) {
            for part in sel.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let (k, v) = part.split_once(['=', '!']).map_or((part, None), |(k, v)| (k, Some(v)));
                let v = v.map(|v| v.trim_start_matches(['=', '~']).trim().trim_matches('"').to_owned());
                labels.push((k.trim().to_owned(), v));
            }
        }
        // `seedgate_` alone, or `seedgate_<tenant>_...`: a prefix, not a metric.
        if name.len() > "seedgate_".len() && !name.ends_with('_') {
            out.push((name.to_owned(), labels));
        }
        rest = &tail[end..];
    }
    out
}

/// Labels whose values are names from the config or the peers (open): a quote's value of one is
/// an example.
const NAMED: [&str; 8] = ["listener", "route", "cluster", "frontend", "server", "file", "subject", "use"];

/// Labels Prometheus gives every series of a target it scrapes (the alerts and dashboard use them).
const TARGET: [&str; 6] = ["namespace", "pod", "job", "instance", "service", "container"];

#[tokio::test]
async fn every_quoted_metric_is_registered_with_the_labels_it_names() -> anyhow::Result<()> {
    let dir = TempDir::new("docs-quoted-metrics")?;
    // On a thread of its own: it runs each binary's bind on a runtime of its own.
    let by_binary = std::thread::scope(|s| s.spawn(|| metrics_by_binary(&dir)).join().expect("registered"));
    // A name with each binary's labels (proxy-server's and the agent's tunnel metrics differ).
    let mut registered: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for m in by_binary.iter().flat_map(|(_, ms)| ms) {
        registered.entry(m.name.as_str()).or_default().extend(m.labels.iter().map(String::as_str));
    }
    let scraped = super::fresh::fresh_scrapes(&dir).await?;
    let mut files: Vec<PathBuf> = markdown_files().into_iter().filter(|f| f.starts_with("docs")).collect();
    for f in std::fs::read_dir(repo_root().join("deploy/monitoring"))? {
        files.push(f?.path().strip_prefix(repo_root())?.to_path_buf());
    }
    let mut wrong = Vec::new();
    let mut seen = 0;
    for file in files {
        let text = read(&file);
        for (n, line) in text.lines().enumerate() {
            for (name, labels) in quoted_metrics(line) {
                seen += 1;
                let at = format!("{}:{}: {name}", file.display(), n + 1);
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| registered.contains_key(b)))
                    .unwrap_or(&name);
                let Some(have) = registered.get(base) else {
                    wrong.push(format!("{at}: no binary registers it"));
                    continue;
                };
                for (label, value) in labels {
                    if (label == "le" && base != name) || TARGET.contains(&label.as_str()) {
                        continue;
                    }
                    if !have.contains(label.as_str()) {
                        wrong.push(format!("{at}: has no label {label} (it has {have:?})"));
                        continue;
                    }
                    let Some(v) = value.filter(|v| !NAMED.contains(&label.as_str()) && !v.is_empty()) else { continue };
                    let exported = format!("{label}=\"{v}\"");
                    let pattern = v.contains(['*', '.', '|', '<']);
                    if !pattern && !scraped.iter().any(|l| l.starts_with(&format!("{base}{{")) && l.contains(&exported))
                    {
                        wrong.push(format!("{at}: no fresh binary exports a series with {exported}"));
                    }
                }
            }
        }
    }
    assert!(seen > 100, "only {seen} quoted metrics found");
    assert!(wrong.is_empty(), "quoted metrics the binaries do not register:\n  {}", wrong.join("\n  "));
    Ok(())
}
