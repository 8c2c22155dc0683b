//! The generated config reference: the JSON Schemas and Markdown pages under `docs/reference/`
//! are what the code produces, every key is documented, and the schemas agree with the parser
//! (they accept and refuse the same values as far as JSON Schema can say it).

use seedgate_config::reference;
use seedgate_config::schema::{
    CIDR_PATTERN, CIDR_PORT_PATTERN, ConfigFile, DURATION_PATTERN, FILE_MODE_PATTERN, HOST_PORT_PATTERN, RELOAD,
    SIZE_PATTERN,
};
use seedgate_config::{CidrPort, Dur, FileMode, HostPort, IpCidr};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const UPDATE: &str = "SEEDGATE_UPDATE_DOCS";

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference")
}

/// Every generated file and what the code produces for it.
fn generated() -> Vec<(PathBuf, String)> {
    let mut out: Vec<(PathBuf, String)> =
        ConfigFile::ALL.iter().map(|f| (docs().join(format!("schema/{}.json", f.name())), f.schema_text())).collect();
    for f in [ConfigFile::Router, ConfigFile::Server, ConfigFile::Agent] {
        out.push((docs().join(format!("config-{}.md", f.name())), reference::page(f)));
    }
    out
}

#[test]
fn the_checked_in_reference_is_what_the_code_produces() {
    let update = std::env::var_os(UPDATE).is_some();
    let mut stale = Vec::new();
    for (path, text) in generated() {
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        } else {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "these files differ from what the config types produce:\n  {}\nregenerate them with\n  \
         {UPDATE}=1 cargo test -p seedgate-config --test reference\nand commit the result",
        stale.join("\n  ")
    );
}

/// Table rows of a page: `(key, type, default, reload, description)`.
fn rows(page: &str) -> Vec<Vec<String>> {
    page.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let l = l.replace("\\|", "\u{0}");
            l.trim_matches('|').split('|').map(|c| c.trim().replace('\u{0}', "|")).collect()
        })
        .collect()
}

#[test]
fn every_key_says_what_it_is_and_what_a_reload_does() {
    let reloads: Vec<&str> = RELOAD.iter().map(|(r, _)| *r).collect();
    for f in [ConfigFile::Router, ConfigFile::Server, ConfigFile::Agent] {
        let page = reference::page(f);
        let rows = rows(&page);
        assert!(rows.len() > 20, "{}: {} keys", f.name(), rows.len());
        for r in rows {
            assert_eq!(r.len(), 5, "{}: {r:?}", f.name());
            assert!(reloads.contains(&r[3].as_str()), "{}: {} has no reload behaviour (x-reload)", f.name(), r[0]);
            assert!(r[4].len() > 10, "{}: {} has no doc comment", f.name(), r[0]);
        }
    }
}

/// Every object schema with keys, and where it is.
fn objects(v: &Value, at: &str, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) => {
            // A mapping, not a rule added beside a `$ref` (`agents.tls` requiring `client_ca`).
            if m.contains_key("properties") && m.contains_key("type") {
                out.push((at.to_owned(), v.clone()));
            }
            for (k, v) in m {
                objects(v, &format!("{at}/{k}"), out);
            }
        }
        Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| objects(v, &format!("{at}/{i}"), out)),
        _ => {}
    }
}

#[test]
fn every_mapping_refuses_unknown_keys() {
    for f in ConfigFile::ALL {
        let mut all = Vec::new();
        objects(&f.schema(), "#", &mut all);
        assert!(!all.is_empty());
        for (at, o) in all {
            assert_eq!(o["additionalProperties"], json!(false), "{}: {at}", f.name());
        }
    }
}

fn validator(f: ConfigFile) -> jsonschema::Validator {
    jsonschema::draft7::new(&f.schema()).unwrap_or_else(|e| panic!("{}: not a valid draft-07 schema: {e}", f.name()))
}

