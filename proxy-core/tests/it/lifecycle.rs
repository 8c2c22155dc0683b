//! The shared lifecycle in process, with a minimal service: a reload applied, a reload refused
//! (bad YAML, a restart-only key, the service's own refusal) with the old config kept, readiness
//! and `/config` through the service, and the drain (connections that finish, and ones cut at
//! the grace).

use proxy_core::app::shutdown::Shutdown;
use proxy_core::app::{self, Ctx, Service, StartError, fixed};
use proxy_core::obs::admin::Check;
use seedgate_config::{AdminConfig, BinaryConfig, ConfigError, Dur};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cfg {
    admin: AdminConfig,
    #[serde(default = "grace")]
    drain_grace: Dur,
    value: u32,
    #[serde(default)]
    fixed: String,
}

fn grace() -> Dur {
    Dur::secs(30)
}

impl BinaryConfig for Cfg {
    /// The toy is never a binary's config, so nothing prints its schema: any object will do.
    fn schema_text() -> String {
        "{}\n".to_owned()
    }
    fn parse(text: &str, _file: &str) -> Result<Cfg, ConfigError> {
        serde_saphyr::from_str(text).map_err(|e| ConfigError::internal("toy.yaml", &e.to_string()))
    }
    fn admin(&self) -> &AdminConfig {
        &self.admin
    }
    fn drain_grace(&self) -> Duration {
        self.drain_grace.get()
    }
    fn max_connections(&self) -> usize {
        10
    }
}

/// Applies `value`, refuses 13, and cannot change `fixed` at runtime.
struct Toy {
    value: AtomicU32,
    applied: Mutex<Vec<u32>>,
}

/// The toy service's one refusal.
#[derive(Debug, thiserror::Error)]
#[error("{0} is refused")]
struct Refused(u32);

impl Service for Toy {
    type Config = Cfg;
    const NAME: &'static str = "toy";
    type Opened = ();
    type ApplyError = Refused;

    fn restart_only(cfg: &Cfg) -> Vec<(&'static str, serde_json::Value)> {
        vec![fixed("fixed", &cfg.fixed)]
    }

    async fn bind(cfg: Arc<Cfg>, ctx: Ctx) -> Result<(Self, ()), StartError> {
        let _ = ctx;
        Ok((Self { value: AtomicU32::new(cfg.value), applied: Mutex::default() }, ()))
    }

    fn start(self: &Arc<Self>, (): ()) {}

    async fn apply(self: &Arc<Self>, new: Arc<Cfg>) -> Result<(), Refused> {
        if new.value == 13 {
            return Err(Refused(new.value));
        }
        self.value.store(new.value, Ordering::Relaxed);
        self.applied.lock().unwrap().push(new.value);
        Ok(())
    }

    fn listeners(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("main".into(), format!("value-{}", self.value.load(Ordering::Relaxed)))])
    }

    fn ready(&self) -> Vec<Check> {
        vec![Check::new("value", self.value.load(Ordering::Relaxed) != 0, "")]
    }
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("admin connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned())
}

