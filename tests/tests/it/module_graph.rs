//! The product crates' module graphs have no cycle, at two grains: their top-level modules, and
//! their files. Both are read from the source text, with an edge wherever one module names another
//! (`use crate::…` trees, `crate::x::…` paths, `super::` and `self::` paths, and bare paths that
//! start with a child module's name); a cycle fails naming the nodes and the lines that make it.
//!
//! **Top-level modules** (the first path segment under `src/`: a file `foo.rs`, or a folder
//! `foo/` with its `foo.rs` or `foo/mod.rs`): no cycle at all, test modules included. The crate
//! root (`lib.rs`, with what it defines) is a node like the others: it names the modules it
//! composes, so a module that names something the root defines closes a cycle; what the modules
//! share lives in a module of its own, and the root only composes and re-exports.
//!
//! **Files** (each library `.rs` file a node, test code left out: `#[cfg(test)]` items and the
//! files declared under them): no import circle between files, except the circles of today listed
//! in [`FILE_CIRCLES`], which only shrink. An edge goes from the file a path is written in to the
//! file that defines what it names, by these rules:
//! - *Declaring a module is no edge.* `mod x;` in `foo.rs` is the parent/child relation, not a
//!   use, so a child that uses what its parent file defines (`use super::Shared`) is an edge child
//!   → parent and no circle by itself. A parent that also uses something its child defines closes
//!   one: as at the crate root, what both use moves into a file of its own (or the child), and the
//!   parent only composes.
//! - *A re-export is looked through.* `pub use child::Thing` (any visibility) in a parent makes
//!   `parent::Thing` name the child's file; the re-export is an edge of the parent only where the
//!   parent's own code names `Thing` too. A private `use` is an edge of its file, and is looked
//!   through as well where another path goes through it (a child's `super::Thing`). So a
//!   `mod.rs` that only declares and re-exports is no node of any circle.
//! - Paths outside the crate are no edges; a path lands in the longest module prefix that has a
//!   file (an inline `mod x { … }` belongs to its file), after re-exports. Globs (`use super::*`)
//!   are an edge to the file of the module they open; a glob re-export is not looked through.
//!
//! Binary roots (`main.rs`, `src/bin/`) are crates of their own that name the library by its crate
//! name, so they are not read. The reader is [`crate::source`]'s tokenizer, not a Rust parser:
//! comments and literals are skipped (paths in strings, such as serde's `default = "…"`, are not
//! read), and a path's first segments decide where it lands.

use crate::source::{self, SourceFile, Tok, is_word};
use std::collections::{BTreeMap, BTreeSet};

/// The node of the crate root in the top-level graph (`lib.rs` and what it defines).
const ROOT: &str = "crate";

/// The import circles between files of today: each entry is one circle (a strongly connected
/// set of files, by the rules in the module documentation), files named from the workspace root.
/// The refactors that split these files empty the list; the test fails when an entry is no longer
/// exactly a circle of today's tree (gone or smaller: update or remove the entry), and when a
/// circle is not listed (break it).
const FILE_CIRCLES: &[&[&str]] = &[];

/// Node → node edges, each with where it was first seen (`file:line`).
type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// What a `use` item brings into scope.
#[derive(Debug, Clone, PartialEq)]
struct Import {
    /// The name it is known by here (the alias, or the path's last segment; `*` for a glob).
    name: String,
    /// A re-export (`pub`, `pub(crate)`, `pub(super)`, `pub(in …)`).
    public: bool,
    /// Whether the name appears in this file's own code outside `use` items.
    used_here: bool,
}

/// One path a file names.
#[derive(Debug, Clone)]
struct Ref {
    /// The module it is written in: the file's, or that of an inline module in it.
    cur: Vec<String>,
    path: Vec<String>,
    line: usize,
    /// Written in test code.
    test: bool,
    /// Set for the paths of a `use` item.
    import: Option<Import>,
}

/// The paths a `use` tree starting at `*i` names, groups expanded, each with its alias (`as x`);
/// `*i` ends on the token after the tree.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let (mut path, mut alias) = (prefix, None);
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
            Some("as") => {
                alias = toks.get(*i + 1).map(|t| t.text.clone());
                *i += 2;
            }
            Some(s) if s == "*" || is_word(s) => {
                path.push(s.to_string());
                *i += 1;
            }
            _ => {
                out.push((path, alias));
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
        && let Some(next) = toks.get(*i + 1).filter(|t| is_word(&t.text))
    {
        path.push(next.text.clone());
        *i += 2;
    }
    path
}

