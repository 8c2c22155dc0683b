//! The JSON Schema of every config file, generated from the config types with schemars.
//!
//! The schemas are draft-07, the newest draft the YAML language server of editors validates
//! reliably. They say what the parser accepts as far as JSON Schema can: unknown keys are refused
//! (`additionalProperties: false`), a section that may be `null` says so, and the value types read
//! from strings (durations, addresses, CIDRs, file modes) are strings with a `pattern`. Rules
//! between keys (a `default_route` naming a route, a port used twice) are the validator's alone.
//!
//! Every key also carries `x-reload`: what a config reload does with a change of it (see
//! [`RELOAD`]); a struct may give the value for all its keys, a key its own.

use crate::common::{CidrPort, Dur, FileMode, HostPort, IpCidr, Located};
use schemars::{JsonSchema, Schema, SchemaGenerator, generate::SchemaSettings, json_schema};
use serde_json::Value;
use std::borrow::Cow;

/// The extension keyword that says how a key behaves on a reload.
pub const RELOAD_KEYWORD: &str = "x-reload";

/// The values of [`RELOAD_KEYWORD`] and what each means.
pub const RELOAD: &[(&str, &str)] = &[
    ("live", "a reload applies it at once, to what is running too"),
    (
        "new connections",
        "a reload applies it to connections accepted afterwards; live ones keep what they started with",
    ),
    ("new streams", "a reload applies it to tunnel streams opened afterwards; live ones keep what they started with"),
    ("new sessions", "a reload applies it to tunnel sessions made afterwards; live ones keep what they started with"),
    (
        "restart",
        "a reload that changes it is refused, naming the key (the running config stays); restart the process to apply it",
    ),
];

/// A config file with a schema of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigFile {
    /// sni-router's config.
    Router,
    /// proxy-server's config.
    Server,
    /// proxy-agent's config.
    Agent,
    /// A file of sni-router's `routes_dir`.
    RouteFile,
    /// A file of proxy-server's `clusters_dir`.
    ClusterFile,
}

impl ConfigFile {
    pub const ALL: [ConfigFile; 5] = [Self::Router, Self::Server, Self::Agent, Self::RouteFile, Self::ClusterFile];

    /// The file's name in `docs/reference/schema/` (without `.json`) and in the reference's title.
    pub fn name(self) -> &'static str {
        match self {
            Self::Router => "sni-router",
            Self::Server => "proxy-server",
            Self::Agent => "proxy-agent",
            Self::RouteFile => "sni-router-route-file",
            Self::ClusterFile => "proxy-server-cluster-file",
        }
    }

    /// The binary that reads the file.
    pub fn binary(self) -> &'static str {
        match self {
            Self::Router | Self::RouteFile => "sni-router",
            Self::Server | Self::ClusterFile => "proxy-server",
            Self::Agent => "proxy-agent",
        }
    }

    /// What the file is, in a phrase.
    pub fn title(self) -> &'static str {
        match self {
            Self::Router => "sni-router config",
            Self::Server => "proxy-server config",
            Self::Agent => "proxy-agent config",
            Self::RouteFile => "sni-router route file (a file of `routes_dir`)",
            Self::ClusterFile => "proxy-server cluster file (a file of `clusters_dir`)",
        }
    }

    /// The file's JSON Schema.
    pub fn schema(self) -> Value {
        match self {
            Self::Router => root::<crate::router::RouterConfig>(self),
            Self::Server => root::<crate::server::ServerConfig>(self),
            Self::Agent => root::<crate::agent::AgentConfig>(self),
            Self::RouteFile => root::<crate::router::RouteFile>(self),
            Self::ClusterFile => root::<crate::server::ClusterFile>(self),
        }
    }

    /// [`ConfigFile::schema`] as the text `--print-schema` prints and `docs/reference/schema/`
    /// holds: two-space indented, with a final newline.
    pub fn schema_text(self) -> String {
        let mut s = serde_json::to_string_pretty(&self.schema()).expect("a JSON value serializes");
        s.push('\n');
        s
    }
}

fn root<T: JsonSchema>(file: ConfigFile) -> Value {
    let mut schema = SchemaSettings::draft07().into_generator().into_root_schema_for::<T>().to_value();
    if let Some(o) = schema.as_object_mut() {
        o.insert("title".into(), Value::from(format!("seedgate {}", file.title())));
    }
    schema
}

/// A duration as humantime reads it: numbers with units, e.g. `5s`, `250ms`, `1m30s`, `1h`.
/// (Spaces inside a number, which the parser skips, are not described.)
pub const DURATION_PATTERN: &str = concat!(
    r"^\s*([0-9]+(\.[0-9]+)?\s*",
    "(nanos|nsec|ns|usec|us|µs|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|",
    r"hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y)\s*)+$"
);

/// A port number 0..=65535 (leading zeros allowed, as Rust's integer parser allows them).
macro_rules! port {
    () => {
        "0*([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
    };
}
/// An IPv4 address as the standard library reads it (no leading zeros).
macro_rules! ipv4 {
    () => {
        r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
    };
}
/// An IPv4 network as ipnet reads it: octets of up to three digits, a prefix of up to two.
macro_rules! ipv4_net {
    () => {
        r"((25[0-5]|2[0-4][0-9]|[01][0-9]{2}|[0-9]{1,2})\.){3}(25[0-5]|2[0-4][0-9]|[01][0-9]{2}|[0-9]{1,2})/([0-2]?[0-9]|3[0-2])"
    };
}
/// The characters of an IPv6 address (its grammar is left to the parser).
macro_rules! ipv6 {
    () => {
        "[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*"
    };
}
macro_rules! cidr4 {
    () => {
        concat!("(", ipv4_net!(), "|", ipv4!(), ")")
    };
}
macro_rules! cidr6 {
    () => {
        concat!(ipv6!(), "(/(0{0,2}[0-9]|0?[1-9][0-9]|1[01][0-9]|12[0-8]))?")
    };
}

