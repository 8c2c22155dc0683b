//! Value types shared by every binary's config: durations, addresses, CIDRs, the admin section.

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

/// A value with the line and column it came from, for validation messages.
/// Serializes as the bare value (for `/config`); compares by value only, so moving a route
/// within the file does not make a reload treat it as changed.
#[derive(Debug, Clone)]
pub struct Located<T> {
    pub value: T,
    pub line: u64,
    pub column: u64,
}

impl<T: PartialEq> PartialEq for Located<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: Eq> Eq for Located<T> {}

impl<T> Located<T> {
    pub fn at(&self) -> (u64, u64) {
        (self.line, self.column)
    }
}

impl<T> std::ops::Deref for Located<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: fmt::Display> fmt::Display for Located<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Located<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = serde_saphyr::Spanned::<T>::deserialize(d)?;
        Ok(Self { value: s.value, line: s.referenced.line(), column: s.referenced.column() })
    }
}

impl<T: Serialize> Serialize for Located<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

/// A duration written as a string: `5s`, `250ms`, `1h`, `1m30s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Dur(pub Duration);

impl Dur {
    pub const fn secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }
    pub const fn millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }
    pub fn get(self) -> Duration {
        self.0
    }
}

/// The forms a size may take (`size.rs` reads them), as a refused one's message names them.
const SIZE_FORMS: &str = "write a byte count (16777216) or a number with a unit: Ki, Mi, Gi \
     (powers of 1024; KiB, MiB, GiB too) or k, M, G (powers of 1000), e.g. 16Mi or 1.5Gi";

/// A value written as a string (duration, address, CIDR, file mode) that does not parse. Its
/// text is the config problem's message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    #[error("invalid duration {text:?} ({reason}); write e.g. 5s, 250ms, 1h")]
    Duration { text: String, reason: humantime::DurationError },
    #[error("invalid address {0:?}: expected host:port (IPv6 as [addr]:port)")]
    HostPort(String),
    #[error("CIDR {text:?} has host bits set; did you mean {network}?")]
    HostBits { text: String, network: ipnet::IpNet },
    #[error("invalid CIDR {0:?}: expected e.g. 10.0.0.0/8 or 10.1.2.3")]
    Cidr(String),
    #[error("invalid {text:?}: {fault}; expected CIDR[:port], IPv6 as [cidr]:port")]
    CidrPort { text: String, fault: CidrPortFault },
    #[error("invalid file mode {0:?}: write octal permission bits as a string, e.g. \"0660\"")]
    FileMode(String),
    #[error("invalid size {text:?} ({why}); {forms}", forms = SIZE_FORMS)]
    Size { text: String, why: &'static str },
}

/// What is wrong in a `CIDR[:port]`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CidrPortFault {
    #[error("missing ]")]
    MissingBracket,
    #[error("bad port")]
    Port,
    #[error(transparent)]
    Cidr(Box<ValueError>),
}

impl FromStr for Dur {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        humantime::parse_duration(s.trim())
            .map(Dur)
            .map_err(|reason| ValueError::Duration { text: s.to_owned(), reason })
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// `host:port`, where host is an IP literal (`[v6]` bracketed) or a DNS name resolved on use.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

impl HostPort {
    /// The socket address if the host is an IP literal.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        self.host.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, self.port))
    }
}

impl FromStr for HostPort {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let bad = || ValueError::HostPort(s.to_owned());
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (h, p) = rest.split_once("]:").ok_or_else(bad)?;
            h.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
            (h, p)
        } else {
            let (h, p) = s.rsplit_once(':').ok_or_else(bad)?;
            if h.contains(':') {
                return Err(bad());
            }
            (h, p)
        };
        if host.is_empty() || !valid_host(host) {
            return Err(bad());
        }
        let port = port.parse::<u16>().map_err(|_| bad())?;
        Ok(Self { host: host.to_ascii_lowercase(), port })
    }
}

fn valid_host(h: &str) -> bool {
    h.len() <= 253 && h.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'))
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// An IP network: `10.0.0.0/8`, `fd00::/8`, or a bare address meaning a single host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpCidr(pub ipnet::IpNet);

impl IpCidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&canonical(ip))
    }
    pub fn prefix_len(&self) -> u8 {
        self.0.prefix_len()
    }
}