/// Whether the `use` at `i` has a visibility (`pub`, `pub(…)`).
fn is_public_use(toks: &[Tok], i: usize) -> bool {
    let text = |k: usize| toks.get(k).map_or("", |t| t.text.as_str());
    match text(i.wrapping_sub(1)) {
        "pub" => true,
        ")" => {
            // Back to the matching `(`, then `pub` before it.
            let mut depth = 0usize;
            for k in (0..i).rev() {
                match text(k) {
                    ")" => depth += 1,
                    "(" => {
                        depth -= 1;
                        if depth == 0 {
                            return text(k.wrapping_sub(1)) == "pub";
                        }
                    }
                    _ => {}
                }
            }
            false
        }
        _ => false,
    }
}

/// The name a `use` path brings into scope: its alias, or its last segment (`a::b::{self}` is `b`).
fn import_name(path: &[String], alias: Option<String>) -> Option<String> {
    alias.or_else(|| path.iter().rev().find(|s| *s != "self").cloned())
}

/// Every path `file` names. `known` holds every module path of the crate that has a file (and
/// their prefixes); the inline modules met in the file are added to it.
fn read_refs(file: &SourceFile, known: &mut BTreeSet<Vec<String>>) -> Vec<Ref> {
    let toks = &file.toks;
    let (mut cur, mut opened) = (file.module.clone(), Vec::<usize>::new());
    let (mut depth, mut i) = (0usize, 0);
    let (mut refs, mut in_use) = (Vec::new(), vec![false; toks.len()]);
    while let Some(t) = toks.get(i) {
        let prev = i.checked_sub(1).and_then(|p| toks.get(p)).map_or("", |p| p.text.as_str());
        let next = toks.get(i + 1).map_or("", |n| n.text.as_str());
        let test = file.test.get(i).copied().unwrap_or(false);
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
                known.insert(cur.clone());
                opened.push(depth + 1);
            }
            "use" if prev != "::" => {
                let (public, start) = (is_public_use(toks, i), i);
                let mut paths = Vec::new();
                i += 1;
                use_tree(toks, &mut i, Vec::new(), &mut paths);
                in_use[start..i.min(toks.len())].iter_mut().for_each(|u| *u = true);
                for (path, alias) in paths {
                    let name = import_name(&path, alias).unwrap_or_default();
                    let import = Some(Import { name, public, used_here: false });
                    refs.push(Ref { cur: cur.clone(), path, line: t.line, test, import });
                }
                continue;
            }
            w if next == "::" && !matches!(prev, "::" | "." | "in") && is_word(w) => {
                let path = expr_path(toks, &mut i);
                refs.push(Ref { cur: cur.clone(), path, line: t.line, test, import: None });
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    // Which imported names this file's own code names (outside `use` items and test code).
    let words: BTreeSet<&str> = (0..toks.len())
        .filter(|&k| !in_use[k] && !file.test.get(k).copied().unwrap_or(false))
        .map(|k| toks[k].text.as_str())
        .collect();
    for r in &mut refs {
        if let Some(import) = &mut r.import {
            import.used_here = words.contains(import.name.as_str());
        }
    }
    refs
}

/// `path` as seen from module `cur`, made absolute; `None` for what is not this crate's. A bare
/// path is this crate's where its first segment is a child module of `cur`.
fn absolute(path: &[String], cur: &[String], known: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let first = path.first()?.as_str();
    match first {
        "crate" => Some(path[1..].to_vec()),
        "self" => Some([cur, &path[1..]].concat()),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let keep = cur.len().saturating_sub(ups);
            Some([&cur[..keep], &path[ups..]].concat())
        }
        m if known.contains(&[cur, &[m.to_string()]].concat()) => Some([cur, path].concat()),
        _ => None,
    }
}

/// Every module path of `files` and their prefixes, the root (`[]`) included.
fn module_paths<'f>(files: impl IntoIterator<Item = &'f SourceFile>) -> BTreeSet<Vec<String>> {
    files.into_iter().flat_map(|f| (0..=f.module.len()).map(|n| f.module[..n].to_vec())).collect()
}

