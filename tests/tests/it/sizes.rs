//! Product files and functions stay small enough to read in one sitting: a file of a product
//! crate's `src/` has at most [`FILE_CAP`] lines (proxy-server's: [`FILE_CAP_PROXY_SERVER`]), a
//! function at most [`FN_CAP`].
//!
//! Only product code counts. A file's lines are its lines less those of its test code
//! (`#[cfg(test)]` items, as [`crate::source`] finds them), so unit tests beside the code cost
//! nothing; a file declared under `#[cfg(test)]` (`mod tests;`) is not counted at all. A function's
//! lines run from the line of its `fn` keyword to that of its closing brace, its doc comment and
//! attributes not included, a nested function included in its outer one (and counted on its own
//! too); functions without a body and test functions are not counted.
//!
//! Today's offenders are listed ([`FILES_OVER`], [`FNS_OVER`]): the refactors that split them
//! empty the lists, and an entry that is no longer over its cap fails the test until it is
//! removed, so the lists only shrink. A file or function that is mostly a data table (a match
//! from names to descriptions, a list of constants) is an exception, named with its reason in
//! [`FILE_TABLES`] or [`FN_TABLES`]; an exception under the cap fails too.

use crate::source::{self, SourceFile, Tok, is_word};
use std::collections::BTreeMap;

/// The most lines a product file may have.
const FILE_CAP: usize = 800;
/// The most lines a file of proxy-server may have (its front ends, registry and listeners are
/// each split by concern; a file past this is two concerns).
const FILE_CAP_PROXY_SERVER: usize = 500;
/// The most lines a product function may have.
const FN_CAP: usize = 80;

/// Today's product files over their cap (workspace paths); the list only shrinks.
const FILES_OVER: &[&str] = &[];

/// Files that are mostly a data table, allowed over the cap: (path, why).
const FILE_TABLES: &[(&str, &str)] = &[];

/// Today's product functions over the cap (`path: Type::function`, see [`functions`] for the
/// names); the list only shrinks.
const FNS_OVER: &[&str] = &["wire/src/proxy_protocol.rs: parse_v1"];

/// Functions that are mostly a data table, allowed over the cap: (`path: Type::function`, why).
const FN_TABLES: &[(&str, &str)] = &[
    (
        "proxy-core/src/tls/mod.rs: certificate_hint",
        "one match arm per rustls certificate error or alert, each with the operator's hint: a table of messages",
    ),
    (
        "proxy-server/src/metrics.rs: ServerMetrics::new",
        "one registration per metric (name, help text, labels): the metrics table the reference is generated from",
    ),
];

/// The cap of the file `name` (a workspace path).
fn file_cap(name: &str) -> usize {
    if name.starts_with("proxy-server/") { FILE_CAP_PROXY_SERVER } else { FILE_CAP }
}

/// The file's lines less the lines its test code spans.
fn product_lines(f: &SourceFile) -> usize {
    let mut test_lines = std::collections::BTreeSet::new();
    let mut k = 0;
    while k < f.toks.len() {
        if !f.test[k] {
            k += 1;
            continue;
        }
        let first = f.toks[k].line;
        while k < f.toks.len() && f.test[k] {
            k += 1;
        }
        test_lines.extend(first..=f.toks[k - 1].line);
    }
    f.lines.saturating_sub(test_lines.len())
}

/// The name an `impl` block gives its functions: `Type`, or `<Type as Trait>` for a trait's;
/// `header` is the tokens between `impl` and its `{`.
fn impl_name(header: &[Tok]) -> String {
    let words: Vec<&str> = header.iter().map(|t| t.text.as_str()).collect();
    // Generic parameters first (`impl<T: Bound> …`): skip to their `>`.
    let mut start = 0;
    if words.first() == Some(&"<") {
        let mut depth = 0i32;
        for (k, w) in words.iter().enumerate() {
            depth += match *w {
                "<" => 1,
                ">" => -1,
                _ => 0,
            };
            if depth == 0 {
                start = k + 1;
                break;
            }
        }
    }
    let words = &words[start..];
    // A type's name: its first word that starts with a capital (`Vec` of `Vec<T>`), else its first.
    let ty = |ws: &[&str]| -> String {
        let mut names = ws.iter().filter(|w| is_word(w) && !matches!(**w, "dyn" | "mut" | "const"));
        let first = names.clone().next().copied().unwrap_or("?");
        names.find(|w| w.starts_with(char::is_uppercase)).copied().unwrap_or(first).to_string()
    };
    match words.iter().position(|w| *w == "for") {
        Some(f) => format!("<{} as {}>", ty(&words[f + 1..]), ty(&words[..f])),
        None => ty(words),
    }
}