/// Map IPv4-mapped IPv6 addresses to IPv4 so `10.0.0.0/8` matches `::ffff:10.1.2.3`.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

impl FromStr for IpCidr {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let s = s.trim();
        if let Ok(net) = s.parse::<ipnet::IpNet>() {
            if net.trunc() != net {
                return Err(ValueError::HostBits { text: s.to_owned(), network: net.trunc() });
            }
            return Ok(Self(net));
        }
        s.parse::<IpAddr>().map(|ip| Self(ipnet::IpNet::from(ip))).map_err(|_| ValueError::Cidr(s.to_owned()))
    }
}

impl fmt::Display for IpCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A CIDR with an optional port: `10.0.0.0/8`, `10.0.0.0/8:443`, `10.1.2.3:443`,
/// `[fd00::/8]:443`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CidrPort {
    pub net: IpCidr,
    pub port: Option<u16>,
}

impl CidrPort {
    pub fn matches(&self, addr: SocketAddr) -> bool {
        self.net.contains(addr.ip()) && self.port.is_none_or(|p| p == addr.port())
    }
    pub fn matches_ip_port(&self, ip: IpAddr, port: u16) -> bool {
        self.net.contains(ip) && self.port.is_none_or(|p| p == port)
    }
}

impl FromStr for CidrPort {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let s = s.trim();
        let bad = |fault| ValueError::CidrPort { text: s.to_owned(), fault };
        let net = |n: &str| n.parse::<IpCidr>().map_err(|e| bad(CidrPortFault::Cidr(Box::new(e))));
        if let Some(rest) = s.strip_prefix('[') {
            let (n, port) = rest.split_once(']').ok_or_else(|| bad(CidrPortFault::MissingBracket))?;
            let port = match port {
                "" => None,
                p => Some(
                    p.strip_prefix(':').and_then(|p| p.parse::<u16>().ok()).ok_or_else(|| bad(CidrPortFault::Port))?,
                ),
            };
            return Ok(Self { net: net(n)?, port });
        }
        // IPv4 (or a bare IPv6 without port): a colon after the address part is the port.
        if s.contains('.')
            && let Some((n, port)) = s.rsplit_once(':')
        {
            let port = port.parse::<u16>().map_err(|_| bad(CidrPortFault::Port))?;
            return Ok(Self { net: net(n)?, port: Some(port) });
        }
        Ok(Self { net: net(s)?, port: None })
    }
}

impl fmt::Display for CidrPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.port, self.net.0) {
            (None, _) => self.net.fmt(f),
            (Some(p), ipnet::IpNet::V6(_)) => write!(f, "[{}]:{p}", self.net),
            (Some(p), _) => write!(f, "{}:{p}", self.net),
        }
    }
}

/// Values written as strings. While a config file is parsed (see `yaml`), a bad one is recorded
/// with its position and replaced by the placeholder, so the parse goes on to find the others;
/// the placeholders never reach a running process (the file is refused).
/// Permission bits of a file, written in octal as a string: `"0660"`, `"660"`, `"0o660"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileMode(pub u32);

impl FromStr for FileMode {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let digits = s.trim().strip_prefix("0o").unwrap_or(s.trim());
        match u32::from_str_radix(digits, 8) {
            Ok(m) if !digits.is_empty() && m <= 0o777 => Ok(Self(m)),
            _ => Err(ValueError::FileMode(s.to_owned())),
        }
    }
}

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

macro_rules! string_serde {
    ($($t:ty = $placeholder:expr),*) => {$(
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                if !crate::yaml::collecting() {
                    let s = String::deserialize(d)?;
                    return s.parse().map_err(de::Error::custom);
                }
                let s = serde_saphyr::Spanned::<String>::deserialize(d)?;
                s.value.parse().or_else(|e: ValueError| {
                    crate::yaml::record(s.referenced.line(), s.referenced.column(), e.to_string());
                    Ok($placeholder)
                })
            }
        }
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    )*};
}
string_serde!(
    Dur = Dur::secs(1),
    FileMode = FileMode(0o600),
    HostPort = HostPort { host: "invalid".into(), port: 0 },
    IpCidr = IpCidr(ipnet::IpNet::from(IpAddr::from([0, 0, 0, 0]))),
    CidrPort = CidrPort { net: IpCidr(ipnet::IpNet::from(IpAddr::from([0, 0, 0, 0]))), port: None }
);

