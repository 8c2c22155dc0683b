//! Command-line flags every binary takes, and the `--check` behaviour (print problems, exit 2; print warnings, exit 0 when there is no problem).

use crate::obs::telemetry::LogFormat;
use crate::tls::{Part, check_files};
use seedgate_config::{BinaryConfig, ConfigError, Problem};
use std::path::{Path, PathBuf};

/// Flags common to sni-router, proxy-server and proxy-agent.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// YAML config file. It is reloaded on SIGHUP and when the file changes.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Print the JSON Schema (draft-07) of the config file and exit. Point an editor's YAML
    /// language server at it: `# yaml-language-server: $schema=<file>` as the file's first line.
    #[arg(long, exclusive = true)]
    pub print_schema: bool,
    /// Validate the config, print every problem with file, line and field, and exit:
    /// 0 when valid, 2 when not.
    #[arg(long)]
    pub check: bool,
    /// With --check: validate the config alone, without loading the certificate, key, CA and
    /// token files it names (for checking manifests where those secrets are not mounted).
    #[arg(long, requires = "check")]
    pub skip_file_checks: bool,
    /// Log format on stderr. The level comes from RUST_LOG (default: info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// After binding (and after every reload), write the bound addresses as JSON to FILE
    /// (atomically): {"admin": "ip:port" or null, "listeners": {"NAME": "ip:port", ...}}.
    #[arg(long, value_name = "FILE")]
    pub write_addresses: Option<PathBuf>,
}

impl CommonArgs {
    /// Parse the process arguments for the binary `name`, whose config is `T`; `--help` shows
    /// `about`. `--print-schema` prints `T`'s schema and exits here.
    pub fn parse_for<T: BinaryConfig>(name: &'static str, about: &'static str) -> Self {
        use clap::{Args, FromArgMatches};
        let cmd = Self::augment_args(clap::Command::new(name).about(about).version(env!("CARGO_PKG_VERSION")));
        let matches = cmd.get_matches();
        if matches.get_flag("print_schema") {
            print!("{}", T::schema_text());
            std::process::exit(0);
        }
        Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// Exit code of `--check` and of a start with an invalid config.
pub const EXIT_INVALID_CONFIG: i32 = 2;

/// Load the config for `--check` or start-up; on error print every problem and exit 2.
/// Start-up and `--check` run the same checks, so they print the same messages. `--check`
/// prints warnings too (`warning: ` and a problem's form) and still exits 0; at start-up the
/// TLS material logs them when it loads.
pub fn load_or_exit<T: BinaryConfig>(args: &CommonArgs) -> T {
    let loaded = if args.skip_file_checks {
        seedgate_config::load(&args.config, T::parse).map(|c| (c, Vec::new()))
    } else {
        load_checked(&args.config)
    };
    match loaded {
        Ok((cfg, warnings)) => {
            if args.check {
                for w in &warnings {
                    eprintln!("warning: {w}");
                }
                println!("{}: valid", args.config.display());
                std::process::exit(0);
            }
            cfg
        }
        Err(e) => {
            for p in &e.problems {
                eprintln!("{p}");
            }
            std::process::exit(EXIT_INVALID_CONFIG);
        }
    }
}

/// Parse and validate the config at `path`, then load every file it names (certificates, keys,
/// CAs, the admin token) the way the binary will: the config and the warnings about its files,
/// or every problem. Sockets are not bound: a port held by the process being replaced is no
/// error here.
pub fn load_checked<T: BinaryConfig>(path: &Path) -> Result<(T, Vec<Problem>), ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::internal(&file, &format!("cannot read: {e}")))?;
    let (cfg, mut problems) = T::parse_partial(&text, &file);
    // The files are checked even when the config has other problems, so one run shows all.
    let mut warnings = Vec::new();
    if let Some(c) = &cfg {
        let (p, w) = files_checked(c);
        problems.extend(seedgate_config::locate(&text, &file, p).problems);
        warnings = seedgate_config::locate(&text, &file, w).problems;
    }
    match cfg {
        Some(cfg) if problems.is_empty() => Ok((cfg, warnings)),
        _ => Err(ConfigError { problems }),
    }
}

/// `(key path, message)` for every file of `cfg` that cannot be used.
pub fn file_problems<T: BinaryConfig>(cfg: &T) -> Vec<(String, String)> {
    files_checked(cfg).0
}

/// A config key's path and what is said of its file.
type KeyMessage = (String, String);

/// The problems, and what is allowed but rarely meant (a revocation list that no CA of its
/// bundle signed: it revokes nothing), each as `(key path, message)`.
fn files_checked<T: BinaryConfig>(cfg: &T) -> (Vec<KeyMessage>, Vec<KeyMessage>) {
    let (mut out, mut warnings) = (Vec::new(), Vec::new());
    if let Err(e) = crate::obs::admin::load_token(cfg.admin().token_file.as_deref()) {
        let f = cfg.admin().token_file.as_deref().unwrap_or_default();
        // An empty token file's error already names the file.
        let msg = if e.kind() == std::io::ErrorKind::InvalidData { e.to_string() } else { format!("{f}: {e}") };
        out.push(("admin.token_file".to_owned(), msg));
    }
    for (key, f) in cfg.token_files() {
        if let Err(e) = crate::obs::admin::load_token(Some(&f)) {
            let msg = if e.kind() == std::io::ErrorKind::InvalidData { e.to_string() } else { format!("{f}: {e}") };
            out.push((key, msg));
        }
    }
    for t in cfg.tls_files() {
        let file = |k: &Option<(String, String)>| k.as_ref().map(|(_, f)| Path::new(f).to_owned());
        let identity = t.identity.as_ref().map(|((_, c), (_, k))| (Path::new(c), Path::new(k)));
        let key = |part: Part| match (part, &t.identity) {
            (Part::Cert, Some((c, _))) => c.0.clone(),
            (Part::Key, Some((_, k))) => k.0.clone(),
            (Part::Crl, _) => t.crl.as_ref().map(|(k, _)| k.clone()).unwrap_or_default(),
            _ => t.ca.as_ref().map(|(k, _)| k.clone()).unwrap_or_default(),
        };
        let checked = check_files(identity, file(&t.ca).as_deref(), file(&t.crl).as_deref());
        out.extend(checked.problems.into_iter().map(|(part, e)| (key(part), e.to_string())));
        warnings.extend(checked.warnings.into_iter().map(|(part, w)| (key(part), w)));
    }
    // Only what would make the bind refuse for certain: a stale or live socket may be gone by
    // then, and nothing is connected to or bound here.
    for (key, path) in cfg.unix_sockets() {
        use std::os::unix::fs::FileTypeExt;
        if let Ok(m) = std::fs::symlink_metadata(&path)
            && !m.file_type().is_socket()
        {
            out.push((key, format!("{path} exists and is not a socket; it would not be replaced")));
        }
    }
    (out, warnings)
}