/// A config of `f` with only what is required (as JSON, which is YAML too).
fn base(f: ConfigFile) -> Value {
    let tls = json!({ "cert": "c.crt", "key": "c.key", "client_ca": "ca.crt" });
    match f {
        ConfigFile::Router => json!({ "listeners": [{ "name": "a", "listen": "127.0.0.1:1", "routes": [
            { "name": "r", "sni": ["a.example"], "upstreams": ["127.0.0.1:2"] }] }] }),
        ConfigFile::Server => json!({ "agents": { "listen": "127.0.0.1:1", "tls": tls },
            "frontends": [{ "name": "f", "listen": "127.0.0.1:2", "cluster": "shoot-a" }] }),
        ConfigFile::Agent => json!({
            "apiserver_proxy": { "listen": ["127.0.0.1:1"], "gateway": "127.0.0.1:2", "mode": "proxy-protocol-v2" },
            "tunnel": { "servers": ["127.0.0.1:3"], "tls": { "cert": "c", "key": "k", "ca": "ca" },
                        "allow": ["10.0.0.0/8"] } }),
        ConfigFile::RouteFile => {
            json!({ "routes": [{ "listener": "a", "name": "r", "sni": ["a.example"], "upstreams": ["x:1"] }] })
        }
        ConfigFile::ClusterFile => json!({ "clusters": { "shoot-a": { "state": "active" } } }),
    }
}

/// What the parser says of `v` as `f`.
fn parses(f: ConfigFile, v: &Value) -> Result<(), String> {
    let text = v.to_string();
    let r = match f {
        ConfigFile::Router => seedgate_config::router::parse(&text, "t.yaml").map(drop),
        ConfigFile::Server => seedgate_config::server::parse(&text, "t.yaml").map(drop),
        ConfigFile::Agent => seedgate_config::agent::parse(&text, "t.yaml").map(drop),
        ConfigFile::RouteFile => seedgate_config::router::parse_route_file(&text, "t.yaml").map(drop),
        ConfigFile::ClusterFile => seedgate_config::server::parse_cluster_file(&text, "t.yaml").map(drop),
    };
    r.map_err(|e| e.to_string())
}

fn agree(f: ConfigFile, v: &Value, accepted: bool, what: &str) {
    let schema = validator(f).iter_errors(v).map(|e| e.to_string()).collect::<Vec<_>>();
    let parser = parses(f, v);
    assert_eq!(schema.is_empty(), accepted, "{}: {what}: the schema says {schema:?}\n{v}", f.name());
    assert_eq!(parser.is_ok(), accepted, "{}: {what}: the parser says {parser:?}\n{v}", f.name());
}

#[test]
fn minimal_configs_and_null_sections_are_valid_for_both() {
    for f in ConfigFile::ALL {
        agree(f, &base(f), true, "the minimal config");
    }
    let mut v = base(ConfigFile::Server);
    for k in ["admin", "timeouts", "limits", "clusters", "clusters_dir"] {
        v[k] = Value::Null;
    }
    agree(ConfigFile::Server, &v, true, "null sections");
    let mut v = base(ConfigFile::Router);
    v["listeners"][0]["routez"] = json!([]);
    agree(ConfigFile::Router, &v, false, "an unknown key");
    let mut v = base(ConfigFile::Agent);
    v["tunnel"]["transport"] = json!("sctp");
    agree(ConfigFile::Agent, &v, false, "an unknown variant");
    v["tunnel"]["transport"] = json!("auto");
    agree(ConfigFile::Agent, &v, true, "a known variant");
    let mut v = base(ConfigFile::Router);
    v["listeners"] = json!([]);
    agree(ConfigFile::Router, &v, false, "no listener");
    for (f, at, x) in [
        (ConfigFile::Agent, "/tunnel/allow", Value::Null),
        (ConfigFile::Agent, "/tunnel/allow", json!([])),
        (ConfigFile::Server, "/agents/tls/client_ca", Value::Null),
        (ConfigFile::Agent, "/apiserver_proxy/destination", json!(" padded")),
        (ConfigFile::Agent, "/apiserver_proxy/destination_header", json!("X Bad")),
        (ConfigFile::Server, "/agents/server_id", json!("a b")),
        (ConfigFile::Server, "/frontends/0/cluster", json!("shoot/a")),
        (ConfigFile::Server, "/frontends/0/unix_mode", json!("0999")),
    ] {
        let mut v = base(f);
        set(&mut v, at, x.clone());
        agree(f, &v, false, &format!("{at}: {x}"));
    }
    let mut v = base(ConfigFile::Agent);
    v["tunnel"].as_object_mut().unwrap().remove("allow");
    agree(ConfigFile::Agent, &v, false, "a tunnel without allow");
    let mut v = base(ConfigFile::Server);
    v["agents"]["tls"].as_object_mut().unwrap().remove("client_ca");
    agree(ConfigFile::Server, &v, false, "agents without a client CA");
    v["agents"]["auth"] = json!("mtls_or_token");
    agree(ConfigFile::Server, &v, false, "agents that may use certificates, without a client CA");
    v["agents"]["auth"] = json!("token");
    agree(ConfigFile::Server, &v, true, "token agents without a client CA");
    let mut v = base(ConfigFile::ClusterFile);
    v["clusters"]["shoot a"] = json!({});
    agree(ConfigFile::ClusterFile, &v, false, "a cluster name with a space");
}