/// The product functions of `f` with a body: (name, lines). A name is qualified by what encloses
/// the function in its file: inline modules, `impl` blocks (`Type::f`, `<Type as Trait>::f`),
/// traits and outer functions.
fn functions(f: &SourceFile) -> Vec<(String, usize)> {
    let toks = &f.toks;
    let text = |k: usize| toks.get(k).map_or("", |t| t.text.as_str());
    // Enclosing names, each with the index just past its closing brace.
    let mut scopes: Vec<(String, usize)> = Vec::new();
    let mut out = Vec::new();
    let mut k = 0;
    while k < toks.len() {
        while scopes.last().is_some_and(|(_, end)| *end <= k) {
            scopes.pop();
        }
        let prev = text(k.wrapping_sub(1));
        // An `impl` block, not `impl Trait` in a type.
        let item_start = matches!(prev, "" | "}" | ";" | "{" | "]" | "unsafe" | "default");
        let scope = match text(k) {
            "impl" if item_start => Some(None),
            "mod" | "trait" if is_word(text(k + 1)) => Some(Some(text(k + 1).to_string())),
            "fn" if is_word(text(k + 1)) => Some(Some(text(k + 1).to_string())),
            _ => None,
        };
        let Some(name) = scope else {
            k += 1;
            continue;
        };
        // The body: the first `{` outside parentheses and brackets; a `;` first means none.
        let mut body = None;
        let mut j = k + 1;
        while j < toks.len() {
            match text(j) {
                "(" | "[" => j = source::close_of(toks, j),
                ";" => break,
                "{" => {
                    body = Some(j);
                    break;
                }
                _ => j += 1,
            }
        }
        let Some(open) = body else {
            k = j + 1;
            continue;
        };
        let end = source::close_of(toks, open);
        let name = name.unwrap_or_else(|| impl_name(&toks[k + 1..open]));
        if text(k) == "fn" && !f.test[k] {
            let path: Vec<&str> = scopes.iter().map(|(s, _)| s.as_str()).chain([name.as_str()]).collect();
            out.push((path.join("::"), toks[end - 1].line - toks[k].line + 1));
        }
        scopes.push((name, end));
        k = open + 1;
    }
    out
}

/// Which of a kind's lists an entry is in: (the kind, its offenders' list, its tables' list).
type Lists<'a> = (&'a str, &'a str, &'a str);

/// What the lists of today's offenders (`over`) and of data tables (`tables`) miss or no longer
/// need, against the sizes `found` and the cap `cap_of` each name; one line each.
fn compare(
    (what, over_list, tables_list): Lists<'_>,
    found: &BTreeMap<String, usize>,
    over: &[&str],
    tables: &[(&str, &str)],
    cap_of: impl Fn(&str) -> usize,
) -> Vec<String> {
    let listed = |name: &str| over.contains(&name) || tables.iter().any(|(t, _)| *t == name);
    let mut problems = Vec::new();
    for (name, &n) in found {
        let cap = cap_of(name);
        if n > cap && !listed(name) {
            problems.push(format!(
                "{what} {name} is {n} lines, over the cap of {cap}: split it by concern (for a function: a step or a \
                 repeated block into a function of its own); only if it is mostly a data table, add it to {tables_list} \
                 in {} with why",
                file!()
            ));
        }
    }
    let entries = over.iter().map(|o| (*o, over_list)).chain(tables.iter().map(|(t, _)| (*t, tables_list)));
    for (name, list) in entries {
        match found.get(name) {
            Some(&n) if n > cap_of(name) => {}
            Some(&n) => problems.push(format!(
                "{what} {name} is {n} lines now, within the cap of {}: remove its entry from {list} in {}",
                cap_of(name),
                file!()
            )),
            None => problems.push(format!(
                "{what} {name} is listed in {list} in {} but not found (renamed, moved or removed): remove its entry \
                 (if it moved and is still over the cap, the test names it under its new name)",
                file!()
            )),
        }
    }
    problems
}

