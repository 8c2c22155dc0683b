//! Reading one YAML config file: every problem at once, each with its line, column and key path.
//!
//! serde stops at the first error. So that a file with four bad durations gets four messages,
//! the value types parsed from strings (durations, addresses, CIDRs) do not fail the parse while
//! a [`collect`] is running: they record the problem with its position and stand in a harmless
//! placeholder; after the parse the positions are turned into key paths by walking the YAML
//! events once more. Structural errors (an unknown key, a missing one, a wrong type) still end
//! the parse, and are reported after the value problems found before them.

use crate::error::{ConfigError, Problem, Problems};
use granit_parser::{Event, Parser};
use std::cell::RefCell;
use std::collections::HashMap;

/// A value that did not parse: its position (1-based line and column) and why.
struct BadValue {
    at: (u64, u64),
    message: String,
}

thread_local! {
    /// `Some` while [`collect`] runs on this thread.
    static BAD: RefCell<Option<Vec<BadValue>>> = const { RefCell::new(None) };
}

/// Whether a parse that collects value problems is running on this thread.
pub(crate) fn collecting() -> bool {
    BAD.with(|b| b.borrow().is_some())
}

/// Record a value problem of the running parse (only called when [`collecting`]).
pub(crate) fn record(line: u64, column: u64, message: String) {
    BAD.with(|b| {
        if let Some(list) = b.borrow_mut().as_mut() {
            list.push(BadValue { at: (line, column), message });
        }
    });
}

/// Run `f` with value problems collected; returns its result and the problems.
fn collect<T>(f: impl FnOnce() -> T) -> (T, Vec<BadValue>) {
    /// Restores the previous state even if `f` panics (a nested parse keeps the outer list).
    struct Restore(Option<Vec<BadValue>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            BAD.with(|b| *b.borrow_mut() = outer);
        }
    }
    let outer = BAD.with(|b| b.borrow_mut().replace(Vec::new()));
    let _restore = Restore(outer);
    let out = f();
    let bad = BAD.with(|b| b.borrow_mut().replace(Vec::new())).unwrap_or_default();
    (out, bad)
}

/// Key paths (`listeners[0].routes[2].sni`) by the position of the node (key or value) they
/// name, and where a second document starts, if there is one.
#[derive(Default)]
struct Paths {
    /// Where a key or value starts. A key wins over a block mapping starting at the same place.
    at: HashMap<(u64, u64), String>,
    /// Where a mapping or sequence starts (a missing key is reported there).
    containers: HashMap<(u64, u64), String>,
    /// Where each key path's key starts.
    keys: HashMap<String, (u64, u64)>,
    /// Where each key path's value starts, when it is a scalar (or an alias).
    scalars: HashMap<String, (u64, u64)>,
    /// Where a second document with content starts (empty ones, e.g. a trailing `---`, do not
    /// count).
    second_document: Option<(u64, u64)>,
    /// Where the first empty document after the first starts, if any.
    empty_document: Option<(u64, u64)>,
}

enum Frame {
    /// `key`: the key whose value comes next, `None` while a key is expected.
    Map {
        path: String,
        key: Option<String>,
    },
    Seq {
        path: String,
        index: usize,
    },
}