/// The top-level module graph of one crate's library files (test code included).
fn top_graph(files: &[SourceFile]) -> Graph {
    let mut known = module_paths(files);
    let tops: BTreeSet<&String> = files.iter().filter_map(|f| f.module.first()).collect();
    let node = |abs: &[String]| abs.first().filter(|m| tops.contains(m)).cloned().unwrap_or_else(|| ROOT.to_string());
    let mut graph = Graph::new();
    for f in files {
        let name = f.name.split_once("/src/").map_or(f.name.as_str(), |(_, n)| n);
        for r in read_refs(f, &mut known) {
            let Some(abs) = absolute(&r.path, &r.cur, &known) else { continue };
            let (from, to) = (node(&r.cur), node(&abs));
            if from != to {
                graph.entry(from).or_default().entry(to).or_insert_with(|| format!("{name}:{}", r.line));
            }
        }
    }
    graph
}

/// The file graph of one crate's library files (test code left out), nodes named by file.
fn file_graph(files: &[SourceFile]) -> Graph {
    let files: Vec<&SourceFile> = files.iter().filter(|f| !f.test_only).collect();
    let mut known = module_paths(files.iter().copied());
    let refs: Vec<Vec<Ref>> = files.iter().map(|f| read_refs(f, &mut known)).collect();
    // The file each module's items are written in (inline modules: their file's).
    let mut file_of: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for (k, f) in files.iter().enumerate() {
        file_of.insert(f.module.clone(), k);
    }
    // Names brought into a module by `use`: what a path through that module resolves to.
    let mut imports: BTreeMap<(Vec<String>, String), Option<Vec<String>>> = BTreeMap::new();
    for (k, rs) in refs.iter().enumerate() {
        for r in rs.iter().filter(|r| !r.test) {
            for m in (files[k].module.len()..=r.cur.len()).map(|n| r.cur[..n].to_vec()) {
                file_of.entry(m).or_insert(k);
            }
            let Some(import) = &r.import else { continue };
            // A one-segment `use` re-exports an item of its own file (`pub(crate) use a_macro;`).
            if import.name == "*" || r.path.len() < 2 {
                continue;
            }
            imports.insert((r.cur.clone(), import.name.clone()), absolute(&r.path, &r.cur, &known));
        }
    }
    let resolve = |abs: &[String]| -> Option<usize> {
        let mut abs = abs.to_vec();
        for _ in 0..16 {
            let k = (0..=abs.len()).rev().find(|&k| file_of.contains_key(&abs[..k]))?;
            if let Some(name) = abs.get(k)
                && let Some(target) = imports.get(&(abs[..k].to_vec(), name.clone()))
            {
                abs = [target.as_deref()?, &abs[k + 1..]].concat();
                continue;
            }
            return file_of.get(&abs[..k]).copied();
        }
        None
    };
    let mut graph = Graph::new();
    for (k, rs) in refs.iter().enumerate() {
        for r in rs.iter().filter(|r| !r.test) {
            if r.import.as_ref().is_some_and(|i| i.public && (!i.used_here || i.name == "*")) {
                continue;
            }
            let Some(to) = absolute(&r.path, &r.cur, &known).and_then(|abs| resolve(&abs)) else { continue };
            if to != k {
                let at = format!("{}:{}", files[k].name, r.line);
                graph.entry(files[k].name.clone()).or_default().entry(files[to].name.clone()).or_insert(at);
            }
        }
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

/// The nodes `from` reaches in `graph` (itself only through a cycle).
fn reach<'g>(graph: &'g Graph, from: &str) -> BTreeSet<&'g str> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&str> = graph.get(from).map(|m| m.keys().map(String::as_str).collect()).unwrap_or_default();
    while let Some(n) = todo.pop() {
        if seen.insert(n) {
            todo.extend(graph.get(n).map(|m| m.keys().map(String::as_str)).into_iter().flatten());
        }
    }
    seen
}

