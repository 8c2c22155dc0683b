//! A konnectivity client on gRPC core (Python `grpcio`, `tests/peers/konnectivity_client.py`), the implementation kube-apiserver's own gRPC stack shares its wire behaviour with: a child process driven one command per line.
//!
//! The script and the proto are compiled into this crate and written to a directory of the
//! peer's own, so a test or the demo needs only the Python tools venv that `.ci/run`
//! installs (grpcio and grpcio-tools, which generates the stubs at start).

use crate::tmp::TempDir;
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// The driven script.
pub const SCRIPT: &str = include_str!("../peers/konnectivity_client.py");
/// The proto the script generates its stubs from: the file the server is generated from.
const PROTO: &str = include_str!("../../proxy-server/proto/konnectivity-client.proto");
/// Where `.ci/run` installs grpcio and grpcio-tools.
pub const VENV: &str = "/opt/seedgate-ci-venv";
/// Starting (imports, stub generation) may take this long.
const START: Duration = Duration::from_secs(30);
/// One command's longest run: a 16 MiB transfer through Python on a loaded machine.
const COMMAND: Duration = Duration::from_secs(120);

/// How the client reaches the front end.
#[derive(Debug, Clone)]
pub enum Target {
    Unix(PathBuf),
    /// mTLS over TCP: the server's CA, the client's certificate and key (PEM), the server name.
    Mtls {
        addr: std::net::SocketAddr,
        ca: String,
        cert: String,
        key: String,
        server_name: String,
    },
}

/// The running client: one gRPC channel, kept for its life.
#[derive(Debug)]
pub struct GrpcCore {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: PathBuf,
    /// grpcio's version, as the script reported it.
    pub version: String,
    _dir: TempDir,
}

/// The venv's Python, when it has grpcio and grpcio-tools (looked up on disk, not by running it).
pub fn python() -> Option<PathBuf> {
    let venv = Path::new(VENV);
    let lib = std::fs::read_dir(venv.join("lib")).ok()?;
    let has = |site: &Path| ["grpc", "grpc_tools"].iter().all(|m| site.join(m).join("__init__.py").is_file());
    let found = lib.flatten().any(|e| has(&e.path().join("site-packages")));
    found.then(|| venv.join("bin/python3"))
}

impl GrpcCore {
    /// Start the client on `target`, sending `authority` as `:authority` (`None`: gRPC core's
    /// default for the target). `Ok(None)`: grpcio is not installed and skipping is allowed
    /// (`SEEDGATE_SKIP_MISSING=1`).
    pub async fn start(target: &Target, authority: Option<&str>) -> anyhow::Result<Option<Self>> {
        let Some(py) = python() else {
            return crate::peers::missing(&format!(
                "grpcio and grpcio-tools are not installed in {VENV} (.ci/run installs them; by hand: \
                 python3 -m venv {VENV} && {VENV}/bin/pip install grpcio grpcio-tools)"
            ));
        };
        let dir = TempDir::new("grpc-core")?;
        let script = dir.write("konnectivity_client.py", SCRIPT)?;
        let proto = dir.write("konnectivity-client.proto", PROTO)?;
        let stderr = dir.join("stderr.log");
        let mut cmd = tokio::process::Command::new(py);
        cmd.arg(&script).arg("--proto").arg(&proto);
        match target {
            Target::Unix(p) => cmd.arg("--target").arg(format!("unix:{}", p.display())),
            Target::Mtls { addr, ca, cert, key, server_name } => cmd
                .args(["--target", &addr.to_string(), "--server-name", server_name])
                .arg("--ca")
                .arg(dir.write("ca.crt", ca)?)
                .arg("--cert")
                .arg(dir.write("client.crt", cert)?)
                .arg("--key")
                .arg(dir.write("client.key", key)?),
        };
        if let Some(a) = authority {
            cmd.args(["--authority", a]);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr)?)
            .env("PYTHONUNBUFFERED", "1")
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("starting the grpcio client")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?).lines();
        let mut me = Self { child, stdin, stdout, stderr, version: String::new(), _dir: dir };
        let ready = me.answer(START).await.context("the grpcio client did not start")?;
        me.version = ready["grpcio"].as_str().unwrap_or("?").to_owned();
        Ok(Some(me))
    }

    /// Run one command (see the script's help); its answer, or its error with the client's stderr.
    pub async fn run(&mut self, command: &str) -> anyhow::Result<serde_json::Value> {
        self.stdin.write_all(format!("{command}\n").as_bytes()).await.context("the grpcio client is gone")?;
        self.stdin.flush().await?;
        self.answer(COMMAND).await.with_context(|| format!("grpcio client: {command}"))
    }

    async fn answer(&mut self, within: Duration) -> anyhow::Result<serde_json::Value> {
        let line = match tokio::time::timeout(within, self.stdout.next_line()).await {
            Ok(Ok(Some(l))) => l,
            Ok(Ok(None)) | Ok(Err(_)) => {
                anyhow::bail!("it exited ({:?}); stderr:\n{}", self.child.try_wait(), self.stderr())
            }
            Err(_) => anyhow::bail!("no answer within {within:?}; stderr:\n{}", self.stderr()),
        };
        let v: serde_json::Value = serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))?;
        if v["ok"] != true {
            anyhow::bail!("{}", v["error"].as_str().unwrap_or(&line));
        }
        Ok(v)
    }

    fn stderr(&self) -> String {
        let s = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let tail: Vec<&str> = s.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}