fn reloads(text: &str, result: &str) -> u32 {
    let key = format!("seedgate_config_reloads_total{{result=\"{result}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Poll `f` every 20 ms until it is true, for at most [`DEADLINE`].
async fn until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + DEADLINE;
    while tokio::time::Instant::now() < end {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not reached within {DEADLINE:?}");
}

struct World {
    dir: std::path::PathBuf,
    file: std::path::PathBuf,
    addrs_file: std::path::PathBuf,
    admin: SocketAddr,
    toy: Arc<Toy>,
    shutdown: Shutdown,
    run: tokio::task::JoinHandle<proxy_core::app::shutdown::Drained>,
}

impl World {
    async fn start(name: &str, yaml: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("seedgate-lifecycle-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("toy.yaml");
        std::fs::write(&file, yaml).unwrap();
        let addrs_file = dir.join("addresses.json");
        let cfg = Cfg::parse(yaml, "toy.yaml").unwrap();
        let opts =
            app::Options { config_path: Some(file.clone()), write_addresses: Some(addrs_file.clone()), registry: None };
        let bound = app::bind::<Toy>(cfg, opts).await.unwrap();
        let admin = bound.local_addrs().admin.expect("admin");
        let toy = bound.service().clone();
        let shutdown = bound.shutdown();
        let run = tokio::spawn(bound.run(std::future::pending()));
        Self { dir, file, addrs_file, admin, toy, shutdown, run }
    }

    fn write(&self, yaml: &str) {
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, &self.file).unwrap();
    }

    async fn wait_reloads(&self, result: &str, n: u32) {
        let admin = self.admin;
        until(&format!("{n} {result} reloads"), async || reloads(&get(admin, "/metrics").await.1, result) >= n).await;
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const BASE: &str = "admin: { listen: 127.0.0.1:0 }\nvalue: 1\nfixed: a\n";

/// Two binaries in one process (as `testbed::inproc` runs them), each with its own registry:
/// both serve, and each `/metrics` shows its own build info once. Handing the first's registry
/// to a second is a start error that says why, not a panic.
#[tokio::test]
async fn two_binaries_in_one_process_each_have_their_own_registry() {
    let a = World::start("two-a", BASE).await;
    let b = World::start("two-b", BASE).await;
    for w in [&a, &b] {
        let (code, body) = get(w.admin, "/metrics").await;
        assert_eq!(code, 200);
        assert_eq!(body.matches("seedgate_build_info{").count(), 1, "{body}");
        assert_eq!(reloads(&body, "success"), 0);
    }
    // A reload of one is counted in its registry only.
    a.write(&BASE.replace("value: 1", "value: 2"));
    a.wait_reloads("success", 1).await;
    assert_eq!(reloads(&get(b.admin, "/metrics").await.1, "success"), 0);

    let registry = proxy_core::prometheus::Registry::new();
    let opts = || app::Options { registry: Some(registry.clone()), ..Default::default() };
    let cfg = || Cfg::parse(BASE, "toy.yaml").unwrap();
    let first = app::bind::<Toy>(cfg(), opts()).await.expect("the first binary on the registry");
    let err = app::bind::<Toy>(cfg(), opts()).await.err().expect("a second binary on the same registry");
    assert!(matches!(err, StartError::RegistryInUse), "{err}");
    assert!(err.to_string().contains("give each binary its own"), "{err}");
    drop(first);
}

#[tokio::test]
async fn reloads_apply_or_change_nothing() {
    let w = World::start("reload", BASE).await;
    assert_eq!(get(w.admin, "/readyz").await.0, 200);
    assert!(std::fs::read_to_string(&w.addrs_file).unwrap().contains("value-1"));

    w.write(&BASE.replace("value: 1", "value: 2"));
    w.wait_reloads("success", 1).await;
    assert_eq!(*w.toy.applied.lock().unwrap(), [2]);
    // The addresses file is rewritten after the reload; /config shows the new config.
    assert!(std::fs::read_to_string(&w.addrs_file).unwrap().contains("value-2"));
    assert!(get(w.admin, "/config").await.1.contains("\"value\": 2"));

    // Three refusals, each counted, none applied, the running config kept.
    for (i, bad) in
        ["value: [", "admin: { listen: 127.0.0.1:0 }\nvalue: 13\nfixed: a\n", &BASE.replace("fixed: a", "fixed: b")]
            .into_iter()
            .enumerate()
    {
        w.write(bad);
        w.wait_reloads("failure", i as u32 + 1).await;
        assert_eq!(*w.toy.applied.lock().unwrap(), [2], "refused config {i} was applied");
        assert!(get(w.admin, "/config").await.1.contains("\"value\": 2"), "running config replaced by {i}");
    }
    assert_eq!(reloads(&get(w.admin, "/metrics").await.1, "success"), 1);

    // A service-level failure of readiness shows on /readyz.
    w.write(&BASE.replace("value: 1", "value: 0"));
    w.wait_reloads("success", 2).await;
    let (code, body) = get(w.admin, "/readyz?verbose").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("[-]value failed"), "{body}");
}

/// Also: a change written right after the start is seen (the watch starts at bind, not when
/// its task first runs).
#[tokio::test]
async fn a_reload_moves_the_admin_listener() {
    let w = World::start("admin", BASE).await;
    w.write(&BASE.replace("127.0.0.1:0", "127.0.0.2:0"));
    let file = w.addrs_file.clone();
    until("the addresses file names the new admin", async || {
        std::fs::read_to_string(&file).is_ok_and(|t| t.contains("127.0.0.2:"))
    })
    .await;
    let text = std::fs::read_to_string(&w.addrs_file).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let new: SocketAddr = v["admin"].as_str().unwrap().parse().unwrap();
    assert_eq!(get(new, "/healthz").await.0, 200);
    assert!(tokio::net::TcpStream::connect(w.admin).await.is_err(), "the old admin listener is closed");
}

#[tokio::test]
async fn drain_waits_for_connections_then_cuts_the_rest() {
    let mut w = World::start("drain", &BASE.replace("value: 1", "value: 1\ndrain_grace: 300ms")).await;
    // A connection that ends within the grace, and one that would not.
    let quick = w.shutdown.tracker.spawn(tokio::time::sleep(Duration::from_millis(50)));
    let kill = w.shutdown.kill.clone();
    let slow = w.shutdown.tracker.spawn(async move { kill.cancelled().await });
    w.shutdown.stop.cancel();
    // While draining, /readyz fails so load balancers move away; the admin still answers.
    let (code, body) = get(w.admin, "/readyz?verbose").await;
    assert_eq!(code, 503);
    assert!(body.contains("draining"), "{body}");
    let drained = tokio::time::timeout(DEADLINE, &mut w.run).await.unwrap().unwrap();
    assert_eq!(drained.forced, 1, "the slow connection was cut at the grace");
    quick.await.unwrap();
    slow.await.unwrap();
}