/// The circles of `graph`: its strongly connected sets of more than one node.
fn circles(graph: &Graph) -> BTreeSet<BTreeSet<String>> {
    let reached: BTreeMap<&str, BTreeSet<&str>> = graph.keys().map(|n| (n.as_str(), reach(graph, n))).collect();
    let mut out = BTreeSet::new();
    for (n, r) in &reached {
        let scc: BTreeSet<String> =
            r.iter().filter(|m| reached.get(*m).is_some_and(|back| back.contains(n))).map(|m| m.to_string()).collect();
        if scc.len() > 1 {
            out.insert(scc);
        }
    }
    out
}

/// The edges of `graph` inside `circle`, with the line that makes each.
fn circle_edges(graph: &Graph, circle: &BTreeSet<String>) -> String {
    let mut lines = Vec::new();
    for from in circle {
        for (to, at) in graph.get(from).into_iter().flatten().filter(|(to, _)| circle.contains(*to)) {
            lines.push(format!("    {from} → {to} ({at})"));
        }
    }
    lines.join("\n")
}

/// What is wrong with today's `found` circles against the `listed` ones, one paragraph each
/// (empty when they are the same).
fn compare_circles(graph: &Graph, found: &BTreeSet<BTreeSet<String>>, listed: &[BTreeSet<String>]) -> Vec<String> {
    let mut problems = Vec::new();
    for c in found.iter().filter(|c| !listed.contains(c)) {
        let files: Vec<&String> = c.iter().collect();
        if listed.iter().any(|l| c.is_subset(l)) {
            continue; // Reported below, with the listed entry it is part of.
        }
        problems.push(format!(
            "a new import circle between files (or a listed one that grew) {files:?}; break it: move what both \
             sides use into a file of their own, or into the child (a parent that uses its child must not be \
             used by it), so that these edges go one way:\n{}",
            circle_edges(graph, c)
        ));
    }
    for l in listed.iter().filter(|l| !found.contains(*l)) {
        let now: Vec<Vec<&String>> = found.iter().filter(|c| c.is_subset(l)).map(|c| c.iter().collect()).collect();
        let entry: Vec<&String> = l.iter().collect();
        problems.push(if now.is_empty() {
            format!("the listed circle {entry:?} is no longer one: remove its entry from FILE_CIRCLES in {}", file!())
        } else {
            format!(
                "the listed circle {entry:?} shrank to {now:?}: replace its entry in FILE_CIRCLES in {} by these",
                file!()
            )
        });
    }
    problems
}