/// `#[serde(deserialize_with)]` for an optional section: `key: null` (or `key:` with nothing)
/// means the same as leaving the key out.
pub(crate) fn null_is_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The admin HTTP listener (`/metrics`, `/healthz`, `/readyz`, `/config`, the status page `/` and `/status`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "live"))]
pub struct AdminConfig {
    /// `host:port` to listen on; `null` (or leaving it out of an `admin` section that is
    /// given) disables the admin listener. A reload moves the listener (the new socket is bound
    /// first).
    pub listen: Option<HostPort>,
    /// File holding a bearer token required by the admin endpoints that change state (under
    /// `/control/`). Without it those endpoints answer 403. Re-read on every reload; never shown
    /// by `/config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// The status page (`/`) and its JSON (`/status`) need the token of `token_file` too: as
    /// `Authorization: Bearer <token>`, or as the password of Basic credentials (any user name),
    /// which is what a browser sends after the login prompt a `401` brings up. Without
    /// `token_file` they then answer 403. Default `false`: anyone who reaches the admin listener
    /// may read them, as `/metrics` and `/readyz`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub status_requires_token: bool,
}

impl AdminConfig {
    pub fn on(port: u16) -> Self {
        Self {
            listen: Some(HostPort { host: "127.0.0.1".into(), port }),
            token_file: None,
            status_requires_token: false,
        }
    }
}

/// Durations that must be above zero (the timeouts), each named by its key.
pub(crate) fn validate_positive(keys: &[(&str, Dur)], p: &mut crate::error::Problems) {
    for (name, d) in keys {
        if d.get().is_zero() {
            p.push(*name, "must be positive");
        }
    }
}

/// `limits.tenant_share`: a fraction of the process limits, above 0 and at most 1.
pub(crate) fn validate_share(share: f64, field: &str, p: &mut crate::error::Problems) {
    if !(share > 0.0 && share <= 1.0) {
        p.push(field, "must be a fraction above 0 and at most 1 (0.25: a quarter of each process limit)");
    }
}

/// One tenant's own limits (a route's or a cluster's `limits`): each set one at least 1.
pub(crate) fn validate_tenant_limits(keys: &[(&str, Option<usize>)], field: &str, p: &mut crate::error::Problems) {
    for (key, v) in keys {
        if *v == Some(0) {
            p.push(format!("{field}.{key}"), "must be at least 1 (leave it out for the default share)");
        }
    }
}

/// The pending budget's settings: connections accepted and not yet past their first phase
/// (sni-router: routing; proxy-server: a front end's TLS handshake and request head). Its keys
/// are in `limits` and `timeouts`: `limits_with_pending_budget!` and
/// `timeouts_with_pending_budget!` declare them, for both binaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingBudget {
    /// `limits.max_pending`.
    pub max_pending: usize,
    /// `limits.pending_per_source`; 0: no per-source cap.
    pub per_source: usize,
    /// `limits.source_prefix_v4` and `limits.source_prefix_v6`: the per-source key.
    pub prefix_v4: u8,
    pub prefix_v6: u8,
    /// `timeouts.handshake`, and `timeouts.handshake_floor` it shrinks to when the budget is full.
    pub deadline: Duration,
    pub deadline_floor: Duration,
}

