//! The config reference pages (Markdown) written from the config files' JSON Schemas.
//!
//! One page per binary: a table per section (the top level, then every nested mapping in the
//! order they are met), each key with its type, default, what a reload does with it and its doc
//! comment; then the value types written as strings. The page names every key the schema has, so
//! it cannot drift from the parser.

use crate::schema::{ConfigFile, RELOAD, RELOAD_KEYWORD};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The reference page of `file`'s binary (`Router`, `Server` or `Agent`); the router's and the
/// server's pages also describe their directory files (routes, cluster states).
pub fn page(file: ConfigFile) -> String {
    let mut w = Writer { out: String::new(), sections: BTreeMap::new(), reuse: false, queue: Vec::new() };
    let binary = file.binary();
    let schema = file.schema();
    w.header(file);
    w.queue.push(Section {
        path: String::new(),
        heading: "Top level".into(),
        def: None,
        reload: None,
        required: Vec::new(),
    });
    w.drain(&schema);
    if let Some(extra) = companion(file) {
        w.reuse = true;
        let heading = extra.title().replace(binary, "").trim().to_owned();
        let heading = format!("{}{}", heading[..1].to_uppercase(), &heading[1..]);
        w.queue.push(Section { path: String::new(), heading, def: None, reload: None, required: Vec::new() });
        w.drain(&extra.schema());
        let _ = writeln!(w.out, "Its JSON Schema: [`schema/{0}.json`](schema/{0}.json).\n", extra.name());
    }
    w.value_types(&schema);
    w.out
}

/// The file of the directory the binary watches, if any.
pub fn companion(file: ConfigFile) -> Option<ConfigFile> {
    match file {
        ConfigFile::Router => Some(ConfigFile::RouteFile),
        ConfigFile::Server => Some(ConfigFile::ClusterFile),
        _ => None,
    }
}

/// The anchor GitHub (and mdBook) give a heading: lower case, spaces to `-`, everything but
/// letters, digits, `-` and `_` dropped.
pub fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// A mapping to describe: its key path and the schema definition it comes from.
struct Section {
    path: String,
    heading: String,
    /// The definition's name, for a mapping defined in `definitions`.
    def: Option<String>,
    /// What a reload does with the key holding the mapping (inherited by keys without their own).
    reload: Option<String>,
    /// Keys the holding key requires beyond the mapping's own (its schema's `required` for it).
    required: Vec<String>,
}

struct Writer {
    out: String,
    /// The heading of the first section written for each definition.
    sections: BTreeMap<String, String>,
    /// Whether a definition with a section links to it (in the directory file's part) rather
    /// than getting a section of its own (in the main file, one per key path: the same mapping
    /// may reload differently at two places).
    reuse: bool,
    queue: Vec<Section>,
}

/// What one key's schema says, once `null` alternatives and wrappers are taken off.
struct Key<'a> {
    schema: &'a Value,
    nullable: bool,
}

impl Writer {
    fn header(&mut self, file: ConfigFile) {
        let (binary, name) = (file.binary(), file.name());
        let _ = write!(
            self.out,
            "# {binary} config reference\n\n\
             <!-- Generated from the config types (config/src/) by \
             `SEEDGATE_UPDATE_DOCS=1 cargo test -p seedgate-config --test reference`; do not edit. -->\n\n\
             Every key of the {title}, from the types that parse it, as is its JSON Schema \
             [`schema/{name}.json`](schema/{name}.json) (which `{binary} --print-schema` prints). How to check a \
             file, and how to have an editor validate it as you type: [Config files](config.md).\n\n\
             **Reload** says what a config reload (SIGHUP, or a change of the file) does with a change of the key:\n\n",
            title = file.title(),
        );
        for (value, meaning) in RELOAD {
            let _ = writeln!(self.out, "- **{value}**: {meaning}.");
        }
        self.out.push('\n');
    }

    /// Write every queued section, and those they lead to, in the order met.
    fn drain(&mut self, root: &Value) {
        while !self.queue.is_empty() {
            let s = self.queue.remove(0);
            let schema = match &s.def {
                Some(d) => &root["definitions"][d.as_str()],
                None => root,
            };
            self.section(root, &s, schema);
        }
    }

