//! The documentation (README.md and the book under docs/) stays true: its relative links and
//! anchors resolve, the source files and the Rust paths it names exist (`paths`), every YAML
//! block says what it is and each seedgate config among them passes the binary's `--check` and
//! its JSON Schema, every binary prints the checked-in schema, and the metrics reference lists
//! exactly the metrics the binaries register.

use proxy_core::app::Options;
use proxy_core::obs::metrics::{MetricInfo, noting};
use proxy_core::prometheus::Registry;
use seedgate_config::BinaryConfig;
use seedgate_config::schema::ConfigFile;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use testbed::docs::{anchors, code_spans, examples, links, markdown_files, read, repo_root, rust_files};
use testbed::tunnel_kit::{AgentOpts, Fe, FeKind, TunnelPki, agent_yaml, server_yaml};
use testbed::{TempDir, bin_path, ensure_built};

const UPDATE: &str = "SEEDGATE_UPDATE_DOCS";
const BINARIES: [&str; 3] = ["sni-router", "proxy-server", "proxy-agent"];

#[test]
fn relative_links_and_anchors_resolve() {
    let root = repo_root();
    let mut broken = Vec::new();
    for file in markdown_files() {
        let dir = file.parent().unwrap_or(Path::new(""));
        for (line, target) in links(&read(&file)) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if path.is_empty() { file.clone() } else { normalize(&dir.join(path)) };
            let at = format!("{}:{line}: {target}", file.display());
            if !root.join(&resolved).exists() {
                broken.push(format!("{at}: no such file {}", resolved.display()));
            } else if !anchor.is_empty()
                && resolved.extension().is_some_and(|x| x == "md")
                && !anchors(&read(&resolved)).iter().any(|a| a == anchor)
            {
                broken.push(format!("{at}: {} has no heading with the anchor #{anchor}", resolved.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n  {}", broken.join("\n  "));
}

/// Every source file the docs name in a code span (`frontend/pipeline.rs`, `machine/{state,live}.rs`)
/// exists: some `.rs` file of the repository ends with that path, so a rename or a fold that
/// leaves a walk or a map of the code behind fails here.
#[test]
fn the_source_files_the_docs_name_exist() {
    let files: Vec<String> = rust_files().iter().map(|f| format!("/{}", f.display())).collect();
    let mut missing = Vec::new();
    let mut named = 0;
    for (doc, n, span) in code_spans() {
        for path in source_paths(&span) {
            named += 1;
            if NOT_SOURCES.iter().any(|(d, p, _)| doc.ends_with(d) && *p == path) {
                continue;
            }
            let suffix = format!("/{}", path.trim_start_matches("./"));
            if !files.iter().any(|f| f.ends_with(&suffix)) {
                missing.push(format!("{}:{n}: {path}", doc.display()));
            }
        }
    }
    assert!(named > 100, "only {named} source files named: is the reading of code spans broken?");
    assert!(missing.is_empty(), "source files the docs name that do not exist:\n  {}", missing.join("\n  "));
}

/// Files the docs name that are not meant to exist: (doc, path, why).
const NOT_SOURCES: &[(&str, &str, &str)] = &[
    ("docs/development.md", "foo/tests.rs", "an example of where a module's tests go"),
    ("docs/design/walks.md", "tunnel/h2.rs", "the h2 transport before it was split by concern"),
    ("docs/design/walks.md", "agents.rs", "the agents' admission before it was split in steps"),
    ("docs/design/walks.md", "attempt.rs", "a dial's attempt before it moved into the dial path"),
];

/// The source paths a code span names: itself if it is a path ending in `.rs`, with one `{a,b}`
/// group expanded; none for anything else (code, commands, prose).
fn source_paths(span: &str) -> Vec<String> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_-./{},".contains(c);
    if !span.ends_with(".rs") || !span.chars().all(path_char) || span.starts_with('{') {
        return Vec::new();
    }
    match (span.find('{'), span.find('}')) {
        (Some(a), Some(b)) if a < b => {
            span[a + 1..b].split(',').map(|part| format!("{}{part}{}", &span[..a], &span[b + 1..])).collect()
        }
        (None, None) if !span.contains(',') => vec![span.to_owned()],
        _ => Vec::new(),
    }
}

#[test]
fn a_code_span_names_source_files_only_when_it_is_a_path() {
    assert_eq!(source_paths("frontend/pipeline.rs"), ["frontend/pipeline.rs"]);
    assert_eq!(source_paths("machine/{state,live}.rs"), ["machine/state.rs", "machine/live.rs"]);
    assert!(source_paths("cargo test -p proxy-wire").is_empty());
    assert!(source_paths("fn main() { x.rs }").is_empty());
    assert!(source_paths("Session::standing").is_empty());
}

/// `a/b/../c` -> `a/c` (the path need not exist).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[test]
fn the_readme_is_short_and_pictures_the_paths_as_the_book_does() {
    let readme = read("README.md");
    let n = readme.lines().count();
    assert!(n <= 160, "README.md has {n} lines: keep it at most 160 and move the rest into a page of docs/");
    let picture = |text: &str| -> Vec<String> {
        let from = text.lines().position(|l| l.starts_with("```") && l.trim() == "```").expect("a picture");
        text.lines().skip(from).take_while(|l| !l.starts_with("Nothing here")).map(str::to_owned).collect()
    };
    let book = read("docs/README.md");
    let book_paths = book.split("## The traffic paths").nth(1).expect("docs/README.md pictures the traffic paths");
    let readme_paths = readme.split("## Traffic paths").nth(1).expect("README.md pictures the traffic paths");
    assert_eq!(picture(readme_paths), picture(book_paths), "the README and the book picture the paths differently");
}

const KINDS: [&str; 6] = ["sni-router", "proxy-server", "proxy-agent", "route-file", "cluster-file", "other"];

#[test]
fn every_yaml_block_says_what_it_is() {
    let (all, unmarked) = examples();
    let unmarked: Vec<String> = unmarked.iter().map(|(f, l)| format!("{}:{l}", f.display())).collect();
    assert!(
        unmarked.is_empty(),
        "these ```yaml blocks have no <!-- example: NAME (KIND, ...) --> line above them (KIND: one of {KINDS:?} per \
         YAML document):\n  {}",
        unmarked.join("\n  ")
    );
    let mut names: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "two blocks share a name");
    for e in &all {
        for (kind, _) in e.documents() {
            assert!(KINDS.contains(&kind.as_str()), "{}:{}: unknown kind {kind:?}", e.file.display(), e.line);
        }
    }
    assert!(all.len() >= 18, "only {} marked examples", all.len());
}

fn file_kind(kind: &str) -> Option<ConfigFile> {
    Some(match kind {
        "sni-router" => ConfigFile::Router,
        "proxy-server" => ConfigFile::Server,
        "proxy-agent" => ConfigFile::Agent,
        "route-file" => ConfigFile::RouteFile,
        "cluster-file" => ConfigFile::ClusterFile,
        _ => return None,
    })
}

/// The binaries of this test's own profile, built and fresh.
fn binaries() -> Vec<PathBuf> {
    let p = bin_path("sni-router").expect("the binaries' directory");
    let profile =
        if p.parent().and_then(Path::file_name).is_some_and(|n| n == "release") { "release" } else { "debug" };
    ensure_built(profile, &BINARIES).expect("the binaries build")
}

/// `BINARY --config FILE --check --skip-file-checks` (the files a documentation example names are
/// not there): its exit code and what it printed.
fn check(bin: &str, file: &Path) -> (i32, String) {
    let out = Command::new(bin_path(bin).unwrap())
        .args(["--check", "--skip-file-checks", "--config"])
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("running {bin}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// YAML read as editors' YAML language server reads it (YAML 1.2: `off` is a string, not `false`).
fn yaml_1_2() -> serde_saphyr::Options {
    serde_saphyr::options! { strict_booleans: true }
}

#[test]
fn every_seedgate_example_passes_check_and_its_schema() {
    binaries();
    let dir = TempDir::new("docs-examples").unwrap();
    let validators: BTreeMap<&str, jsonschema::Validator> = ConfigFile::ALL
        .iter()
        .map(|f| (f.name(), jsonschema::draft7::new(&f.schema()).expect("a draft-07 schema")))
        .collect();
    let (all, _) = examples();
    let mut checked = 0;
    for e in &all {
        for (i, (kind, yaml)) in e.documents().into_iter().enumerate() {
            let at = format!("{}:{} (example {}, document {})", e.file.display(), e.line, e.name, i + 1);
            let value: Value = serde_saphyr::from_str_with_options(&yaml, yaml_1_2())
                .unwrap_or_else(|err| panic!("{at}: not YAML: {err}"));
            let Some(file) = file_kind(&kind) else { continue };
            let errors: Vec<String> = validators[file.name()].iter_errors(&value).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{at}: the {} schema refuses it:\n  {}", file.name(), errors.join("\n  "));
            if matches!(file, ConfigFile::RouteFile | ConfigFile::ClusterFile) {
                let parsed = match file {
                    ConfigFile::RouteFile => seedgate_config::router::parse_route_file(&yaml, &at).map(drop),
                    _ => seedgate_config::server::parse_cluster_file(&yaml, &at).map(drop),
                };
                parsed.unwrap_or_else(|err| panic!("{at}: {err}"));
                continue;
            }
            let cfg = dir.write(&format!("{}-{i}.yaml", e.name), &yaml).unwrap();
            let (code, said) = check(file.binary(), &cfg);
            assert_eq!(code, 0, "{at}: {} --check refuses it:\n{said}", file.binary());
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} configs checked");
}

#[test]
fn every_binary_prints_the_checked_in_schema() {
    binaries();
    for f in [ConfigFile::Router, ConfigFile::Server, ConfigFile::Agent] {
        let out = Command::new(bin_path(f.binary()).unwrap()).arg("--print-schema").output().unwrap();
        assert!(out.status.success(), "{} --print-schema: {}", f.binary(), String::from_utf8_lossy(&out.stderr));
        let printed = String::from_utf8(out.stdout).unwrap();
        let file = format!("docs/reference/schema/{}.json", f.name());
        assert_eq!(printed, read(&file), "{} --print-schema differs from {file}", f.binary());
        let with_config = Command::new(bin_path(f.binary()).unwrap())
            .args(["--print-schema", "--config", "x.yaml"])
            .output()
            .unwrap();
        assert_eq!(with_config.status.code(), Some(2), "--print-schema takes no other flag");
    }
}

/// Every metric `bind` registers, and the names in the registry's first scrape (which must all be
/// among them). Run on a current-thread runtime so that every registration happens on this thread.
fn registered<B, E: std::fmt::Display>(
    reg: &Registry,
    bind: impl std::future::Future<Output = Result<B, E>>,
) -> Vec<MetricInfo> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (bound, noted) = noting(|| rt.block_on(bind));
    let bound = bound.unwrap_or_else(|e| panic!("bind: {e}"));
    let scraped: Vec<String> = reg.gather().iter().map(|f| f.name().to_owned()).collect();
    for name in scraped {
        assert!(
            noted.iter().any(|m| m.name == name),
            "{name} is registered without proxy_core::obs::metrics::register, so the reference cannot list it"
        );
    }
    let _in_runtime = rt.enter();
    drop(bound);
    noted
}

fn opts(reg: &Registry) -> Options {
    Options { registry: Some(reg.clone()), ..Options::default() }
}

/// A config of each binary with every optional part configured (route files, cluster files, a UDP
/// listener, the tunnel and the apiserver proxy), on port 0.
fn full_configs(dir: &TempDir) -> [String; 3] {
    let files = dir.join("files");
    std::fs::create_dir_all(&files).unwrap();
    let files = files.display();
    let router = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\nroutes_dir: {files}\nlisteners:\n  - {{ name: tcp, listen: 127.0.0.1:0 }}\n  - {{ name: quic, listen: 127.0.0.1:0, protocol: udp }}\n"
    );
    let pki = TunnelPki::new(dir.path()).unwrap();
    let fe = [Fe::new("egress", "shoot-a", FeKind::Plain)];
    let server = server_yaml(&pki, "127.0.0.1:0", &fe, &format!("clusters_dir: {files}\n"));
    let agent = agent_yaml(&pki, &AgentOpts::new("shoot-a", "127.0.0.1:1", &["10.0.0.0/8"])).unwrap()
        + "apiserver_proxy:\n  listen: [127.0.0.1:0]\n  gateway: 127.0.0.1:1\n  mode: proxy-protocol-v2\n";
    [router, server, agent]
}

/// The metrics of each binary, with every optional part configured.
fn metrics_by_binary(dir: &TempDir) -> Vec<(&'static str, Vec<MetricInfo>)> {
    let [router, server, agent] = full_configs(dir);
    let (r, s, a) = (Registry::new(), Registry::new(), Registry::new());
    vec![
        ("sni-router", registered(&r, sni_router::bind(load(&router), opts(&r)))),
        ("proxy-server", registered(&s, proxy_server::bind(load(&server), opts(&s)))),
        ("proxy-agent", registered(&a, proxy_agent::bind(load(&agent), opts(&a)))),
    ]
}

fn load<T: BinaryConfig>(yaml: &str) -> T {
    T::parse(yaml, "docs-metrics.yaml").unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

/// The generated table: one row per metric (and per set of labels a binary gives it).
fn metrics_table(by_binary: &[(&str, Vec<MetricInfo>)]) -> String {
    let mut rows: BTreeMap<MetricInfo, Vec<&str>> = BTreeMap::new();
    for (binary, metrics) in by_binary {
        for m in metrics {
            rows.entry(m.clone()).or_default().push(binary);
        }
    }
    let mut out = String::from("| metric | type | labels | binaries | help |\n|---|---|---|---|---|\n");
    for (m, binaries) in rows {
        let labels: Vec<String> = m.labels.iter().map(|l| format!("`{l}`")).collect();
        let labels = if labels.is_empty() { "—".to_owned() } else { labels.join(", ") };
        let help = m.help.replace('|', "\\|");
        out.push_str(&format!("| `{}` | {} | {labels} | {} | {help} |\n", m.name, m.kind, binaries.join(", ")));
    }
    out
}

const BEGIN: &str = "<!-- BEGIN generated: metrics -->\n";
const END: &str = "<!-- END generated: metrics -->";

#[test]
fn the_metrics_reference_lists_exactly_the_registered_metrics() {
    let dir = TempDir::new("docs-metrics").unwrap();
    let by_binary = metrics_by_binary(&dir);
    let page_path = "docs/reference/metrics.md";
    let page = read(page_path);
    let (head, rest) = page.split_once(BEGIN).expect("the page marks where the generated table begins");
    let (table, tail) = rest.split_once(END).expect("the page marks where the generated table ends");
    let want = metrics_table(&by_binary);
    if table == want {
        return;
    }
    if std::env::var_os(UPDATE).is_some() {
        std::fs::write(repo_root().join(page_path), format!("{head}{BEGIN}{want}{END}{tail}")).unwrap();
        return;
    }
    let documented: BTreeSet<&str> = table.lines().filter_map(|l| l.strip_prefix("| `")?.split('`').next()).collect();
    let registered: BTreeSet<&str> = by_binary.iter().flat_map(|(_, ms)| ms.iter().map(|m| m.name.as_str())).collect();
    let missing: Vec<&&str> = registered.difference(&documented).collect();
    let unknown: Vec<&&str> = documented.difference(&registered).collect();
    panic!(
        "{page_path} is not what the binaries register (registered but not listed: {missing:?}; listed but not \
         registered: {unknown:?}; or a type, label or help text changed). Regenerate it with\n  {UPDATE}=1 cargo test \
         -p seedgate-tests --test it docs::the_metrics_reference\nand commit the result"
    );
}

/// The keys the generated reference of `file` marks `restart`.
fn marked_restart(file: ConfigFile) -> Vec<String> {
    let page = seedgate_config::reference::page(file);
    let cells =
        |l: &str| l.split(" | ").map(|c| c.trim_matches(|x| x == '|' || x == ' ' || x == '`').to_owned()).collect();
    let rows: Vec<Vec<String>> = page.lines().filter(|l| l.starts_with("| `")).map(cells).collect();
    rows.into_iter().filter(|r| r.get(3).is_some_and(|c| c == "restart")).map(|r| r[0].clone()).collect()
}

fn keys(restart_only: Vec<(&'static str, Value)>) -> Vec<String> {
    restart_only.into_iter().map(|(k, _)| k.to_owned()).collect()
}

/// The reference's "restart" keys are the ones a reload refuses to change (`Service::restart_only`),
/// and the sections holding them; nothing else.
#[test]
fn the_restart_column_is_what_a_reload_refuses() {
    use proxy_core::app::Service;
    let dir = TempDir::new("docs-restart").unwrap();
    let [router, server, agent] = full_configs(&dir);
    for (file, refused) in [
        (ConfigFile::Router, keys(sni_router::Router::restart_only(&load(&router)))),
        (ConfigFile::Server, keys(proxy_server::Server::restart_only(&load(&server)))),
        (ConfigFile::Agent, keys(proxy_agent::Agent::restart_only(&load(&agent)))),
    ] {
        let marked = marked_restart(file);
        for k in &refused {
            assert!(
                marked.contains(k),
                "{}: a reload refuses {k}, which the reference does not mark restart",
                file.name()
            );
        }
        for m in &marked {
            assert!(
                refused.iter().any(|k| k == m || k.starts_with(&format!("{m}."))),
                "{}: the reference marks {m} restart, but a reload does not refuse it ({refused:?})",
                file.name()
            );
        }
    }
}

mod fresh;
mod paths;
mod quoted;