/// A binary's `limits` section (reloads apply it to new connections, `max_connections` at once)
/// whose first keys are `max_connections` and the pending budget's: `max_pending`,
/// `pending_per_source`, `source_prefix_v4`, `source_prefix_v6`. serde's `flatten` does not
/// combine with `deny_unknown_fields`, so the keys are declared once here and written into each
/// binary's section. The docs of `max_connections`, `max_pending` and `pending_per_source` are
/// the binary's (what is pending differs), and so are the defaults of `max_connections` (the
/// module's `max_connections_default`) and `pending_per_source`.
macro_rules! limits_with_pending_budget {
    (
        $(#[$doc:meta])*
        pub struct $name:ident {
            $(#[$max_connections_meta:meta])*
            pub max_connections,
            $(#[$max_pending_meta:meta])*
            pub max_pending,
            $(#[$per_source_meta:meta])*
            pub pending_per_source = $per_source:expr,
            $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        #[schemars(extend("x-reload" = "new connections"))]
        pub struct $name {
            $(#[$max_connections_meta])*
            #[serde(default = "max_connections_default")]
            #[schemars(range(min = 1), extend("x-reload" = "live"))]
            pub max_connections: usize,
            $(#[$max_pending_meta])*
            #[serde(default = "max_pending_default")]
            #[schemars(range(min = 1))]
            pub max_pending: usize,
            $(#[$per_source_meta])*
            #[serde(default = "pending_per_source_default")]
            pub pending_per_source: usize,
            /// The per-source key of `pending_per_source`: an IPv4 peer address masked to this prefix.
            #[serde(default = "source_prefix_v4_default")]
            #[schemars(range(max = 32))]
            pub source_prefix_v4: u8,
            /// The per-source key of `pending_per_source`: an IPv6 peer address masked to this prefix.
            #[serde(default = "source_prefix_v6_default")]
            #[schemars(range(max = 128))]
            pub source_prefix_v6: u8,
            $($(#[$field_meta])* pub $field: $ty,)*
        }

        $crate::common::default_fn! {
            max_pending_default: usize = 2_000;
            pending_per_source_default: usize = $per_source;
            source_prefix_v4_default: u8 = 32;
            source_prefix_v6_default: u8 = 64;
        }
    };
}
pub(crate) use limits_with_pending_budget;

/// A binary's `timeouts` section (reloads apply it to new connections) whose first keys are the
/// pending budget's: `handshake` (the deadline of the pending phase) and `handshake_floor`,
/// with the binary's docs.
macro_rules! timeouts_with_pending_budget {
    (
        $(#[$doc:meta])*
        pub struct $name:ident {
            $(#[$handshake_meta:meta])*
            pub handshake,
            $(#[$floor_meta:meta])*
            pub handshake_floor,
            $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        #[schemars(extend("x-reload" = "new connections"))]
        pub struct $name {
            $(#[$handshake_meta])*
            #[serde(default = "handshake_default")]
            pub handshake: Dur,
            $(#[$floor_meta])*
            #[serde(default = "handshake_floor_default")]
            pub handshake_floor: Dur,
            $($(#[$field_meta])* pub $field: $ty,)*
        }

        $crate::common::default_fn! {
            handshake_default: Dur = Dur::secs(5);
            handshake_floor_default: Dur = Dur::millis(500);
        }
    };
}
pub(crate) use timeouts_with_pending_budget;

/// `pending_budget()` of a binary config whose `limits` and `timeouts` have the pending budget's keys.
macro_rules! pending_budget_of {
    ($t:ty) => {
        impl $t {
            /// The pending budget's settings in this config.
            pub fn pending_budget(&self) -> $crate::common::PendingBudget {
                let (l, t) = (&self.limits, &self.timeouts);
                $crate::common::PendingBudget {
                    max_pending: l.max_pending,
                    per_source: l.pending_per_source,
                    prefix_v4: l.source_prefix_v4,
                    prefix_v6: l.source_prefix_v6,
                    deadline: t.handshake.get(),
                    deadline_floor: t.handshake_floor.get(),
                }
            }
        }
    };
}
pub(crate) use pending_budget_of;

/// The pending budget's checks, as problems of `limits.*`.
pub(crate) fn validate_pending_budget(b: &PendingBudget, p: &mut crate::error::Problems) {
    if b.max_pending == 0 {
        p.push("limits.max_pending", "must be at least 1");
    }
    if b.prefix_v4 > 32 {
        p.push("limits.source_prefix_v4", "must be between 0 and 32");
    }
    if b.prefix_v6 > 128 {
        p.push("limits.source_prefix_v6", "must be between 0 and 128");
    }
}

/// An HTTP header name (RFC 9110 token).
pub fn valid_header_name(h: &str) -> bool {
    !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Shorthand for the per-field `#[serde(default = ...)]` functions.
macro_rules! default_fn {
    ($($name:ident: $t:ty = $e:expr;)*) => {$(
        pub(crate) fn $name() -> $t { $e }
    )*};
}
pub(crate) use default_fn;

/// A binary's whole config file: the keys every binary has — `admin`, `timeouts`,
/// `drain_grace`, `limits` — with the binary's docs (and when its `limits` apply), then its own
/// keys. The module gives `admin_default`, `drain_grace_default`, `Timeouts` and `Limits`.
macro_rules! config_file {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(#[$admin_meta:meta])*
            pub admin,
            $(#[$timeouts_meta:meta])*
            pub timeouts,
            $(#[$grace_meta:meta])*
            pub drain_grace,
            $(#[$limits_meta:meta])*
            pub limits (reload = $limits_reload:literal),
            $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $(#[$admin_meta])*
            #[serde(default = "admin_default", deserialize_with = "admin_or_null")]
            #[schemars(with = "Option<AdminConfig>", extend("x-reload" = "live"))]
            pub admin: AdminConfig,
            $(#[$timeouts_meta])*
            #[serde(default, deserialize_with = "null_is_default")]
            #[schemars(with = "Option<Timeouts>", extend("x-reload" = "new connections"))]
            pub timeouts: Timeouts,
            $(#[$grace_meta])*
            #[serde(default = "drain_grace_default")]
            #[schemars(extend("x-reload" = "live"))]
            pub drain_grace: Dur,
            $(#[$limits_meta])*
            #[serde(default, deserialize_with = "null_is_default")]
            #[schemars(with = "Option<Limits>", extend("x-reload" = $limits_reload))]
            pub limits: Limits,
            $($(#[$field_meta])* pub $field: $ty,)*
        }

        $crate::common::admin_or_null!();
    };
}
pub(crate) use config_file;

/// Defines `admin_or_null` for a module with an `admin_default`: `admin: null` means the
/// binary's default admin section, as when the key is left out.
macro_rules! admin_or_null {
    () => {
        fn admin_or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<AdminConfig, D::Error> {
            Ok(Option::<AdminConfig>::deserialize(d)?.unwrap_or_else(admin_default))
        }
    };
}
pub(crate) use admin_or_null;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!("5s".parse::<Dur>().unwrap(), Dur::secs(5));
        assert_eq!("250ms".parse::<Dur>().unwrap(), Dur::millis(250));
        assert_eq!("1h".parse::<Dur>().unwrap(), Dur::secs(3600));
        assert!("5".parse::<Dur>().is_err());
        assert!("five seconds".parse::<Dur>().is_err());
    }

    #[test]
    fn file_modes() {
        assert_eq!("0660".parse::<FileMode>().unwrap(), FileMode(0o660));
        assert_eq!("0o600".parse::<FileMode>().unwrap().to_string(), "0600");
        for bad in ["", "0888", "01777", "rw-rw----", "0x1ff"] {
            assert!(bad.parse::<FileMode>().is_err(), "{bad}");
        }
    }

    #[test]
    fn host_ports() {
        let hp: HostPort = "API.Example.com:443".parse().unwrap();
        assert_eq!((hp.host.as_str(), hp.port), ("api.example.com", 443));
        let hp: HostPort = "[::1]:8443".parse().unwrap();
        assert_eq!(hp.socket_addr(), Some("[::1]:8443".parse().unwrap()));
        assert_eq!(hp.to_string(), "[::1]:8443");
        for bad in ["", "host", "host:", ":443", "host:70000", "::1:443", "[::1]443", "a b:1"] {
            assert!(bad.parse::<HostPort>().is_err(), "{bad}");
        }
    }

    #[test]
    fn cidrs() {
        let c: CidrPort = "10.0.0.0/8:443".parse().unwrap();
        assert!(c.matches("10.1.2.3:443".parse().unwrap()));
        assert!(!c.matches("10.1.2.3:80".parse().unwrap()));
        assert!(c.matches("[::ffff:10.1.2.3]:443".parse().unwrap()));
        let c: CidrPort = "10.1.2.3:443".parse().unwrap();
        assert_eq!(c.net.prefix_len(), 32);
        let c: CidrPort = "[fd00::/8]:443".parse().unwrap();
        assert!(c.matches("[fd00::1]:443".parse().unwrap()));
        let c: CidrPort = "fd00::/8".parse().unwrap();
        assert_eq!(c.port, None);
        assert!("10.0.0.1/8".parse::<IpCidr>().is_err(), "host bits set");
        assert!("10.0.0.0/33".parse::<CidrPort>().is_err());
        assert!("10.0.0.0/8:99999".parse::<CidrPort>().is_err());
    }
}

/// Which end of TLS connections a set of files serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsRole {
    Server,
    Client,
}

/// The files of one `tls` section and the key path of each (e.g. `agents.tls.cert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub role: TlsRole,
    /// `(key path, file)` of the certificate and of its key; `None` for an agent that
    /// authenticates with a token only.
    pub identity: Option<((String, String), (String, String))>,
    /// The CA peers' certificates must chain to, if any.
    pub ca: Option<(String, String)>,
    /// Revocation lists for the peers' certificates, if any.
    pub crl: Option<(String, String)>,
}

impl TlsFiles {
    /// `section` is the key path of the `tls` mapping; `ca_key` the name of its CA key there.
    pub fn new(role: TlsRole, section: &str, identity: Option<(&str, &str)>, ca_key: &str, ca: Option<&str>) -> Self {
        let at = |k: &str, f: &str| (format!("{section}.{k}"), f.to_owned());
        Self {
            role,
            identity: identity.map(|(c, k)| (at("cert", c), at("key", k))),
            ca: ca.map(|c| at(ca_key, c)),
            crl: None,
        }
    }

    /// With the revocation lists at `{section}.crl`.
    pub fn with_crl(mut self, section: &str, crl: Option<&str>) -> Self {
        self.crl = crl.map(|f| (format!("{section}.crl"), f.to_owned()));
        self
    }
}

/// A transform for a struct with a key that serde gives a default but the validator requires
/// (absent, `null` and empty all read as empty, which is refused): the schema requires it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Require(pub &'static str);

impl schemars::transform::Transform for Require {
    fn transform(&mut self, schema: &mut schemars::Schema) {
        let required = schema.ensure_object().entry("required").or_insert_with(|| serde_json::Value::Array(Vec::new()));
        if let serde_json::Value::Array(keys) = required {
            keys.push(serde_json::Value::from(self.0));
        }
    }
}

/// The congestion controller of a QUIC session's sending side (each end paces what it sends by
/// its own). The default is seedgate's `loss_tolerant`: across an emulated 100 Mbit/s link with
/// 0.5 % and 1 % random loss at 50 ms it kept one stream at 70-80 Mbit/s, where quinn's Cubic
/// and NewReno fell to 2-5 (they read every loss as congestion), and on loss-free paths it
/// moves as much as Cubic while keeping the bottleneck queue short (a round trip behind a bulk
/// stream at 50 ms: 56 ms p50 against Cubic's 87). quinn's BBR keeps the rate under loss too
/// but stalled across a 150 ms path.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CongestionControl {
    /// Cubic's growth, but a loss cuts the window only while the round trip shows a queue at
    /// the bottleneck (the smoothed round trip above the path's minimum by an eighth of it,
    /// 2-10 ms); a loss without one is read as random and ignored. It also stops growing
    /// while such a queue stands and shrinks the window when it grows past twice that, so the
    /// bottleneck queue stays short (on paths under 1 ms, where the queue is the hosts' own, it
    /// grows as Cubic does). For paths with random loss (a WAN, radio hops), and
    /// anywhere interactive streams share a session with bulk ones. Choose `cubic` where the
    /// tunnel shares a bottleneck with loss-based traffic that keeps its queue full (this one
    /// backs off from a queue the other fills), or where the round trip swings by more than the
    /// margin without any queue.
    #[default]
    LossTolerant,
    /// CUBIC (RFC 9438): loss-based, quinn's own default.
    Cubic,
    /// BBR (quinn's implementation, experimental): paces at the measured bottleneck rate and
    /// does not read a loss as congestion.
    Bbr,
    /// NewReno (RFC 9002's reference controller): loss-based, halves at each loss.
    NewReno,
}

impl CongestionControl {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bbr => "bbr",
            Self::Cubic => "cubic",
            Self::NewReno => "new_reno",
            Self::LossTolerant => "loss_tolerant",
        }
    }
}