#[test]
fn product_files_and_functions_stay_within_their_caps_but_the_listed_ones() {
    let (mut files, mut fns) = (BTreeMap::new(), BTreeMap::new());
    for krate in source::CRATES {
        for f in source::crate_files(krate).into_iter().filter(|f| !f.test_only) {
            files.insert(f.name.clone(), product_lines(&f));
            for (name, n) in functions(&f) {
                let key = format!("{}: {name}", f.name);
                // Two functions of the same name in a file (under different `cfg`s): the longer counts.
                let e = fns.entry(key).or_insert(0);
                *e = (*e).max(n);
            }
        }
    }
    assert!(fns.len() > 1000, "only {} product functions read: the reader is broken", fns.len());
    let mut problems = compare(("file", "FILES_OVER", "FILE_TABLES"), &files, FILES_OVER, FILE_TABLES, file_cap);
    let fn_lists = ("function", "FNS_OVER", "FN_TABLES");
    problems.extend(compare(fn_lists, &fns, FNS_OVER, FN_TABLES, |_| FN_CAP));
    assert!(problems.is_empty(), "sizes:\n{}", problems.join("\n"));
}

#[test]
fn functions_are_named_by_what_encloses_them_and_measured_from_fn_to_brace() {
    let src = r#"
/// Doc.
#[inline]
pub(crate) async fn free(x: [u8; 2]) -> u8 {
    fn inner() {}
    x[0]
}
trait T { fn declared(&self); fn provided(&self) -> u8 { 1 } }
impl<'a, X: T> T for Wrapper<'a, X> where X: Clone {
    fn declared(&self) {
        let s = "}";
    }
}
impl dyn T { const fn make() -> Self { todo!() } }
mod inline { pub fn f(g: impl Fn(u8) -> u8) {} }
#[cfg(test)]
mod tests { fn helper() { } }
"#;
    let f = SourceFile::from_text("f.rs", &[], src);
    let found: Vec<(String, usize)> = functions(&f);
    let want = [
        ("free", 4),
        ("free::inner", 1),
        ("T::provided", 1),
        ("<Wrapper as T>::declared", 3),
        ("T::make", 1),
        ("inline::f", 1),
    ];
    assert_eq!(found, want.map(|(n, l)| (n.to_string(), l)));
    let with_tests = "fn a() {}\n\n#[cfg(test)]\nmod tests {\n    fn b() {}\n}\n";
    assert_eq!(product_lines(&SourceFile::from_text("g.rs", &[], with_tests)), 2);
}

#[test]
fn listed_offenders_only_shrink() {
    let found: BTreeMap<String, usize> =
        [("a", 90), ("b", 70), ("c", 100), ("t", 200)].map(|(n, l)| (n.to_string(), l)).into();
    let lists = ("function", "OVER", "TABLES");
    let problems = compare(lists, &found, &["b", "gone"], &[("t", "a table"), ("c", "a table")], |_| 80);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].starts_with("function a is 90 lines, over the cap of 80"), "{}", problems[0]);
    assert!(problems[0].contains("add it to TABLES"), "{}", problems[0]);
    assert!(problems[1].starts_with("function b is 70 lines now, within the cap of 80: remove its entry from OVER"));
    assert!(problems[2].starts_with("function gone is listed in OVER"), "{}", problems[2]);
    let shrunk = compare(lists, &found, &["a"], &[("b", "a table"), ("c", "why"), ("t", "why")], |_| 80);
    assert_eq!(shrunk.len(), 1, "{shrunk:#?}");
    assert!(shrunk[0].starts_with("function b is 70 lines now, within the cap of 80: remove its entry from TABLES"));
    assert_eq!(compare(lists, &found, &["a", "c"], &[("t", "a table")], |_| 80), Vec::<String>::new());
}