    fn section(&mut self, root: &Value, s: &Section, schema: &Value) {
        let _ = writeln!(self.out, "## {}\n", s.heading);
        if let Some(d) = schema.get("description").and_then(Value::as_str)
            && s.def.is_some()
        {
            let _ = writeln!(self.out, "{}\n", one_line(d));
        }
        self.out.push_str("| key | type | default | reload | description |\n|---|---|---|---|---|\n");
        let mut required: Vec<&str> = strings(&schema["required"]);
        required.extend(s.required.iter().map(String::as_str));
        let own_reload = schema.get(RELOAD_KEYWORD).and_then(Value::as_str).map(str::to_owned);
        let mut children = Vec::new();
        for (name, prop) in schema["properties"].as_object().into_iter().flatten() {
            let path = join(&s.path, name);
            let reload = prop
                .get(RELOAD_KEYWORD)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or_else(|| own_reload.clone())
                .or_else(|| s.reload.clone());
            let key = unwrap(prop);
            let before = children.len();
            let mut ty = self.type_of(root, &key, &path, reload.as_deref(), &mut children);
            if ty.starts_with('[') {
                // A value type's own bounds at this key (a size key's range) stand beside it.
                ty = format!("{ty}{}", bounds(prop, true));
            }
            if let Some(child) = children.get_mut(before) {
                child.required = strings(&prop["required"]).into_iter().map(str::to_owned).collect();
            }
            let default =
                if required.contains(&name.as_str()) { "required".to_owned() } else { default_of(root, prop) };
            let _ = writeln!(
                self.out,
                "| `{path}` | {ty} | {default} | {} | {} |",
                reload.as_deref().unwrap_or("?"),
                cell(&describe(root, prop, &key))
            );
        }
        self.out.push('\n');
        self.queue.splice(0..0, children);
    }

    /// The type column of a key; a mapping it leads to (not yet described) is queued.
    fn type_of(
        &mut self,
        root: &Value,
        key: &Key<'_>,
        path: &str,
        reload: Option<&str>,
        children: &mut Vec<Section>,
    ) -> String {
        let or_null = if key.nullable { " or `null`" } else { "" };
        format!("{}{or_null}", self.type_name(root, key.schema, path, reload, children))
    }

    fn type_name(
        &mut self,
        root: &Value,
        schema: &Value,
        path: &str,
        reload: Option<&str>,
        children: &mut Vec<Section>,
    ) -> String {
        if let Some(def) = ref_name(schema) {
            let target = &root["definitions"][def];
            if let Some(title) = target.get("title").and_then(Value::as_str) {
                return format!("[{title}](#value-types)");
            }
            if let Some(values) = enum_values(target) {
                return values;
            }
            let heading = match self.sections.get(def) {
                Some(h) if self.reuse => h.clone(),
                _ => {
                    let heading = format!("`{path}`");
                    self.sections.entry(def.to_owned()).or_insert_with(|| heading.clone());
                    let (path, def, reload) = (path.to_owned(), Some(def.to_owned()), reload.map(str::to_owned));
                    children.push(Section { path, heading: heading.clone(), def, reload, required: Vec::new() });
                    heading
                }
            };
            // The link text stays code: a path like `clusters.<name>` outside backticks renders as
            // "clusters." (Markdown takes `<name>` for an HTML tag).
            return format!("mapping: [{heading}](#{})", anchor(&heading));
        }
        if let Some(values) = enum_values(schema) {
            return values;
        }
        let ty = types(schema);
        if ty.contains(&"array") {
            let item = unwrap(&schema["items"]);
            return format!("list of {}", self.type_name(root, item.schema, &format!("{path}[]"), reload, children));
        }
        if ty.contains(&"object")
            && let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object())
        {
            let item = unwrap(values);
            let inner = self.type_name(root, item.schema, &format!("{path}.<name>"), reload, children);
            return format!("map: name to {inner}");
        }
        let base = ty.iter().find(|t| **t != "null").copied().unwrap_or("any");
        format!("{base}{}", bounds(schema, false))
    }

    /// The value types read from strings, with what they accept.
    fn value_types(&mut self, root: &Value) {
        self.out.push_str(
            "## Value types\n\nWritten as YAML strings; the JSON Schema checks each against a pattern.\n\n\
             | type | written as | examples |\n|---|---|---|\n",
        );
        for def in root["definitions"].as_object().into_iter().flat_map(Map::values) {
            let Some(title) = def.get("title").and_then(Value::as_str) else { continue };
            let examples: Vec<String> = def["examples"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|e| format!("`{e}`"))
                .collect();
            let text = def.get("description").and_then(Value::as_str).unwrap_or_default();
            let _ = writeln!(self.out, "| {title} | {} | {} |", cell(text), examples.join(", "));
        }
    }
}

/// `, LO to HI`, `, at least LO`, `, at most HI` or nothing, from the schema's `minimum` and
/// `maximum`; in `bytes`, `LO` and `HI` also as a size with a binary unit where one is exact.
fn bounds(schema: &Value, bytes: bool) -> String {
    let n = |k: &str| schema.get(k).and_then(Value::as_u64);
    let show = |v: u64| match binary_unit(v) {
        Some(unit) if bytes => format!("{v} ({unit})"),
        _ => v.to_string(),
    };
    match (n("minimum"), n("maximum")) {
        (Some(lo), Some(hi)) => format!(", {} to {}", show(lo), show(hi)),
        (Some(lo), None) if lo > 0 => format!(", at least {}", show(lo)),
        (_, Some(hi)) => format!(", at most {}", show(hi)),
        _ => String::new(),
    }
}

