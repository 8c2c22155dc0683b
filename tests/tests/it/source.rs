//! The product crates' sources as the shape tests (`module_graph`, `sizes`) read them: their files,
//! a small tokenizer that drops comments and literals, and which tokens are test code.
//!
//! Not a Rust parser: it keeps identifiers, `::`, string literals (for `cfg` predicates) and single
//! punctuation, each with its line. Test code is an item under a test-only attribute
//! (`#[cfg(test)]`, `#[cfg(any(test, feature = "test-util"))]`, `#[test]`, `#[tokio::test]`), a
//! file whose module is declared under one (`#[cfg(test)] mod tests;`), or a file whose first
//! attribute is `#![cfg(test)]`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The product crates: their `src/` is what the shape tests read.
pub(crate) const CRATES: &[&str] = &["config", "wire", "proxy-core", "sni-router", "proxy-server", "proxy-agent"];

pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tok {
    pub(crate) text: String,
    pub(crate) line: usize,
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `s` is an identifier (or a number), not punctuation or a literal.
pub(crate) fn is_word(s: &str) -> bool {
    s.starts_with(is_ident_char)
}

/// The tokens of `src`: identifiers (and numbers), `::`, string literals (their source text,
/// quotes included) and single punctuation. Comments, character literals, lifetimes and labels
/// are dropped.
pub(crate) fn tokens(src: &str) -> Vec<Tok> {
    let cs: Vec<char> = src.chars().collect();
    let (mut out, mut i, mut line) = (Vec::new(), 0, 1);
    let text = |a: usize, b: usize| cs[a..b.min(cs.len())].iter().collect::<String>();
    while let Some(&c) = cs.get(i) {
        let at = |k: usize| cs.get(k).copied().unwrap_or('\0');
        let start = i;
        if c == '/' && at(i + 1) == '/' {
            while i < cs.len() && cs[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            i = skip_block_comment(&cs, i);
        } else if c == '"' {
            i = skip_string(&cs, i + 1);
            out.push(Tok { text: text(start, i), line });
        } else if c == '\'' {
            i = skip_quote(&cs, i);
        } else if is_ident_char(c) {
            while is_ident_char(at(i)) {
                i += 1;
            }
            let word = text(start, i);
            match literal_after_prefix(&cs, &word, i) {
                Some(end) => i = end,
                None => out.push(Tok { text: word, line }),
            }
        } else if c == ':' && at(i + 1) == ':' {
            out.push(Tok { text: "::".into(), line });
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(Tok { text: c.to_string(), line });
            }
            i += 1;
        }
        line += cs[start..i.min(cs.len())].iter().filter(|&&c| c == '\n').count();
    }
    out
}

/// The end of the (nestable) block comment starting at `i`.
fn skip_block_comment(cs: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < cs.len() {
        if cs[i] == '/' && cs.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if cs[i] == '*' && cs.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// The end of a string whose opening quote is just before `i`.
fn skip_string(cs: &[char], mut i: usize) -> usize {
    while i < cs.len() {
        match cs[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// The end of a character literal at `i`, or of a lifetime or label.
fn skip_quote(cs: &[char], i: usize) -> usize {
    match (cs.get(i + 1), cs.get(i + 2)) {
        (Some('\\'), _) => {
            let mut j = i + 3;
            while j < cs.len() && cs[j] != '\'' {
                j += 1;
            }
            j + 1
        }
        (Some(_), Some('\'')) => i + 3,
        _ => i + 1 + cs[i + 1..].iter().take_while(|&&c| is_ident_char(c)).count(),
    }
}

/// Where a literal ends that starts with the prefix `word` just before `i` (`b"…"`, `b'…'`,
/// `r#"…"#`, `br"…"`, `c"…"`), or `None` when `word` is an identifier (`r#type` included).
fn literal_after_prefix(cs: &[char], word: &str, i: usize) -> Option<usize> {
    let next = cs.get(i).copied();
    match (word, next) {
        ("b" | "c", Some('"')) => Some(skip_string(cs, i + 1)),
        ("b", Some('\'')) => Some(skip_quote(cs, i)),
        ("r" | "br" | "cr", Some('"' | '#')) => {
            let hashes = cs[i..].iter().take_while(|&&c| c == '#').count();
            if cs.get(i + hashes) != Some(&'"') {
                return None;
            }
            let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let body = i + hashes + 1;
            let end = cs[body..].windows(close.len()).position(|w| w == close.as_slice());
            Some(end.map_or(cs.len(), |e| body + e + close.len()))
        }
        _ => None,
    }
}

/// The index just past the delimiter that closes the one at `open` (`(`, `[` or `{`).
pub(crate) fn close_of(toks: &[Tok], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, t) in toks.iter().enumerate().skip(open) {
        match t.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

/// Whether the `cfg` predicate `p` holds only in test builds: `test`, `feature = "test-util"`,
/// `any(…)` of such only, or `all(…)` with one of them (`not(…)` never).
fn test_only_predicate(p: &[Tok]) -> bool {
    let words: Vec<&str> = p.iter().map(|t| t.text.as_str()).collect();
    match words.as_slice() {
        ["test"] | ["feature", "=", "\"test-util\""] => true,
        [op @ ("any" | "all"), "(", .., ")"] => {
            let args = split_args(&p[2..p.len() - 1]);
            if *op == "any" {
                !args.is_empty() && args.iter().all(|a| test_only_predicate(a))
            } else {
                args.iter().any(|a| test_only_predicate(a))
            }
        }
        _ => false,
    }
}

/// The comma-separated parts of `toks` at depth 0.
fn split_args(toks: &[Tok]) -> Vec<&[Tok]> {
    let (mut out, mut from, mut depth) = (Vec::new(), 0, 0usize);
    for (k, t) in toks.iter().enumerate() {
        match t.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => depth = depth.saturating_sub(1),
            "," if depth == 0 => {
                out.push(&toks[from..k]);
                from = k + 1;
            }
            _ => {}
        }
    }
    if from < toks.len() {
        out.push(&toks[from..]);
    }
    out
}

/// Whether the attribute whose tokens (inside `#[…]`) are `a` marks test code.
fn test_attribute(a: &[Tok]) -> bool {
    let words: Vec<&str> = a.iter().map(|t| t.text.as_str()).collect();
    match words.as_slice() {
        ["test"] | ["tokio", "::", "test", ..] => true,
        ["cfg", "(", .., ")"] => test_only_predicate(&a[2..a.len() - 1]),
        _ => false,
    }
}

/// Keywords that start an item (after its visibility and qualifiers): what an attribute on an
/// item is followed by, unlike one on a field, a match arm or an expression.
const ITEM_KEYWORDS: &[&str] = &[
    "fn",
    "struct",
    "enum",
    "mod",
    "impl",
    "trait",
    "type",
    "const",
    "static",
    "use",
    "union",
    "macro_rules",
    "extern",
    "let",
];

/// The index just past the item (or field, arm, statement) that starts at `start`.
fn item_end(toks: &[Tok], start: usize) -> usize {
    let mut words =
        toks[start..].iter().map(|t| t.text.as_str()).filter(|w| !is_qualifier(w) || ITEM_KEYWORDS.contains(w));
    let first_keyword = words.next();
    // `const fn` is a function; `const X: T = …;` ends at its semicolon.
    let const_fn = first_keyword == Some("const") && words.find(|w| !is_qualifier(w)) == Some("fn");
    let semicolon_only = !const_fn && matches!(first_keyword, Some("const" | "static" | "let" | "type" | "use"));
    let is_item = first_keyword.is_some_and(|w| ITEM_KEYWORDS.contains(&w));
    let mut k = start;
    while let Some(t) = toks.get(k) {
        match t.text.as_str() {
            ";" => return k + 1,
            "{" if !semicolon_only => return close_of(toks, k),
            "(" | "[" | "{" => k = close_of(toks, k),
            ")" | "]" | "}" => return k,
            "," if !is_item => return k + 1,
            _ => k += 1,
        }
    }
    toks.len()
}

/// Visibility and qualifier words that may come before an item's keyword.
fn is_qualifier(w: &str) -> bool {
    matches!(
        w,
        "pub" | "(" | ")" | "crate" | "super" | "self" | "in" | "async" | "unsafe" | "extern" | "\"C\"" | "default"
    )
}

/// For each token, whether it is test code (see the module documentation).
pub(crate) fn test_mask(toks: &[Tok]) -> Vec<bool> {
    let mut mask = vec![false; toks.len()];
    let mut i = 0;
    while i < toks.len() {
        if toks[i].text != "#" {
            i += 1;
            continue;
        }
        let inner = toks.get(i + 1).is_some_and(|t| t.text == "!");
        let open = if inner { i + 2 } else { i + 1 };
        if toks.get(open).is_none_or(|t| t.text != "[") {
            i += 1;
            continue;
        }
        let end = close_of(toks, open);
        let test = test_attribute(&toks[open + 1..end.saturating_sub(1)]);
        if test && inner {
            mask.iter_mut().for_each(|m| *m = true);
            return mask;
        }
        // The attributes after this one belong to the same item.
        let (mut item, mut test) = (end, test);
        while toks.get(item).is_some_and(|t| t.text == "#") && toks.get(item + 1).is_some_and(|t| t.text == "[") {
            let e = close_of(toks, item + 1);
            test |= test_attribute(&toks[item + 2..e.saturating_sub(1)]);
            item = e;
        }
        if test {
            let stop = item_end(toks, item);
            mask[i..stop].iter_mut().for_each(|m| *m = true);
            i = stop;
        } else {
            i = item;
        }
    }
    mask
}

/// One `.rs` file under a product crate's `src/`.
#[derive(Debug)]
pub(crate) struct SourceFile {
    /// The path from the workspace root, e.g. `proxy-core/src/relay/copy.rs`.
    pub(crate) name: String,
    /// The module path from the crate root: `a/b.rs` and `a/b/mod.rs` are `[a, b]`; `lib.rs`
    /// and a binary root are `[]`.
    pub(crate) module: Vec<String>,
    /// A binary root (`main.rs`, `src/bin/`): a crate of its own, naming the library by its
    /// crate name.
    pub(crate) binary: bool,
    /// Declared under a test-only attribute, itself or a module above it.
    pub(crate) test_only: bool,
    pub(crate) lines: usize,
    pub(crate) toks: Vec<Tok>,
    /// Whether each token is test code.
    pub(crate) test: Vec<bool>,
}

impl SourceFile {
    pub(crate) fn from_text(name: &str, module: &[&str], text: &str) -> Self {
        let toks = tokens(text);
        let test = test_mask(&toks);
        SourceFile {
            name: name.to_string(),
            module: module.iter().map(|m| m.to_string()).collect(),
            binary: false,
            test_only: test.first().copied().unwrap_or(false) && test.iter().all(|&t| t),
            lines: text.lines().count(),
            toks,
            test,
        }
    }

    /// The module declarations `mod x;` (no inline body) of the file, each with whether it is
    /// under a test-only attribute.
    fn declared(&self) -> Vec<(String, bool)> {
        let t = &self.toks;
        (0..t.len())
            .filter(|&k| t[k].text == "mod" && t.get(k + 2).is_some_and(|s| s.text == ";"))
            .filter(|&k| k == 0 || t[k - 1].text != "::")
            .map(|k| (t[k + 1].text.clone(), self.test[k]))
            .collect()
    }
}

/// The source files of product crate `krate` (a directory of the workspace), test files marked.
pub(crate) fn crate_files(krate: &str) -> Vec<SourceFile> {
    let src = workspace().join(krate).join("src");
    let mut out = Vec::new();
    let mut dirs = vec![(src.clone(), Vec::<String>::new(), false)];
    while let Some((dir, at, bin)) = dirs.pop() {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(&dir).expect("read src dir").map(|e| e.expect("dir entry").path()).collect();
        entries.sort();
        for p in entries {
            let name = p.file_name().and_then(|n| n.to_str()).expect("utf-8 file name").to_string();
            let top = at.is_empty() && !bin;
            if p.is_dir() {
                let is_bin = bin || (top && name == "bin");
                dirs.push((p.clone(), if is_bin { Vec::new() } else { [at.clone(), vec![name]].concat() }, is_bin));
                continue;
            }
            let Some(stem) = name.strip_suffix(".rs") else { continue };
            let (module, binary) = match stem {
                _ if bin => (Vec::new(), true),
                "main" if top => (Vec::new(), true),
                "lib" if top => (Vec::new(), false),
                "mod" => (at.clone(), false),
                _ => ([at.clone(), vec![stem.to_string()]].concat(), false),
            };
            let text = std::fs::read_to_string(&p).expect("read source file");
            let rel = p.strip_prefix(workspace()).unwrap_or(&p).display().to_string();
            let mut file = SourceFile::from_text(&rel, &[], &text);
            (file.module, file.binary) = (module, binary);
            out.push(file);
        }
    }
    mark_test_files(&mut out);
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Marks the library files whose module (or a module above it) is declared under a test-only
/// attribute.
pub(crate) fn mark_test_files(files: &mut [SourceFile]) {
    let mut test_modules = BTreeSet::new();
    for f in files.iter().filter(|f| !f.binary) {
        for (name, test) in f.declared() {
            if test || f.test_only {
                test_modules.insert([f.module.clone(), vec![name]].concat());
            }
        }
    }
    for f in files.iter_mut().filter(|f| !f.binary) {
        if (1..=f.module.len()).any(|n| test_modules.contains(&f.module[..n])) {
            f.test_only = true;
        }
    }
}

#[test]
fn test_code_is_masked_and_product_code_is_not() {
    let src = r#"
        fn product() {}
        #[cfg(test)]
        mod tests { fn a() { let s = "}"; } }
        #[cfg(any(test, feature = "test-util"))]
        #[allow(dead_code)]
        pub(crate) fn helper(x: [u8; 2]) -> u8 { x[0] }
        #[cfg(not(test))]
        fn kept() {}
        struct S { #[cfg(test)] seen: u8, kept_field: u8 }
        #[cfg(test)]
        mod declared;
        #[cfg(all(unix, test))]
        const C: u8 = { 1 };
        #[test]
        const fn f() -> u8 { 1 }
        #[derive(Debug)]
        struct T;
    "#;
    let f = SourceFile::from_text("f.rs", &[], src);
    let product: Vec<&str> =
        f.toks.iter().zip(&f.test).filter(|(_, t)| !**t).map(|(k, _)| k.text.as_str()).filter(|w| is_word(w)).collect();
    assert_eq!(
        product,
        [
            "fn",
            "product",
            "cfg",
            "not",
            "test",
            "fn",
            "kept",
            "struct",
            "S",
            "kept_field",
            "u8",
            "derive",
            "Debug",
            "struct",
            "T"
        ]
    );
    assert_eq!(f.declared(), [("declared".to_string(), true)]);
    assert!(!f.test_only);
    assert!(SourceFile::from_text("t.rs", &[], "#![cfg(test)]\nfn a() {}").test_only);
}
