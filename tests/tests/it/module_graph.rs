//! The product crates' module graphs have no cycle: within each crate, the top-level modules
//! (the first path segment under `src/`: a file `foo.rs`, or a folder `foo/` with its
//! `foo.rs` or `foo/mod.rs`) are read from the source text, with an edge wherever one module
//! names another (`use crate::…` trees, `crate::x::…` paths, `super::` and `self::`), and a
//! cycle among them fails naming the modules and the lines that make it.
//!
//! The crate root (`lib.rs`, with what it defines) is a node like the others: it names the
//! modules it composes, so a module that names something the root defines closes a cycle; what
//! the modules share lives in a module of its own, and the root only composes and re-exports.
//! Binary roots (`main.rs`, `src/bin/`) are crates of their own that name the library by its crate
//! name, so they are not read.
//!
//! A small tokenizer, not a Rust parser: it skips comments, strings and character literals,
//! follows inline `mod x { … }` blocks (so `use super::*` in a test module stays in its file),
//! and resolves paths by their first segments only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose `src/` is checked.
const CRATES: &[&str] = &["config", "wire", "proxy-core", "sni-router", "proxy-server", "proxy-agent"];

/// The node of the crate root (`lib.rs` and what it defines).
const ROOT: &str = "crate";

/// Module → module edges, each with where it was first seen (`file:line`).
type Graph = BTreeMap<String, BTreeMap<String, String>>;

#[derive(Debug, Clone, PartialEq)]
struct Tok {
    text: String,
    line: usize,
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The tokens of `src` that matter for paths: identifiers (and numbers), `::` and single
/// punctuation. Comments, string, byte-string, raw-string and character literals are dropped;
/// lifetimes leave their name, which no path rule reads as a module.
fn tokens(src: &str) -> Vec<Tok> {
    let cs: Vec<char> = src.chars().collect();
    let (mut out, mut i, mut line) = (Vec::new(), 0, 1);
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
        } else if c == '\'' {
            i = skip_quote(&cs, i);
        } else if is_ident_char(c) {
            while is_ident_char(at(i)) {
                i += 1;
            }
            let word: String = cs[start..i].iter().collect();
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
        line += cs[start..i].iter().filter(|&&c| c == '\n').count();
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

/// The end of a character literal at `i`, or just past the quote of a lifetime or label.
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
        _ => i + 1,
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

/// The paths a `use` tree starting at `*i` names (groups expanded, aliases dropped); `*i` ends
/// on the token after the tree.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        match toks.get(*i).map(|t| t.text.as_str()) {
            Some("{") => {
                *i += 1;
                while toks.get(*i).is_some_and(|t| t.text != "}") {
                    let before = *i;
                    use_tree(toks, i, path.clone(), out);
                    if toks.get(*i).is_some_and(|t| t.text == ",") || *i == before {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some("::" | "$") => *i += 1,
            Some("as") => *i += 2,
            Some(s) if s == "*" || s.starts_with(is_ident_char) => {
                path.push(s.to_string());
                *i += 1;
            }
            _ => {
                out.push(path);
                return;
            }
        }
    }
}

/// The path `a::b::c` starting at `*i` (at least one segment); `*i` ends after it.
fn expr_path(toks: &[Tok], i: &mut usize) -> Vec<String> {
    let mut path = vec![toks[*i].text.clone()];
    *i += 1;
    while toks.get(*i).is_some_and(|t| t.text == "::")
        && let Some(next) = toks.get(*i + 1).filter(|t| t.text.starts_with(is_ident_char))
    {
        path.push(next.text.clone());
        *i += 2;
    }
    path
}

/// The source files of a crate's library under `src`, each with its module path
/// (`a/b.rs` and `a/b/mod.rs` are `[a, b]`; `lib.rs` is `[]`).
fn source_files(src: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut out = Vec::new();
    let mut dirs = vec![(src.to_path_buf(), Vec::<String>::new())];
    while let Some((dir, at)) = dirs.pop() {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(&dir).expect("read src dir").map(|e| e.expect("dir entry").path()).collect();
        entries.sort();
        for p in entries {
            let name = p.file_name().and_then(|n| n.to_str()).expect("utf-8 file name").to_string();
            let top = at.is_empty();
            if p.is_dir() {
                if !(top && name == "bin") {
                    dirs.push((p.clone(), [at.clone(), vec![name]].concat()));
                }
                continue;
            }
            let Some(stem) = name.strip_suffix(".rs") else { continue };
            let module = match stem {
                "main" if top => continue,
                "lib" if top => Vec::new(),
                "mod" => at.clone(),
                _ => [at.clone(), vec![stem.to_string()]].concat(),
            };
            out.push((p, module));
        }
    }
    out
}

/// The crate's top-level modules: the names of `src/`'s files and folders.
fn top_modules(files: &[(PathBuf, Vec<String>)]) -> BTreeSet<String> {
    files.iter().filter_map(|(_, m)| m.first().cloned()).collect()
}

/// Reads one file into edges of `graph`.
struct Reader<'a> {
    modules: &'a BTreeSet<String>,
    graph: &'a mut Graph,
    file: &'a str,
}

impl Reader<'_> {
    /// The node `path` (absolute from the crate root) lands in.
    fn node(&self, abs: &[String]) -> String {
        abs.first().filter(|m| self.modules.contains(*m)).cloned().unwrap_or_else(|| ROOT.to_string())
    }