/// `v` as `NKi`, `NMi` or `NGi` when it is a whole number of one (the largest such unit).
fn binary_unit(v: u64) -> Option<String> {
    [("Gi", 30), ("Mi", 20), ("Ki", 10)]
        .into_iter()
        .find(|(_, shift)| v >= 1 << shift && v.is_multiple_of(1 << shift))
        .map(|(unit, shift)| format!("{}{unit}", v >> shift))
}

/// The key's schema without what only wraps it: `allOf` with one member (draft-07 keeps a
/// `$ref` apart from its siblings so), and `anyOf` / `type` alternatives with `null`.
fn unwrap(schema: &Value) -> Key<'_> {
    if let Some([one]) = schema.get("allOf").and_then(Value::as_array).map(Vec::as_slice) {
        return unwrap(one);
    }
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
        let not_null: Vec<&Value> =
            any.iter().filter(|s| s.get("type").and_then(Value::as_str) != Some("null")).collect();
        if let [one] = not_null.as_slice() {
            let inner = unwrap(one);
            return Key { schema: inner.schema, nullable: true };
        }
    }
    Key { schema, nullable: types(schema).contains(&"null") }
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str).collect()
}

fn types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn ref_name(schema: &Value) -> Option<&str> {
    schema.get("$ref")?.as_str()?.strip_prefix("#/definitions/")
}

/// `` `a` \| `b` `` for a schema that is a choice of constants.
fn enum_values(schema: &Value) -> Option<String> {
    let values: Vec<&Value> = match (schema.get("enum"), schema.get("oneOf")) {
        (Some(Value::Array(e)), _) => e.iter().collect(),
        (_, Some(Value::Array(o))) => {
            o.iter().map(|v| v.get("const").or_else(|| v["enum"].get(0))).collect::<Option<_>>()?
        }
        _ => return None,
    };
    let names: Vec<String> = values.iter().filter_map(|v| v.as_str()).map(|v| format!("`{v}`")).collect();
    (!names.is_empty()).then(|| names.join(" \\| "))
}

/// The key's description, followed by what each choice of an enum means when the enum says.
fn describe(root: &Value, prop: &Value, key: &Key<'_>) -> String {
    let mut text = one_line(prop.get("description").and_then(Value::as_str).unwrap_or_default());
    let target = ref_name(key.schema).map(|d| &root["definitions"][d]).unwrap_or(key.schema);
    let choices: Vec<String> = target["oneOf"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let name = v.get("const").or_else(|| v["enum"].get(0))?.as_str()?;
            Some(format!("`{name}`: {}", one_line(v.get("description")?.as_str()?)))
        })
        .collect();
    if !choices.is_empty() {
        let _ = write!(text, " {}", choices.join(" "));
    }
    text.trim().to_owned()
}

/// The default column: the schema's `default` as YAML would write it; for a mapping whose
/// default is just its keys' own defaults, a pointer to them.
fn default_of(root: &Value, prop: &Value) -> String {
    let Some(d) = prop.get("default") else { return "—".to_owned() };
    let key = unwrap(prop);
    if let (Value::Object(given), Some(def)) = (d, ref_name(key.schema)) {
        let keys = &root["definitions"][def]["properties"];
        let own: Map<String, Value> = keys
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.get("default")?.clone())))
            .collect();
        if given.iter().all(|(k, v)| own.get(k) == Some(v)) {
            return "its keys' defaults".to_owned();
        }
    }
    format!("`{}`", flow(d).replace('|', "\\|"))
}

/// A JSON value in YAML flow style.
fn flow(v: &Value) -> String {
    match v {
        Value::Object(m) if m.is_empty() => "{}".to_owned(),
        Value::Object(m) => {
            let items: Vec<String> = m.iter().map(|(k, v)| format!("{k}: {}", flow(v))).collect();
            format!("{{ {} }}", items.join(", "))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(flow).collect::<Vec<_>>().join(", ")),
        Value::String(s) if plain(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Whether YAML reads `s` unquoted as the same string.
fn plain(s: &str) -> bool {
    let special = |c: char| "\"'#{}[],&*!|>%@`".contains(c) || c.is_whitespace();
    !s.is_empty()
        && !s.contains(special)
        && !s.starts_with(['-', '?', ':'])
        && !s.ends_with(':')
        && !matches!(s, "null" | "true" | "false" | "~")
        && s.parse::<f64>().is_err()
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") }
}

/// A doc comment as one line of text.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Text for a table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_githubs() {
        assert_eq!(anchor("`listeners[].routes[]`"), "listenersroutes");
        assert_eq!(anchor("Route files (`routes_dir`)"), "route-files-routes_dir");
        assert_eq!(anchor("host:port"), "hostport");
    }

    #[test]
    fn flow_style_quotes_only_when_yaml_would_misread() {
        assert_eq!(flow(&serde_json::json!({"listen": "127.0.0.1:9901"})), "{ listen: 127.0.0.1:9901 }");
        assert_eq!(flow(&serde_json::json!(["a b", "", "null", "10", "5s"])), r#"["a b", "", "null", "10", 5s]"#);
        assert_eq!(flow(&serde_json::json!(null)), "null");
    }
}
