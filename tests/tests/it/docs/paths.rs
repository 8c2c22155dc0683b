//! Every Rust path the documentation names in a code span resolves in the sources: a test the
//! threat model gives as a row's proof (`conn::tests::offered_protocols_are_logged_escaped`), a
//! module a design page points to (`proxy_core::relay::access`), a type a convention names
//! (`frontend::Refusal`). A renamed test or a moved module
//! that leaves a page behind fails here, so a row of the threat model cannot go on naming a test
//! that no longer exists.
//!
//! A path is read as a crate's when its first segment names one of the workspace (its modules
//! from that crate's root: a module, or an item in one); failing that, or otherwise, as the last segments of a
//! module path, with the item last, anywhere in the repository's sources (the vendored crates
//! included). A file's module path comes from where it lies (`a/b/mod.rs` and `a/b.rs` are
//! `a::b`; the roots of `src/` and of an integration test's folder are empty), and a module
//! written inline in it (`mod tests { … }`) extends it. An item is found where its name is a
//! whole word of that file: a function, a test made by a macro, a constant, a type. Paths into the
//! standard library and third-party crates ([`NOT_OURS`]) are not checked.

use super::*;

/// The workspace's crates by the name a path uses, with their sources' root.
const CRATES: [(&str, &str); 10] = [
    ("seedgate_config", "config/src"),
    ("proxy_wire", "wire/src"),
    ("proxy_core", "proxy-core/src"),
    ("sni_router", "sni-router/src"),
    ("proxy_server", "proxy-server/src"),
    ("proxy_agent", "proxy-agent/src"),
    ("testbed", "tests/src"),
    ("bench", "bench/src"),
    ("demo", "demo/src"),
    ("quinn_proto", "third_party/quinn-proto/src"),
];

/// First segments of the paths into the standard library and third-party crates, which are not
/// checked (`io::Error`, `u64::MAX`, `http::uri::Authority`).
const NOT_OURS: [&str; 16] = [
    "std", "core", "alloc", "io", "fmt", "u8", "u16", "u32", "u64", "usize", "http", "h2", "hyper", "tokio", "rustls",
    "quinn",
];

/// One source file: where it lies (relative to the root), its module path and what modules it
/// writes inline.
struct Source {
    rel: String,
    module: Vec<String>,
    inline: Vec<String>,
    text: String,
}

/// The repository's sources but the fuzz targets' crate.
fn sources() -> Vec<Source> {
    let root = repo_root();
    rust_files()
        .into_iter()
        .filter(|rel| !rel.components().any(|c| c.as_os_str() == "fuzz"))
        .map(|rel| {
            let text = std::fs::read_to_string(root.join(&rel)).unwrap_or_default();
            let stem = rel.file_stem().expect("a file").to_string_lossy().into_owned();
            let rel = rel.to_string_lossy().into_owned();
            Source { module: module_of(&rel, &stem), inline: inline_modules(&text), rel, text }
        })
        .collect()
}

/// `proxy-core/src/relay/access.rs` -> `relay::access`; `tests/tests/it/docs/mod.rs` -> `docs`.
fn module_of(rel: &str, stem: &str) -> Vec<String> {
    let inner =
        ["/src/", "/tests/it/", "/tests/"].iter().find_map(|cut| rel.split_once(cut).map(|(_, r)| r)).unwrap_or(rel);
    let mut parts: Vec<String> = inner.split('/').map(str::to_owned).collect();
    parts.pop();
    if !["mod", "lib", "main"].contains(&stem) {
        parts.push(stem.to_owned());
    }
    parts
}

