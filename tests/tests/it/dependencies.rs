//! What the workspace depends on: every package's licence is one the project accepts, and the
//! build of the product binaries holds one version of each crate, but for the duplicates of today
//! listed with why each is accepted.
//!
//! Licences are read from `cargo metadata --offline --locked` for the Linux target the deployment
//! builds (`x86_64-unknown-linux-gnu`): every package of the lock file that target compiles,
//! build and dev dependencies included. A package's `license` is an SPDX expression: `OR` is met
//! when one side is allowed, `AND` when both are, `A WITH exception` is allowed only as written in
//! [`ALLOWED_LICENCES`], and cargo's old `A/B` means `A OR B`. A package with only a
//! `license-file` (no SPDX expression) fails until its licence has been read and it is named here.
//!
//! Duplicates are read from `cargo tree -e normal,build` of the three binaries: the packages a
//! release build of them compiles, build scripts' dependencies included (`cargo metadata`'s
//! resolve unifies features over the whole workspace, the tests' dev-dependencies included, so it
//! names packages the binaries never build). Two versions count as one when semver-compatible
//! (`1.2` and `1.3`; `0.22` and `0.23` are two), so routine updates do not touch the list.

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// The target whose build is checked: the deployment's image is Linux on x86-64.
const TARGET: &str = "x86_64-unknown-linux-gnu";

/// The product binaries.
const BINARIES: &[&str] = &["sni-router", "proxy-server", "proxy-agent"];

/// The licences a dependency may have (SPDX identifiers), each with why it is accepted. All are
/// permissive: they allow use, change and redistribution in a closed or open product with at most
/// a notice kept. Not on the list, and so a decision of its own when a dependency brings one: any
/// copyleft licence (GPL, LGPL, AGPL; MPL-2.0's file-level copyleft included), `OpenSSL` (its
/// advertising clause), `Unlicense` (today only ever offered beside MIT), and no licence at all.
const ALLOWED_LICENCES: &[(&str, &str)] = &[
    ("Apache-2.0", "permissive with a patent grant; the workspace's own licence"),
    ("Apache-2.0 WITH LLVM-exception", "Apache-2.0 with an exception that only removes obligations"),
    ("MIT", "permissive, notice kept"),
    ("MIT-0", "MIT without even the notice"),
    ("BSD-2-Clause", "permissive, notice kept"),
    ("BSD-3-Clause", "permissive, notice kept, no endorsement by name"),
    ("ISC", "permissive, notice kept (MIT's terms in other words)"),
    ("Zlib", "permissive, altered versions marked as such"),
    ("Unicode-3.0", "the Unicode data files' licence: permissive, notice kept"),
    ("CC0-1.0", "a public-domain dedication"),
];

/// The crates of which the product build holds more than one version today, each with the
/// semver-compatible versions and why it is accepted. The list only shrinks: an entry whose
/// crate is down to one version fails the test until it is removed.
const DUPLICATES: &[(&str, &[&str], &str)] = &[
    ("base64", &["0.22", "0.23"], "tonic 0.14 depends on 0.22; proxy-wire uses 0.23"),
    (
        "foldhash",
        &["0.1", "0.2"],
        "0.1 through hashbrown 0.15 under petgraph, a build-time dependency of the gRPC code generator",
    ),
    (
        "getrandom",
        &["0.3", "0.4"],
        "0.3 under rand 0.9 (proxy-core, proxy-agent); 0.4 under rand 0.10, which the vendored quinn-proto \
         0.11.19 uses, and tempfile (build time)",
    ),
    ("hashbrown", &["0.15", "0.17"], "0.15 under petgraph, a build-time dependency of the gRPC code generator"),
    ("prettyplease", &["0.2", "0.3"], "build time only: tonic-build uses 0.2, prost-build 0.3"),
    ("rand", &["0.9", "0.10"], "proxy-core and proxy-agent use 0.9; the vendored quinn-proto 0.11.19 uses 0.10"),
    ("rand_core", &["0.9", "0.10"], "follows rand's two versions"),
    ("syn", &["2", "3"], "build time only: the proc-macro crates are between syn 2 and 3"),
    ("thiserror", &["1", "2"], "ppp 2.3 (the PROXY-protocol writer) depends on thiserror 1"),
    ("thiserror-impl", &["1", "2"], "follows thiserror's two versions"),
    (
        "untrusted",
        &["0.7", "0.9"],
        "0.7 under aws-lc-rs's default ring-compatible API, which x509-parser's verify-aws feature (the \
         revocation lists' signatures) turns on; 0.9 under rustls-webpki",
    ),
    ("unicode-width", &["0.1", "0.2"], "build time only: miette (under protox) uses 0.1, annotate-snippets 0.2"),
];