    /// `path` as seen from module `cur`, made absolute; `None` for what is not this crate's.
    fn absolute(&self, path: &[String], cur: &[String]) -> Option<Vec<String>> {
        let first = path.first()?.as_str();
        match first {
            "crate" => Some(path[1..].to_vec()),
            "self" => Some([cur, &path[1..]].concat()),
            "super" => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                let keep = cur.len().saturating_sub(ups);
                Some([&cur[..keep], &path[ups..]].concat())
            }
            // In the root, a bare path starting with a module's name is that module.
            m if cur.is_empty() && self.modules.contains(m) => Some(path.to_vec()),
            _ => None,
        }
    }

    fn edge(&mut self, cur: &[String], path: &[String], line: usize) {
        let Some(abs) = self.absolute(path, cur) else { return };
        let (from, to) = (self.node(cur), self.node(&abs));
        if from != to {
            let at = format!("{}:{line}", self.file);
            self.graph.entry(from).or_default().entry(to).or_insert(at);
        }
    }

    /// Every edge of the file with tokens `toks`, whose module path is `base`.
    fn read(&mut self, toks: &[Tok], base: &[String]) {
        let (mut cur, mut opened) = (base.to_vec(), Vec::<usize>::new());
        let (mut depth, mut i) = (0usize, 0);
        while let Some(t) = toks.get(i) {
            let prev = i.checked_sub(1).and_then(|p| toks.get(p)).map_or("", |p| p.text.as_str());
            let next = toks.get(i + 1).map_or("", |n| n.text.as_str());
            match t.text.as_str() {
                "{" => depth += 1,
                "}" => {
                    if opened.last() == Some(&depth) {
                        opened.pop();
                        cur.pop();
                    }
                    depth = depth.saturating_sub(1);
                }
                "mod" if toks.get(i + 2).is_some_and(|b| b.text == "{") => {
                    cur.push(next.to_string());
                    opened.push(depth + 1);
                }
                "use" if prev != "::" => {
                    let mut paths = Vec::new();
                    i += 1;
                    use_tree(toks, &mut i, Vec::new(), &mut paths);
                    for p in paths {
                        self.edge(&cur, &p, t.line);
                    }
                    continue;
                }
                w if next == "::" && !matches!(prev, "::" | "." | "in") && w.starts_with(is_ident_char) => {
                    let p = expr_path(toks, &mut i);
                    self.edge(&cur, &p, t.line);
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

/// The module graph of the crate whose sources are under `src`.
fn crate_graph(src: &Path) -> Graph {
    let files = source_files(src);
    let modules = top_modules(&files);
    let mut graph = Graph::new();
    for (path, module) in &files {
        let text = std::fs::read_to_string(path).expect("read source file");
        let rel = path.strip_prefix(src).unwrap_or(path).display().to_string();
        Reader { modules: &modules, graph: &mut graph, file: &rel }.read(&tokens(&text), module);
    }
    graph
}

/// A cycle of `graph` as its nodes, the first repeated at the end, or `None` if it has none.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    // Depth-first; a node met again while still on the stack closes a cycle.
    let mut done = BTreeSet::new();
    for start in graph.keys() {
        let mut stack: Vec<(&String, Vec<&String>)> = Vec::new();
        if done.contains(start) {
            continue;
        }
        stack.push((start, graph[start].keys().collect()));
        while let Some((node, rest)) = stack.last_mut() {
            let node: &String = node;
            let Some(next) = rest.pop() else {
                done.insert(node.clone());
                stack.pop();
                continue;
            };
            if let Some(at) = stack.iter().position(|(n, _)| *n == next) {
                let mut cycle: Vec<String> = stack[at..].iter().map(|(n, _)| (*n).clone()).collect();
                cycle.push(next.clone());
                return Some(cycle);
            }
            if !done.contains(next) {
                stack.push((next, graph.get(next).map(|m| m.keys().collect()).unwrap_or_default()));
            }
        }
    }
    None
}

/// `cycle` with the line that makes each edge, for the failure message.
fn describe(graph: &Graph, cycle: &[String]) -> String {
    let edges: Vec<String> =
        cycle.windows(2).map(|w| format!("{} → {} ({})", w[0], w[1], graph[&w[0]][&w[1]])).collect();
    edges.join(", ")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

#[test]
fn the_product_crates_have_no_module_cycle() {
    let mut cycles = Vec::new();
    for krate in CRATES {
        let src = workspace().join(krate).join("src");
        let graph = crate_graph(&src);
        assert!(graph.len() > 1, "{krate}: no module edges read from {}: the reader is broken", src.display());
        if let Some(cycle) = find_cycle(&graph) {
            cycles.push(format!("{krate}: {}", describe(&graph, &cycle)));
        }
    }
    assert!(
        cycles.is_empty(),
        "module cycles (move what both sides use into a module of its own):\n{}",
        cycles.join("\n")
    );
}

fn graph_of(edges: &[(&str, &str)]) -> Graph {
    let mut g = Graph::new();
    for (a, b) in edges {
        g.entry(a.to_string()).or_default().insert(b.to_string(), format!("{a}.rs:1"));
    }
    g
}

#[test]
fn the_cycle_finder_finds_a_cycle_and_passes_a_dag() {
    let dag = graph_of(&[("crate", "conn"), ("conn", "listener"), ("udp", "listener"), ("conn", "table")]);
    assert_eq!(find_cycle(&dag), None);
    let g = graph_of(&[("crate", "conn"), ("conn", "listeners"), ("listeners", "udp"), ("udp", "conn"), ("udp", "x")]);
    let cycle = find_cycle(&g).expect("a cycle");
    assert_eq!(cycle, ["conn", "listeners", "udp", "conn"]);
    assert_eq!(
        describe(&g, &cycle),
        "conn → listeners (conn.rs:1), listeners → udp (listeners.rs:1), udp → conn (udp.rs:1)"
    );
    assert_eq!(find_cycle(&graph_of(&[("a", "b"), ("b", "a")])).expect("two-node cycle"), ["a", "b", "a"]);
}

/// The edges `src` makes when it is the file of module `module` in a crate of `modules`.
fn edges_of(src: &str, module: &[&str], modules: &[&str]) -> Vec<(String, String)> {
    let modules: BTreeSet<String> = modules.iter().map(|m| m.to_string()).collect();
    let mut graph = Graph::new();
    let module: Vec<String> = module.iter().map(|m| m.to_string()).collect();
    Reader { modules: &modules, graph: &mut graph, file: "f.rs" }.read(&tokens(src), &module);
    graph.iter().flat_map(|(a, to)| to.keys().map(move |b| (a.clone(), b.clone()))).collect()
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn the_reader_follows_use_trees_paths_and_super_but_not_text() {
    let mods = ["a", "b", "c", "d", "e"];
    let src = r###"
        use crate::{a::X, b::{self, Y as Z}};
        use std::fmt; // use crate::e::Ignored;
        /* crate::e::Ignored /* nested */ crate::e::Ignored */
        fn f<'x>() -> char { let _ = "crate::e::Ignored"; let _ = r#"crate::e::"Ignored"#; proxy_core::d::Z; 'c' }
        fn g() { crate::c::call(); }
        mod tests { use super::*; }
    "###;
    assert_eq!(edges_of(src, &["d"], &mods), pairs(&[("d", "a"), ("d", "b"), ("d", "c")]));
    // The file of a nested module `a::b::c`: `super` is in its own top-level module `a`; three
    // `super`s are the root, and the root's `b` is module `b`.
    let nested = "use super::x; use super::super::super::b::Y; fn f() { super::super::c::g(); }";
    assert_eq!(edges_of(nested, &["a", "b", "c"], &mods), pairs(&[("a", "b")]));
    // What the root defines is the root's node; `pub(in crate::a)` is no edge.
    let uses_root = "use super::*; use crate::Shared; pub(in crate::a) fn f() { x.a::<u8>(); }";
    assert_eq!(edges_of(uses_root, &["e"], &mods), pairs(&[("e", ROOT)]));
    // The root names its modules by `crate::`, `self::` or bare paths; declaring one is no edge.
    let root = "mod a; use crate::b::Thing; use self::c::X; pub use d::Y; fn f() { e::g(); std::mem::drop(1); }";
    assert_eq!(edges_of(root, &[], &mods), pairs(&[(ROOT, "b"), (ROOT, "c"), (ROOT, "d"), (ROOT, "e")]));
}