#[test]
fn the_product_crates_have_no_top_level_module_cycle() {
    let mut cycles = Vec::new();
    for krate in source::CRATES {
        // Test code is left out, as in the file graph: a test file may use any module of its crate.
        let files: Vec<SourceFile> =
            source::crate_files(krate).into_iter().filter(|f| !f.binary && !f.test_only).collect();
        let graph = top_graph(&files);
        assert!(graph.len() > 1, "{krate}: no module edges read from its src/: the reader is broken");
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

#[test]
fn the_product_crates_have_no_import_circle_between_files_but_the_listed_ones() {
    let (mut graph, mut found) = (Graph::new(), BTreeSet::new());
    for krate in source::CRATES {
        let files: Vec<SourceFile> = source::crate_files(krate).into_iter().filter(|f| !f.binary).collect();
        let g = file_graph(&files);
        assert!(g.len() > 1, "{krate}: no file edges read from its src/: the reader is broken");
        found.extend(circles(&g));
        graph.extend(g);
    }
    let listed: Vec<BTreeSet<String>> =
        FILE_CIRCLES.iter().map(|c| c.iter().map(|f| f.to_string()).collect()).collect();
    let problems = compare_circles(&graph, &found, &listed);
    assert!(problems.is_empty(), "import circles between files:\n{}", problems.join("\n"));
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
    assert!(circles(&dag).is_empty());
    let g = graph_of(&[("crate", "conn"), ("conn", "listeners"), ("listeners", "udp"), ("udp", "conn"), ("udp", "x")]);
    let cycle = find_cycle(&g).expect("a cycle");
    assert_eq!(cycle, ["conn", "listeners", "udp", "conn"]);
    assert_eq!(
        describe(&g, &cycle),
        "conn → listeners (conn.rs:1), listeners → udp (listeners.rs:1), udp → conn (udp.rs:1)"
    );
    assert_eq!(find_cycle(&graph_of(&[("a", "b"), ("b", "a")])).expect("two-node cycle"), ["a", "b", "a"]);
    let set = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<BTreeSet<String>>();
    let two = graph_of(&[("a", "b"), ("b", "a"), ("b", "c"), ("c", "d"), ("d", "c")]);
    assert_eq!(circles(&two), BTreeSet::from([set(&["a", "b"]), set(&["c", "d"])]));
}

#[test]
fn listed_circles_only_shrink() {
    let set = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<BTreeSet<String>>();
    let g = graph_of(&[("a", "b"), ("b", "a"), ("c", "d"), ("d", "c"), ("d", "e"), ("e", "d")]);
    let found = circles(&g);
    assert_eq!(compare_circles(&g, &found, &[set(&["a", "b"]), set(&["c", "d", "e"])]), Vec::<String>::new());
    // A listed circle that lost a file, one that is gone, one that is new, one that grew.
    let problems = compare_circles(&g, &found, &[set(&["a", "b", "x"]), set(&["c", "d"]), set(&["y", "z"])]);
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(problems[0].contains("new import circle") && problems[0].contains("d → e (d.rs:1)"), "{}", problems[0]);
    assert!(problems[1].contains("shrank to [[\"a\", \"b\"]]"), "{}", problems[1]);
    assert!(problems[2].contains("is no longer one") && problems[2].contains("\"c\", \"d\""), "{}", problems[2]);
    assert!(problems[3].contains("is no longer one") && problems[3].contains("\"y\""), "{}", problems[3]);
}

/// The top-level edges `src` makes when it is the file of module `module` in a crate whose files
/// are the modules `modules`.
fn edges_of(src: &str, module: &[&str], modules: &[&str]) -> Vec<(String, String)> {
    let mut files: Vec<SourceFile> =
        modules.iter().map(|m| SourceFile::from_text(&format!("{m}.rs"), &[m], "")).collect();
    files.push(SourceFile::from_text("f.rs", module, src));
    let graph = top_graph(&files);
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

/// The file edges of a crate made of `files` (name, module path, source).
fn file_edges(files: &[(&str, &[&str], &str)]) -> Vec<(String, String)> {
    let mut files: Vec<SourceFile> = files.iter().map(|(n, m, s)| SourceFile::from_text(n, m, s)).collect();
    source::mark_test_files(&mut files);
    let graph = file_graph(&files);
    graph.iter().flat_map(|(a, to)| to.keys().map(move |b| (a.clone(), b.clone()))).collect()
}

#[test]
fn file_edges_look_through_re_exports_and_skip_declarations_and_tests() {
    // A parent that declares and re-exports: no node of a circle; the child's `super::Thing`
    // lands in the sibling that defines it.
    let parent = "mod copy; mod io; pub(crate) use copy::Transfer; pub use io::Io as Stream; pub struct Outcome;";
    let copy = "use super::Outcome; pub struct Transfer; fn f() { super::Stream::new(); }";
    let io = "use super::Transfer; pub struct Io; #[cfg(test)] mod tests { use crate::relay::copy::Transfer; }";
    let lib = "pub mod relay; #[cfg(test)] mod tests; fn g() { relay::Outcome; }";
    let tests = "use crate::relay::io::Io;";
    let edges = file_edges(&[
        ("lib.rs", &[], lib),
        ("relay/mod.rs", &["relay"], parent),
        ("relay/copy.rs", &["relay", "copy"], copy),
        ("relay/io.rs", &["relay", "io"], io),
        ("tests.rs", &["tests"], tests),
    ]);
    assert_eq!(
        edges,
        pairs(&[
            ("lib.rs", "relay/mod.rs"),
            ("relay/copy.rs", "relay/io.rs"),
            ("relay/copy.rs", "relay/mod.rs"),
            ("relay/io.rs", "relay/copy.rs"),
        ])
    );
    // A re-export the parent's own code uses is an edge of the parent; a private import is one
    // of its file, and is looked through by a child's `super::` path.
    let parent = "mod a; mod b; pub use a::A; use b::B; fn f(x: A, y: B) {}";
    let a = "use super::B;";
    let edges = file_edges(&[("m.rs", &[], parent), ("a.rs", &["a"], a), ("b.rs", &["b"], "")]);
    assert_eq!(edges, pairs(&[("a.rs", "b.rs"), ("m.rs", "a.rs"), ("m.rs", "b.rs")]));
}