/// The modules a file writes inline (`mod tests {`).
fn inline_modules(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start().trim_start_matches("pub(crate) ").trim_start_matches("pub ");
            let rest = l.strip_prefix("mod ")?;
            let (name, after) = rest.split_once(|c: char| !is_ident(c))?;
            after.trim_start().starts_with('{').then(|| name.to_owned())
        })
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `word` occurs in `text` as a whole identifier.
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The code span as a Rust path (`a::b::c`, `a::b::Type`: modules in lower case, the last segment
/// any identifier), or `None`.
fn rust_path(span: &str) -> Option<Vec<&str>> {
    let segs: Vec<&str> = span.split("::").collect();
    let (last, modules) = segs.split_last()?;
    let module = |s: &&str| {
        s.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    let item = last.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && last.chars().all(is_ident);
    (!modules.is_empty() && modules.iter().all(module) && item).then_some(segs)
}

/// Whether `path` names a module, or an item in one, among `srcs`.
fn resolves(path: &[&str], srcs: &[Source]) -> bool {
    let (item, parent) = path.split_last().expect("two segments at least");
    if let Some((_, root)) = CRATES.iter().find(|(name, _)| *name == path[0]) {
        let in_crate = |s: &&Source| s.rel.starts_with(&format!("{root}/"));
        let modules = &path[1..];
        let found = srcs.iter().filter(in_crate).any(|s| {
            same(&s.module, modules)
                || (same(&s.module, &parent[1..]) && (has_word(&s.text, item) || s.inline.iter().any(|m| m == item)))
        });
        if found {
            return true;
        }
        // Not the crate's: an integration test's file may share its name (`sni_router::…`).
    }
    srcs.iter().any(|s| {
        let ends = |m: &[String]| m.len() >= parent.len() && same(&m[m.len() - parent.len()..], parent);
        let here = ends(&s.module) || s.inline.iter().any(|i| ends(&[s.module.clone(), vec![i.clone()]].concat()));
        here && has_word(&s.text, item)
    })
}

fn same(a: &[String], b: &[&str]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

#[test]
fn the_rust_paths_the_docs_name_resolve() {
    let srcs = sources();
    let mut unresolved = Vec::new();
    let mut named = 0;
    for (doc, n, span) in code_spans() {
        let Some(path) = rust_path(&span).filter(|p| !NOT_OURS.contains(&p[0])) else { continue };
        named += 1;
        if !resolves(&path, &srcs) {
            unresolved.push(format!("{}:{n}: {span}", doc.display()));
        }
    }
    assert!(named > 100, "only {named} Rust paths named: is the reading of code spans broken?");
    assert!(unresolved.is_empty(), "Rust paths the docs name that resolve to nothing:\n  {}", unresolved.join("\n  "));
}

#[test]
fn a_path_resolves_by_its_crate_or_by_the_end_of_its_module_path() {
    let srcs = sources();
    let ok = |p: &str| resolves(&rust_path(p).expect("a path"), &srcs);
    assert!(ok("proxy_core::relay::access"), "a module from its crate's root");
    assert!(ok("proxy_core::sync"), "a module at its crate's root");
    assert!(ok("proxy_core::app::main"), "an item of a module");
    assert!(ok("registry::tally::tests::every_dial_result_is_named_once_and_other_is_the_tunnel_error"));
    assert!(ok("docs::paths::the_rust_paths_the_docs_name_resolve"), "an integration test, by its file");
    assert!(!ok("registry::tests::every_dial_result_is_named_once_and_other_is_the_tunnel_error"), "the wrong module");
    assert!(!ok("tally::tests::no_such_test"), "a test that does not exist");
    assert!(!ok("proxy_core::relay::no_such_module"));
    assert!(!ok("proxy_server::relay::access"), "another crate's module");
    assert!(ok("proxy_core::net::admission::Refusal"), "a type, by its crate");
    assert!(ok("frontend::Refusal"), "a type, by the end of its module path");
    assert!(!ok("frontend::NoSuchRefusal"));
    assert!(rust_path("Session::looked_at").is_none() && rust_path("cargo test").is_none());
    assert!(rust_path("a::b()").is_none() && rust_path("x::<T>").is_none());
}