/// Keys another key must follow when one is set to a bound (a rule between the two).
const ALONG: &[(&str, &str)] = &[("stream_window", "connection_window"), ("connection_window", "stream_window")];

/// Every integer key with bounds in the schema, reachable from `base` (first elements of lists
/// only): `(JSON pointer, minimum, maximum)`.
fn bounded(root: &Value, schema: &Value, v: &Value, at: &str, out: &mut Vec<(String, Option<u64>, Option<u64>)>) {
    let deref = |s: &Value| -> Value {
        let s = s.get("allOf").and_then(|a| a.get(0)).unwrap_or(s);
        let s = s.get("anyOf").and_then(|a| a.get(0)).unwrap_or(s);
        match s.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/definitions/")) {
            Some(d) => root["definitions"][d].clone(),
            None => s.clone(),
        }
    };
    for (k, p) in schema["properties"].as_object().into_iter().flatten() {
        let here = format!("{at}/{k}");
        let (lo, hi) = (p.get("minimum").and_then(Value::as_u64), p.get("maximum").and_then(Value::as_u64));
        if lo.is_some_and(|l| l > 0) || hi.is_some() {
            out.push((here.clone(), lo, hi));
        }
        let target = deref(p);
        if target.get("properties").is_some() {
            bounded(root, &target, v.get(k).unwrap_or(&json!({})), &here, out);
        } else if let Some(first) = v.get(k).and_then(|a| a.get(0)).filter(|f| f.is_object()) {
            bounded(root, &deref(&p["items"]), first, &format!("{here}/0"), out);
        }
    }
}

fn set(v: &mut Value, pointer: &str, x: Value) {
    let mut cur = v;
    for part in pointer.trim_start_matches('/').split('/') {
        cur = match part.parse::<usize>() {
            Ok(i) => &mut cur[i],
            Err(_) => {
                if cur.is_null() {
                    *cur = json!({});
                }
                &mut cur[part]
            }
        };
    }
    *cur = x;
}

#[test]
fn integer_bounds_are_the_validators() {
    for f in [ConfigFile::Router, ConfigFile::Server, ConfigFile::Agent] {
        let (schema, v) = (f.schema(), base(f));
        let mut keys = Vec::new();
        bounded(&schema, &schema, &v, "", &mut keys);
        assert!(keys.len() >= 3, "{}: {keys:?}", f.name());
        for (at, lo, hi) in keys {
            let with = |n: i64| {
                let mut c = v.clone();
                set(&mut c, &at, json!(n));
                for (key, other) in ALONG {
                    // The whole key: `max_stream_window` is not `stream_window`.
                    if let Some(stem) = at.strip_suffix(key).filter(|s| s.ends_with('/')) {
                        set(&mut c, &format!("{stem}{other}"), json!(n.clamp(65535, (1 << 31) - 1)));
                    }
                }
                c
            };
            if let Some(lo) = lo {
                agree(f, &with(lo as i64), true, &format!("{at} = its minimum {lo}"));
                agree(f, &with(lo as i64 - 1), false, &format!("{at} below its minimum"));
            }
            if let Some(hi) = hi {
                agree(f, &with(hi as i64), true, &format!("{at} = its maximum {hi}"));
                agree(f, &with(hi as i64 + 1), false, &format!("{at} above its maximum"));
            }
        }
    }
}