/// `host:port`: a DNS name or IPv4 literal, or a bracketed IPv6 literal, then a port.
pub const HOST_PORT_PATTERN: &str = concat!(r"^(\[", ipv6!(), r"\]|[A-Za-z0-9._-]{1,253}):", port!(), "$");
/// An IP network or a single address.
pub const CIDR_PATTERN: &str = concat!(r"^\s*(", cidr4!(), "|", cidr6!(), r")\s*$");
/// A network with an optional port; an IPv6 one with a port in brackets.
pub const CIDR_PORT_PATTERN: &str =
    concat!(r"^\s*(\[", cidr6!(), r"\](:", port!(), ")?|", cidr4!(), "(:", port!(), ")?|", cidr6!(), r")\s*$");
/// Octal permission bits up to `0777`, optionally with `0o`.
pub const FILE_MODE_PATTERN: &str = r"^\s*(0o)?0*[0-7]{1,3}\s*$";
/// A size written as a string: digits with an optional fraction, then an optional unit (see
/// [`crate::parse_size`]).
pub const SIZE_PATTERN: &str = r"^\s*[0-9]+(\.[0-9]+)?(KiB|MiB|GiB|TiB|Ki|Mi|Gi|Ti|k|K|M|G|T)?\s*$";

/// The value types read from strings: their schema is a string with a pattern, under a name of
/// their own in `definitions`, titled as the reference shows the type.
macro_rules! string_schema {
    ($($t:ty: $name:literal, $title:literal, $pattern:expr, $description:literal, [$($example:literal),*];)*) => {$(
        impl JsonSchema for $t {
            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({
                    "title": $title,
                    "description": $description,
                    "type": "string",
                    "pattern": $pattern,
                    "examples": [$($example),*],
                })
            }
        }
    )*};
}

string_schema! {
    Dur: "Duration", "duration", DURATION_PATTERN,
        "A duration written as a string: a number and a unit, repeated (`ms`, `s`, `m`, `h`, `d`, ...).",
        ["5s", "250ms", "1m30s", "1h"];
    HostPort: "HostPort", "host:port", HOST_PORT_PATTERN,
        "`host:port`: an IP literal (IPv6 in brackets) or a DNS name, resolved when used.",
        ["10.0.1.5:443", "api.seed.example.com:8443", "[fd00::1]:8132"];
    IpCidr: "Cidr", "CIDR", CIDR_PATTERN,
        "An IP network in CIDR notation (host bits zero), or one address for a single host.",
        ["10.0.0.0/8", "fd00::/8", "10.1.2.3"];
    CidrPort: "CidrPort", "CIDR[:port]", CIDR_PORT_PATTERN,
        "A CIDR with an optional port: `10.0.0.0/8`, `10.0.0.0/8:443`, `10.1.2.3:443`, and for IPv6 `[fd00::/8]:443`.",
        ["10.250.0.0/16", "100.64.0.10/32:53", "[fd00::/8]:443"];
    FileMode: "FileMode", "file mode", FILE_MODE_PATTERN,
        "Permission bits of a file in octal, as a string (quote it in YAML).",
        ["0660", "0o600"];
}

/// The schema of a size key (its field keeps its integer type; `crate::size` reads it): an
/// integer or a string with a unit. A key's own range (`#[schemars(range(...))]` beside it)
/// bounds the integer form; the string form's value is the validator's to check.
pub(crate) struct Size;

impl JsonSchema for Size {
    fn schema_name() -> Cow<'static, str> {
        "Size".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "title": "size",
            "description": "A number of bytes: an integer, or a string of a number and a unit as Kubernetes writes \
                quantities: `Ki`, `Mi`, `Gi` (powers of 1024; `KiB`, `MiB`, `GiB` too) or `k`, `M`, `G` (powers of \
                1000). A fraction is allowed where the result is whole bytes (`1.5Mi`).",
            "type": ["integer", "string"],
            "minimum": 0,
            "pattern": SIZE_PATTERN,
            "examples": [16777216, "16Mi", "512Ki", "64M", "1.5Gi"],
        })
    }
}

/// The schema of a size key bounded to `MIN..=MAX` (the bounds check its integer form):
/// `#[schemars(schema_with = "crate::schema::size::<MIN, MAX>")]`.
pub(crate) fn size<const MIN: u64, const MAX: u64>(generator: &mut SchemaGenerator) -> Schema {
    // draft-07 ignores the siblings of a `$ref`: the bounds stand beside an `allOf` holding it.
    json_schema!({ "allOf": [generator.subschema_for::<Size>()], "minimum": MIN, "maximum": MAX })
}

/// [`size`] for an optional key (`null`: not set).
pub(crate) fn size_or_null<const MIN: u64, const MAX: u64>(generator: &mut SchemaGenerator) -> Schema {
    json_schema!({ "anyOf": [generator.subschema_for::<Size>(), { "type": "null" }], "minimum": MIN, "maximum": MAX })
}

/// A located value is its value (the position is the parser's own bookkeeping).
impl<T: JsonSchema> JsonSchema for Located<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}