impl Paths {
    fn of(text: &str) -> Self {
        let mut out = Paths::default();
        let mut stack: Vec<Frame> = Vec::new();
        let mut documents = 0;
        // Where the document being read started.
        let mut current = (0, 0);
        for ev in Parser::new_from_str(text) {
            // A syntax error is the deserializer's to report; stop here.
            let Ok((ev, span)) = ev else { break };
            let at = (span.start.line() as u64, span.start.col() as u64 + 1);
            if documents >= 2 {
                match ev {
                    Event::DocumentStart(..) => current = at,
                    // Reached without content: the document was empty.
                    Event::DocumentEnd => {
                        out.empty_document.get_or_insert(current);
                    }
                    // An empty document holds one null scalar.
                    Event::Scalar(v, ..) if matches!(v.as_ref(), "" | "~" | "null") => {}
                    Event::Scalar(..) | Event::Alias(..) | Event::MappingStart(..) | Event::SequenceStart(..) => {
                        out.second_document = Some(current);
                        break;
                    }
                    _ => {}
                }
                continue;
            }
            match ev {
                Event::DocumentStart(..) => {
                    documents += 1;
                    current = at;
                }
                Event::Scalar(v, ..) => {
                    if let Some(Frame::Map { path, key: key @ None }) = stack.last_mut() {
                        let p = join(path, &v);
                        out.keys.entry(p.clone()).or_insert(at);
                        out.at.insert(at, p);
                        *key = Some(v.into_owned());
                    } else {
                        let p = value_path(&stack);
                        out.scalars.entry(p.clone()).or_insert(at);
                        out.at.entry(at).or_insert(p);
                        advance(&mut stack);
                    }
                }
                Event::Alias(..) => {
                    let p = value_path(&stack);
                    out.scalars.entry(p.clone()).or_insert(at);
                    out.at.entry(at).or_insert(p);
                    advance(&mut stack);
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    let path = value_path(&stack);
                    out.at.entry(at).or_insert_with(|| path.clone());
                    out.containers.entry(at).or_insert_with(|| path.clone());
                    stack.push(match ev {
                        Event::MappingStart(..) => Frame::Map { path, key: None },
                        _ => Frame::Seq { path, index: 0 },
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                    advance(&mut stack);
                }
                _ => {}
            }
        }
        out
    }

    fn field(&self, at: (u64, u64)) -> String {
        self.at.get(&at).cloned().unwrap_or_default()
    }

    /// The position of every key path: its value when that is a scalar (what a value problem
    /// points at too), else its key (a section), else where it starts (a list element).
    fn by_path(&self) -> HashMap<&str, (u64, u64)> {
        let containers = self.containers.iter().map(|(at, p)| (p.as_str(), *at));
        let keys = self.keys.iter().map(|(p, at)| (p.as_str(), *at));
        // Later entries win.
        containers.chain(keys).chain(self.scalars.iter().map(|(p, at)| (p.as_str(), *at))).collect()
    }
}

/// Where a problem of the key path `field` is shown, and what its message then adds: the key's
/// own position; for a key not in the file (a default), its nearest enclosing key that is, or
/// the document start, saying so.
fn place(by_path: &HashMap<&str, (u64, u64)>, field: &str) -> ((u64, u64), String) {
    let mut path = field;
    loop {
        if let Some(at) = by_path.get(path) {
            let note = match path {
                _ if path == field => String::new(),
                "" => " (not in the file: shown at the document start)".to_owned(),
                section => format!(" (not in the file: shown at {section})"),
            };
            return (*at, note);
        }
        match path.rfind(['.', '[']) {
            Some(end) => path = &path[..end],
            None if !path.is_empty() => path = "",
            // An empty document: its first line.
            None => return ((1, 1), " (not in the file: shown at the document start)".to_owned()),
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") }
}

/// The path of the value about to be read in the innermost container.
fn value_path(stack: &[Frame]) -> String {
    match stack.last() {
        None => String::new(),
        Some(Frame::Map { path, key }) => join(path, key.as_deref().unwrap_or("")),
        Some(Frame::Seq { path, index }) => format!("{path}[{index}]"),
    }
}

/// A value was read: the innermost container moves to its next key or element.
fn advance(stack: &mut [Frame]) {
    match stack.last_mut() {
        Some(Frame::Map { key, .. }) => *key = None,
        Some(Frame::Seq { index, .. }) => *index += 1,
        None => {}
    }
}

/// Whether `a` and `b` are the same key path or one lies inside the other.
fn related(a: &str, b: &str) -> bool {
    let inside = |long: &str, short: &str| {
        long.strip_prefix(short).is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
    };
    inside(a, b) || inside(b, a)
}

/// The message for a file with more than one YAML document.
pub(crate) const SECOND_DOCUMENT: &str = "a second YAML document starts here (`---`), but a config file holds exactly \
     one: split the file, one config per file";

/// Parse `text` (the file `file`) into `T` and validate it with `validate`, reporting every
/// value problem, the first structural problem, and — when the structure was read — every
/// validation problem not caused by a value already reported.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
    validate: impl FnOnce(&T, &mut Problems),
) -> Result<T, ConfigError> {
    match parse_partial(text, file, validate) {
        (Some(cfg), problems) if problems.is_empty() => Ok(cfg),
        (_, problems) => Err(ConfigError { problems }),
    }
}

/// [`parse`], but also returning the config when its structure was read despite problems
/// (bad values then hold placeholders; strings such as file paths are as written), so that
/// checks after parsing (the files a config names) can report their problems in the same run.
pub(crate) fn parse_partial<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
    validate: impl FnOnce(&T, &mut Problems),
) -> (Option<T>, Vec<Problem>) {
    let (parsed, bad) = collect(|| serde_saphyr::from_str::<T>(text));
    if is_multiple_documents(&parsed) {
        let paths = Paths::of(text);
        if let (None, Some((line, _))) = (paths.second_document, paths.empty_document) {
            // Only empty documents follow (e.g. a trailing `---`): the config is the first.
            let first: String = text.lines().take(line.saturating_sub(1) as usize).flat_map(|l| [l, "\n"]).collect();
            return parse_partial(&first, file, validate);
        }
    }
    // The event walk is only needed to name what went wrong.
    let paths = match (&parsed, bad.is_empty()) {
        (Ok(_), true) => None,
        _ => Some(Paths::of(text)),
    };
    let field = |at| paths.as_ref().map(|p| p.field(at)).unwrap_or_default();
    let mut problems: Vec<Problem> = bad
        .iter()
        .map(|b| Problem {
            file: file.to_owned(),
            line: b.at.0,
            column: b.at.1,
            field: field(b.at),
            message: b.message.clone(),
        })
        .collect();
    let cfg = match parsed {
        Ok(cfg) => cfg,
        Err(e) => {
            let mut p = yaml_problem(file, &e);
            let inner = inner(&e);
            if let serde_saphyr::Error::MultipleDocuments { .. } = inner {
                p.message = SECOND_DOCUMENT.to_owned();
                if let Some((line, column)) = paths.as_ref().and_then(|p| p.second_document) {
                    (p.line, p.column) = (line, column);
                }
            } else if p.field.is_empty() && p.line > 0 {
                let at = (p.line, p.column);
                let container = paths.as_ref().and_then(|p| p.containers.get(&at));
                p.field = match (inner, container) {
                    (serde_saphyr::Error::SerdeMissingField { .. }, Some(c)) => c.clone(),
                    _ => field(at),
                };
            }
            problems.push(p);
            return (None, problems);
        }
    };
    let mut v = Problems::new(file);
    validate(&cfg, &mut v);
    // A placeholder standing in for a bad value could trip a rule about its key: keep only
    // the validation problems about other keys.
    let reported: Vec<String> = problems.iter().map(|p| p.field.clone()).filter(|f| !f.is_empty()).collect();
    if v.is_empty() {
        return (Some(cfg), problems);
    }
    let paths = paths.unwrap_or_else(|| Paths::of(text));
    let by_path = paths.by_path();
    let found = v.placed(|field| place(&by_path, field));
    problems.extend(found.into_iter().filter(|p| !reported.iter().any(|r| related(r, &p.field))));
    (Some(cfg), problems)
}

fn inner(e: &serde_saphyr::Error) -> &serde_saphyr::Error {
    match e {
        serde_saphyr::Error::WithSnippet { error, .. } => inner(error),
        e => e,
    }
}

fn is_multiple_documents<T>(r: &Result<T, serde_saphyr::Error>) -> bool {
    matches!(r, Err(e) if matches!(inner(e), serde_saphyr::Error::MultipleDocuments { .. }))
}

/// One problem from a serde-saphyr error: its message without the crate's own location prefix
/// and source snippet.
fn yaml_problem(file: &str, e: &serde_saphyr::Error) -> Problem {
    let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((0, 0));
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let message = match first.strip_prefix("line ").and_then(|rest| rest.split_once(": ")) {
        Some((_, msg)) => msg.to_owned(),
        None => first.to_owned(),
    };
    Problem { file: file.to_owned(), line, column, field: String::new(), message }
}

/// Key paths of `fields` located in `text` as validation problems are (where the key's value
/// starts), for problems found after parsing (e.g. a certificate file that cannot be read).
pub fn locate(text: &str, file: &str, fields: Vec<(String, String)>) -> ConfigError {
    let paths = Paths::of(text);
    let by_path = paths.by_path();
    let mut p = Problems::new(file);
    for (field, message) in fields {
        p.push(field, message);
    }
    ConfigError { problems: p.placed(|field| place(&by_path, field)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_keys_values_and_elements() {
        let p = Paths::of("a:\n  b: 1\n  c: [x, {d: 2}]\ne:\n  - f: 3\n");
        assert_eq!(p.field((2, 3)), "a.b");
        assert_eq!(p.field((2, 6)), "a.b");
        assert_eq!(p.field((3, 6)), "a.c");
        assert_eq!(p.field((3, 7)), "a.c[0]");
        assert_eq!(p.field((3, 14)), "a.c[1].d");
        assert_eq!(p.field((5, 5)), "e[0].f");
        assert_eq!(p.second_document, None);
        assert_eq!(Paths::of("a: 1\n---\nb: 2\n").second_document.map(|a| a.0), Some(2));
        let trailing = Paths::of("a: 1\n---\n");
        assert_eq!((trailing.second_document, trailing.empty_document.map(|a| a.0)), (None, Some(2)));
    }

    #[test]
    fn a_key_is_placed_at_its_value_its_section_or_the_document_start() {
        let p = Paths::of("# a comment\na:\n  b: 1\n  c: { d: [x] }\nl:\n  - k: 2\n");
        let by_path = p.by_path();
        let at = |field: &str| place(&by_path, field);
        assert_eq!(at("a.b"), ((3, 6), String::new()), "a scalar: its value");
        assert_eq!(at("a"), ((2, 1), String::new()), "a block section: its key");
        assert_eq!(at("a.c"), ((4, 3), String::new()), "a flow section: its key");
        assert_eq!(at("a.c.d[0]"), ((4, 12), String::new()));
        assert_eq!(at("l[0]"), ((6, 5), String::new()), "a list element: where it starts");
        assert_eq!(at("a.e"), ((2, 1), " (not in the file: shown at a)".to_owned()));
        assert_eq!(at("a.c.e.f"), ((4, 3), " (not in the file: shown at a.c)".to_owned()));
        assert_eq!(at("l[1].k"), ((5, 1), " (not in the file: shown at l)".to_owned()));
        assert_eq!(at("z.y"), ((2, 1), " (not in the file: shown at the document start)".to_owned()));
        let empty = Paths::of("");
        let at = place(&empty.by_path(), "listeners");
        assert_eq!(at, ((1, 1), " (not in the file: shown at the document start)".to_owned()));
    }

    #[test]
    fn related_paths() {
        assert!(related("a.b", "a.b"));
        assert!(related("a", "a.b"));
        assert!(related("a.b[1]", "a.b"));
        assert!(!related("a.bc", "a.b"));
        assert!(!related("a.c", "a.b"));
    }
}