fn cargo(args: &[&str]) -> Result<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo).args(args).current_dir(crate::source::workspace()).output()?;
    ensure!(out.status.success(), "cargo {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?)
}

/// Whether the SPDX expression `expr` is met by licences that `allowed` accepts.
fn licence_allowed(expr: &str, allowed: &dyn Fn(&str) -> bool) -> Result<bool> {
    let spaced = expr.replace('(', " ( ").replace(')', " ) ").replace('/', " OR ");
    let toks: Vec<&str> = spaced.split_whitespace().collect();
    let mut at = 0;
    let ok = or_expr(&toks, &mut at, allowed)?;
    ensure!(at == toks.len(), "unexpected {:?} in licence expression {expr:?}", toks.get(at));
    Ok(ok)
}

fn or_expr(toks: &[&str], at: &mut usize, allowed: &dyn Fn(&str) -> bool) -> Result<bool> {
    let mut ok = and_expr(toks, at, allowed)?;
    while toks.get(*at) == Some(&"OR") {
        *at += 1;
        ok |= and_expr(toks, at, allowed)?;
    }
    Ok(ok)
}

fn and_expr(toks: &[&str], at: &mut usize, allowed: &dyn Fn(&str) -> bool) -> Result<bool> {
    let mut ok = licence(toks, at, allowed)?;
    while toks.get(*at) == Some(&"AND") {
        *at += 1;
        ok &= licence(toks, at, allowed)?;
    }
    Ok(ok)
}

fn licence(toks: &[&str], at: &mut usize, allowed: &dyn Fn(&str) -> bool) -> Result<bool> {
    let Some(&first) = toks.get(*at) else { bail!("licence expression ends early") };
    *at += 1;
    if first == "(" {
        let ok = or_expr(toks, at, allowed)?;
        ensure!(toks.get(*at) == Some(&")"), "unclosed parenthesis");
        *at += 1;
        return Ok(ok);
    }
    ensure!(!matches!(first, ")" | "OR" | "AND" | "WITH"), "unexpected {first:?}");
    if toks.get(*at) == Some(&"WITH") {
        let exception = toks.get(*at + 1).context("WITH without an exception")?;
        *at += 2;
        return Ok(allowed(&format!("{first} WITH {exception}")));
    }
    Ok(allowed(first))
}

/// The semver-compatible part of `version`: `1.2.3` is `1`, `0.22.1` is `0.22`, `0.0.4` is `0.0.4`.
fn compatible(version: &str) -> String {
    let parts: Vec<&str> = version.split(['.', '-', '+']).take(3).collect();
    match parts.as_slice() {
        ["0", "0", patch, ..] => format!("0.0.{patch}"),
        ["0", minor, ..] => format!("0.{minor}"),
        [major, ..] => major.to_string(),
        [] => version.to_string(),
    }
}

/// What the `found` crates with several versions (name → their compatible versions) miss or no
/// longer need against `listed`; one line each.
fn compare_duplicates(found: &BTreeMap<String, BTreeSet<String>>, listed: &[(&str, &[&str], &str)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, versions) in found.iter().filter(|(_, v)| v.len() > 1) {
        let versions: Vec<&String> = versions.iter().collect();
        match listed.iter().find(|(n, _, _)| n == name) {
            Some((_, l, _)) if l.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>() == versions.iter().map(|s| s.to_string()).collect() => {}
            Some((_, l, _)) => problems.push(format!(
                "{name}: the product build holds versions {versions:?}, listed as {l:?}: a version was added (bring the \
                 dependency that wants it onto a version already built, or say why not) or one is gone (update the \
                 entry in DUPLICATES in {})",
                file!()
            )),
            None => problems.push(format!(
                "{name}: the product build holds versions {versions:?}: bring the dependencies that want them onto one \
                 version (`cargo tree -e normal,build -i {name}@VERSION` names them), or add it to DUPLICATES in {} \
                 with why the second one is accepted",
                file!()
            )),
        }
    }
    for (name, _, _) in listed {
        if found.get(*name).is_none_or(|v| v.len() < 2) {
            problems.push(format!(
                "{name}: the product build holds one version of it now: remove its entry from DUPLICATES in {}",
                file!()
            ));
        }
    }
    problems
}