/// `pattern` as the schema's validators read it: the whole string must match.
fn matches(pattern: &str, s: &str) -> bool {
    jsonschema::is_valid(&json!({ "type": "string", "pattern": pattern }), &json!(s))
}

fn same_verdict<T: std::str::FromStr>(pattern: &str, cases: &[&str], what: &str) {
    for s in cases {
        let parser = s.parse::<T>().is_ok();
        assert_eq!(matches(pattern, s), parser, "{what} {s:?}: the parser says {parser}");
    }
}

#[test]
fn value_type_patterns_are_the_parsers() {
    same_verdict::<Dur>(
        DURATION_PATTERN,
        &[
            "5s",
            "250ms",
            "1h",
            "1m30s",
            " 2 min ",
            "1.5h",
            "3d",
            "1y",
            "5",
            "",
            "s",
            "five seconds",
            "5 parsecs",
            "-1s",
        ],
        "duration",
    );
    same_verdict::<HostPort>(
        HOST_PORT_PATTERN,
        &[
            "10.0.1.5:443",
            "api.example.com:8443",
            "[::1]:8132",
            "[fd00::1]:0",
            "host:65535",
            "host:65536",
            "host",
            ":443",
            "host:",
            "::1:443",
            "[::1]443",
            "a b:1",
        ],
        "address",
    );
    same_verdict::<IpCidr>(
        CIDR_PATTERN,
        &[
            "10.0.0.0/8",
            "10.1.2.3",
            "fd00::/8",
            "::1",
            "10.0.0.0/33",
            "10.0.0",
            "256.0.0.0/8",
            "x",
            "010.0.0.0/08",
            "010.0.0.1",
            "fd00::/0128",
        ],
        "CIDR",
    );
    same_verdict::<CidrPort>(
        CIDR_PORT_PATTERN,
        &[
            "10.0.0.0/8",
            "10.0.0.0/8:443",
            "10.1.2.3:443",
            "[fd00::/8]:443",
            "fd00::/8",
            "10.0.0.0/8:99999",
            "[fd00::/8",
        ],
        "CIDR[:port]",
    );
    same_verdict::<FileMode>(
        FILE_MODE_PATTERN,
        &["0660", "660", "0o600", "0777", "0", "", "0888", "01777", "rw-rw----", "0x1ff"],
        "file mode",
    );
}

/// A size key takes a count or a string with a unit in the schema as in the parser, and the
/// schema's pattern refuses what the parser refuses.
#[test]
fn sizes_with_units_are_taken_by_both() {
    for s in ["16777216", "16Mi", "16MiB", "64M", "128k", "128K", "1.5Gi", " 8Ki ", "2T", "0"] {
        assert!(matches(SIZE_PATTERN, s) && seedgate_config::parse_size(s).is_ok(), "{s:?}");
    }
    for s in ["16MB", "16 Mi", "16mi", "Mi", "1.Mi", "-1", "1e6", ""] {
        assert!(!matches(SIZE_PATTERN, s) && seedgate_config::parse_size(s).is_err(), "{s:?}");
    }
    for (f, at, x) in [
        (ConfigFile::Router, "/limits/udp_socket_buffer", "8Mi"),
        (ConfigFile::Router, "/limits/client_hello_max", "32Ki"),
        (ConfigFile::Server, "/limits/request_head_max", "16Ki"),
        (ConfigFile::Server, "/agents/max_stream_window", "32Mi"),
        (ConfigFile::Agent, "/tunnel/tcp_notsent_lowat", "256Ki"),
        (ConfigFile::Agent, "/tunnel/stream_window", "1M"),
    ] {
        let mut v = base(f);
        set(&mut v, at, json!(x));
        agree(f, &v, true, &format!("{at}: {x}"));
        set(&mut v, at, json!(format!("{x}B")));
        agree(f, &v, x.ends_with("i"), &format!("{at}: {x}B"));
    }
}