#[test]
fn every_dependency_has_an_allowed_licence() -> Result<()> {
    let meta = cargo(&["metadata", "--format-version", "1", "--offline", "--locked", "--filter-platform", TARGET])?;
    let meta: Value = serde_json::from_str(&meta)?;
    let allowed = |l: &str| ALLOWED_LICENCES.iter().any(|(a, _)| *a == l);
    let mut refused = Vec::new();
    let packages = meta["packages"].as_array().context("packages")?;
    ensure!(packages.len() > 100, "only {} packages in cargo metadata", packages.len());
    for p in packages {
        let what = format!("{} {}", p["name"].as_str().unwrap_or("?"), p["version"].as_str().unwrap_or("?"));
        match p["license"].as_str() {
            Some(expr) => {
                if !licence_allowed(expr, &allowed).with_context(|| what.clone())? {
                    refused.push(format!("{what}: {expr}"));
                }
            }
            None => refused.push(format!("{what}: no SPDX licence expression (license-file {})", p["license_file"])),
        }
    }
    ensure!(
        refused.is_empty(),
        "dependencies whose licence is not allowed (see ALLOWED_LICENCES in {}: choose another crate, or record \
         there why the licence is acceptable, after reading it):\n{}",
        file!(),
        refused.join("\n")
    );
    Ok(())
}

#[test]
fn the_product_build_holds_one_version_of_each_crate_but_the_listed_ones() -> Result<()> {
    let mut args = vec!["tree", "--offline", "--locked", "-e", "normal,build", "--target", TARGET];
    for b in BINARIES {
        args.extend(["-p", b]);
    }
    args.extend(["--prefix", "none", "--format", "{p}"]);
    let tree = cargo(&args)?;
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in tree.lines().filter(|l| !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next()) else { bail!("cargo tree line {line:?}") };
        let version = version.strip_prefix('v').with_context(|| format!("cargo tree line {line:?}"))?;
        found.entry(name.to_string()).or_default().insert(compatible(version));
    }
    ensure!(found.len() > 100 && found.contains_key("tokio"), "cargo tree named {} packages", found.len());
    let problems = compare_duplicates(&found, DUPLICATES);
    ensure!(problems.is_empty(), "crates built in several versions:\n{}", problems.join("\n"));
    Ok(())
}

#[test]
fn licence_expressions_are_judged_by_or_and_and_with() -> Result<()> {
    let allowed = |l: &str| matches!(l, "MIT" | "Apache-2.0" | "Apache-2.0 WITH LLVM-exception");
    for (expr, want) in [
        ("MIT", true),
        ("GPL-3.0-only", false),
        ("MIT OR GPL-3.0-only", true),
        ("MIT AND GPL-3.0-only", false),
        ("MIT/Apache-2.0", true),
        ("Apache-2.0 / GPL-2.0", true),
        ("(MIT OR Apache-2.0) AND Unicode-3.0", false),
        ("(MIT OR GPL-2.0) AND (Apache-2.0 OR LGPL-2.1)", true),
        ("Apache-2.0 WITH LLVM-exception OR GPL-2.0", true),
        ("MIT WITH LLVM-exception", false),
        ("ISC AND (Apache-2.0 OR ISC)", false),
    ] {
        assert_eq!(licence_allowed(expr, &allowed)?, want, "{expr}");
    }
    assert!(licence_allowed("(MIT", &allowed).is_err());
    assert!(licence_allowed("MIT OR", &allowed).is_err());
    Ok(())
}

#[test]
fn listed_duplicates_only_shrink() {
    assert_eq!(compatible("1.2.3"), "1");
    assert_eq!(compatible("0.22.1"), "0.22");
    assert_eq!(compatible("0.0.4"), "0.0.4");
    assert_eq!(compatible("2.0.0-rc.1"), "2");
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<String>>();
    let found: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), set(&["1", "2"])),
        ("b".to_string(), set(&["0.1"])),
        ("c".to_string(), set(&["0.1", "0.2", "0.3"])),
        ("d".to_string(), set(&["1", "2"])),
    ]
    .into();
    let listed: &[(&str, &[&str], &str)] =
        &[("a", &["1", "2"], "why"), ("b", &["0.1", "0.2"], "why"), ("c", &["0.1", "0.2"], "why")];
    let problems = compare_duplicates(&found, listed);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(
        problems[0].starts_with("c: the product build holds versions [\"0.1\", \"0.2\", \"0.3\"], listed as"),
        "{}",
        problems[0]
    );
    assert!(problems[1].starts_with("d: the product build holds versions [\"1\", \"2\"]: bring"), "{}", problems[1]);
    assert!(problems[2].starts_with("b: the product build holds one version of it now: remove"), "{}", problems[2]);
}
