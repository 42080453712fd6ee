//! The image and the Kubernetes manifests as a cluster uses them: each
//! overlay rendered by `kubectl kustomize`, played by `podman kube play`
//! from an image `scripts/image.sh` built of this test's binary, and
//! probed, asked, reloaded and stopped as the kubelet would.
//!
//! What is changed between the render and the play, and why (podman is
//! not a cluster): `hostNetwork: true` with free loopback ports in place
//! of the manifests' ports (tests bind free ports on 127.0.0.1 only; the
//! container ports are dropped, which podman refuses on the host
//! network), one replica per play (two plays stand for two replicas), the
//! image, and the ConfigMap volume made a directory laid out as the
//! kubelet lays one out (`..data` links), so an update can be delivered
//! as the kubelet delivers it. The probes are read from the rendered
//! manifest and asked by the test, as the kubelet would ask them.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spillway_testkit::{RedisServer, free_port};

use crate::util::TempDir;

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// How to install what these tests run: they fail, never skip, without it.
const INSTALL: &str = "run scripts/setup.sh, or: apt-get install podman buildah runc catatonit \
     (and kubectl, /usr/bin/kubectl on the machine image)";

fn require(program: &str, version: &[&str]) {
    let ok = Command::new(program)
        .args(version)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "`{program}` is missing or does not run: {INSTALL}");
}

/// podman with the repository's containers.conf (runc, cgroupfs, rlimits).
fn podman() -> Command {
    let mut c = Command::new("podman");
    c.env(
        "CONTAINERS_CONF",
        repo().join("deploy/podman/containers.conf"),
    );
    c
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}: {INSTALL}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The run's image tag, once built (and built again if a test finished
/// and removed it before another started).
static IMAGE: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// The image of this test's binary, built by `scripts/image.sh` for the
/// tests of this run.
fn image() -> String {
    let mut built = IMAGE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(tag) = built.as_ref() {
        return tag.clone();
    }
    require("podman", &["--version"]);
    require("buildah", &["--version"]);
    require("kubectl", &["version", "--client"]);
    let tag = format!("localhost/spillway:it-{}", std::process::id());
    run(Command::new(repo().join("scripts/image.sh"))
        .args(["--tag", &tag])
        .env("SPILLWAY_BIN", env!("CARGO_BIN_EXE_spillway"))
        .env(
            "CONTAINERS_CONF",
            repo().join("deploy/podman/containers.conf"),
        ));
    *built = Some(tag.clone());
    tag
}

/// `kubectl kustomize` of an overlay, as JSON documents.
fn render(overlay: &str) -> Vec<Value> {
    let dir = repo().join("deploy/kubernetes/overlays").join(overlay);
    let text = run(Command::new("kubectl").arg("kustomize").arg(&dir));
    text.split("\n---\n")
        .map(|d| serde_saphyr::from_str::<Value>(d).expect("rendered YAML"))
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

/// A ConfigMap's data written as the kubelet's atomic writer keeps a
/// mounted volume: the files in a timestamped directory, `..data` a link
/// to it, each name a link into `..data`.
struct KubeletVolume(TempDir, u32);

impl KubeletVolume {
    fn new(data: &BTreeMap<String, String>) -> KubeletVolume {
        let mut v = KubeletVolume(TempDir::new("configmap"), 0);
        v.update(data);
        for name in data.keys() {
            std::os::unix::fs::symlink(format!("..data/{name}"), v.0.0.join(name)).unwrap();
        }
        // The container's user reads it (the kubelet makes it 0644/0755).
        run(Command::new("chmod").args(["-R", "a+rX"]).arg(&v.0.0));
        v
    }

    /// The kubelet's update: a new directory, a `..data_tmp` link to it,
    /// renamed over `..data` (one atomic swap), the old one removed.
    fn update(&mut self, data: &BTreeMap<String, String>) {
        self.1 += 1;
        let ts = format!("..2026_11_29_12_00_00.{}", self.1);
        let dir = self.0.0.join(&ts);
        std::fs::create_dir(&dir).unwrap();
        for (name, text) in data {
            std::fs::write(dir.join(name), text).unwrap();
        }
        run(Command::new("chmod").args(["-R", "a+rX"]).arg(&dir));
        let old = std::fs::read_link(self.0.0.join("..data")).ok();
        let tmp = self.0.0.join("..data_tmp");
        std::os::unix::fs::symlink(&ts, &tmp).unwrap();
        std::fs::rename(&tmp, self.0.0.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(self.0.0.join(old)).unwrap();
        }
    }
}

/// One played pod: the transformed manifest, its ports by name, killed
/// and removed on drop.
struct Pod {
    file: PathBuf,
    container: String,
    /// Container port name to the loopback port it took.
    ports: BTreeMap<String, u16>,
    /// The rendered container (probes, securityContext).
    spec: Value,
    grace: u64,
    /// When `podman kube play` was called.
    played_at: Instant,
    _dir: TempDir,
}

impl Pod {
    /// Plays the rendered `docs` as pod `name`, the ConfigMap volume
    /// served from `volume`; `env` values replace the container's.
    fn play(docs: &[Value], name: &str, volume: &Path, env: &[(&str, String)]) -> Pod {
        let dir = TempDir::new(name);
        // Two runs on one machine (a developer's and CI's) do not collide.
        let name = &format!("{name}-{}", std::process::id());
        let mut deployment = find(docs, "Deployment").clone();
        deployment["metadata"]["name"] = json!(name);
        deployment["spec"]["replicas"] = json!(1);
        let pod = &mut deployment["spec"]["template"]["spec"];
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
        pod["hostNetwork"] = json!(true);
        // A SIGTERM here stands for the kubelet stopping a deleted pod,
        // which it never starts again.
        pod["restartPolicy"] = json!("Never");
        for v in pod["volumes"].as_array_mut().unwrap() {
            if v.get("configMap").is_some() {
                *v = json!({"name": v["name"], "hostPath": {"path": volume, "type": "Directory"}});
            }
        }
        let c = &mut pod["containers"][0];
        let spec = c.clone();
        c["image"] = json!(image());
        // Each named port on a free loopback port, wherever its number
        // appears (flags, ratelimit's PORT variables).
        let mut ports = BTreeMap::new();
        let mut renumber = BTreeMap::new();
        for p in c["ports"].as_array().unwrap() {
            let new = free_port();
            ports.insert(p["name"].as_str().unwrap().to_string(), new);
            renumber.insert(p["containerPort"].as_u64().unwrap().to_string(), new);
        }
        c.as_object_mut().unwrap().remove("ports");
        let fix = |s: &str| -> String {
            let s = s.replace("0.0.0.0", "127.0.0.1");
            match s.rsplit_once(':') {
                Some((head, port)) if renumber.contains_key(port) => {
                    format!("{head}:{}", renumber[port])
                }
                _ => renumber.get(&s).map_or(s, |p| p.to_string()),
            }
        };
        if let Some(args) = c["args"].as_array_mut() {
            for a in args {
                *a = json!(fix(a.as_str().unwrap()));
            }
        }
        if let Some(vars) = c["env"].as_array_mut() {
            for v in vars.iter_mut() {
                if let Some(s) = v["value"].as_str() {
                    v["value"] = json!(fix(s));
                }
                if let Some((_, val)) = env.iter().find(|(k, _)| v["name"] == *k) {
                    *v = json!({"name": v["name"], "value": val});
                }
            }
        }
        let mut out: Vec<Value> = docs
            .iter()
            // Not the Secret: podman would keep it as a podman secret,
            // which a second play of the same manifest collides with (its
            // variable is given a value above).
            .filter(|d| d["kind"] == "ConfigMap")
            .cloned()
            .collect();
        out.push(deployment);
        let file = dir.0.join("play.yaml");
        let text: Vec<String> = out.iter().map(Value::to_string).collect();
        std::fs::write(&file, text.join("\n---\n")).unwrap();
        let played_at = Instant::now();
        run(podman().args(["kube", "play"]).arg(&file));
        let name0 = spec["name"].as_str().unwrap();
        Pod {
            file,
            container: format!("{name}-pod-0-{name0}"),
            ports,
            spec,
            grace,
            played_at,
            _dir: dir,
        }
    }

    fn url(&self, port: &str, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.ports[port])
    }

    /// The probe's URL, its named port resolved as the kubelet does.
    fn probe(&self, which: &str) -> String {
        let get = &self.spec[which]["httpGet"];
        let port = get["port"].as_str().expect("a named probe port");
        self.url(port, get["path"].as_str().unwrap())
    }

    /// Waits until the startup probe answers 200; the time since the
    /// play began.
    async fn started(&self) -> Duration {
        let t = self.played_at;
        let url = self.probe("startupProbe");
        let c = crate::util::client();
        while t.elapsed() < Duration::from_secs(60) {
            if c.get(&url).send().await.is_ok_and(|r| r.status() == 200) {
                return t.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "{} never answered its startup probe {url}: {}",
            self.container,
            self.logs()
        );
    }

    /// The container's log (spillway logs to stderr).
    fn logs(&self) -> String {
        let out = podman().args(["logs", &self.container]).output().unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn inspect(&self, format: &str) -> String {
        run(podman().args(["inspect", "--format", format, &self.container]))
            .trim()
            .to_string()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = podman()
            .args(["kube", "down"])
            .arg(&self.file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Removes the run's image once no test here uses it.
struct ImageUsers;
static USERS: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
impl ImageUsers {
    fn enter() -> ImageUsers {
        *USERS.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        ImageUsers
    }
}
impl Drop for ImageUsers {
    fn drop(&mut self) {
        // A failed test poisons neither: the next one goes on.
        let mut n = USERS.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        if *n == 0
            && let Some(tag) = IMAGE.lock().unwrap_or_else(|e| e.into_inner()).take()
        {
            let _ = podman().args(["rmi", "-f", &tag]).output();
        }
    }
}

async fn check(url: &str, user: &str) -> u16 {
    crate::util::client()
        .post(url)
        .json(&json!({"api": "/v1/items", "user": user}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn configmap_data(docs: &[Value]) -> BTreeMap<String, String> {
    serde_json::from_value(find(docs, "ConfigMap")["data"].clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_overlay_probes_decides_reloads_and_drains() {
    let _users = ImageUsers::enter();
    let docs = render("single");
    let data = configmap_data(&docs);
    let mut volume = KubeletVolume::new(&data);
    let pod = Pod::play(&docs, "spillway-single", &volume.0.0, &[]);
    let cold = pod.started().await;
    eprintln!("deploy: kube play to ready {cold:?}");

    // Non-root, read-only root filesystem, as the manifest says and as
    // the process runs.
    let sc = &pod.spec["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{sc}");
    assert_eq!(pod.inspect("{{.HostConfig.ReadonlyRootfs}}"), "true");
    let pid = pod.inspect("{{.State.Pid}}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid.split_whitespace().skip(1).all(|u| u == "65532"),
        "{uid}"
    );
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .unwrap();
    assert!(
        root.split(' ')
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "{root}"
    );

    // Worker threads follow the CPU limit: TOKIO_WORKER_THREADS, which
    // the runtime reads, from the Downward API's limits.cpu.
    let limit = pod.spec["resources"]["limits"]["cpu"].as_str().unwrap();
    let env = pod.inspect("{{json .Config.Env}}");
    assert!(
        env.contains(&format!("TOKIO_WORKER_THREADS={limit}")),
        "{env}"
    );

    // Every probe answers 200 on the path and port the manifest names.
    let c = crate::util::client();
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let url = pod.probe(probe);
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200, "{probe} {url}");
    }
    let metrics = c.get(pod.url("admin", "/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);

    // A decision is exact: the ConfigMap's `default` rule, 10 a minute.
    let check_url = pod.url("http", "/v1/check");
    for i in 1..=10 {
        assert_eq!(check(&check_url, "alice").await, 200, "request {i}");
    }
    assert_eq!(check(&check_url, "alice").await, 429);

    // An update delivered as the kubelet delivers it is reloaded.
    let mut changed = data.clone();
    let rules = changed.get_mut("rules.yaml").unwrap();
    *rules = rules.replace("limit: 10, window: 1m", "limit: 2, window: 1m");
    assert_ne!(rules, &data["rules.yaml"]);
    volume.update(&changed);
    let t = Instant::now();
    let mut n = 0;
    loop {
        n += 1;
        let user = format!("after-{n}");
        let codes = [
            check(&check_url, &user).await,
            check(&check_url, &user).await,
            check(&check_url, &user).await,
        ];
        if codes == [200, 200, 429] {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the kubelet-style update was not reloaded: {codes:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("deploy: ConfigMap update applied after {:?}", t.elapsed());

    // SIGTERM while a request is in flight (its body half sent):
    // readiness fails at once, the request is answered, the process exits
    // 0 within the grace.
    let mut slow = TcpStream::connect(("127.0.0.1", pod.ports["http"])).unwrap();
    let body = br#"{"api": "/v1/items", "user": "in-flight"}"#;
    write!(
        slow,
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    slow.write_all(&body[..10]).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopped_at = Instant::now();
    run(podman().args(["kill", "--signal", "TERM", &pod.container]));
    let ready = pod.probe("readinessProbe");
    // As the kubelet probes: a connection per probe, none kept open.
    drop(c);
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let t = Instant::now();
    loop {
        // The admin listener serves until the drain ends: it says 503.
        let r = c.get(&ready).send().await;
        if r.is_ok_and(|r| r.status() == 503) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "readiness still 200 after SIGTERM: {}",
            pod.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The decision port serves on for the shutdown delay: its
    // /healthcheck (envoyproxy/ratelimit's) fails too.
    let health = c.get(pod.url("http", "/healthcheck")).send().await.unwrap();
    assert_eq!(health.status(), 500, "/healthcheck after SIGTERM");
    slow.write_all(&body[10..]).unwrap();
    // Nothing more to send: the server's lingering close sees the end at
    // once, as when a client closes on `connection: close`.
    slow.shutdown(std::net::Shutdown::Write).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    let _ = slow.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "in-flight request: {answer:?}; log: {}",
        pod.logs()
    );
    let code = run(podman().args(["wait", &pod.container]));
    let took = stopped_at.elapsed();
    assert_eq!(code.trim(), "0", "exit code after SIGTERM");
    assert!(
        took < Duration::from_secs(pod.grace),
        "stopped after {took:?}, grace {}s",
        pod.grace
    );
    eprintln!("deploy: SIGTERM to exit 0 in {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_overlay_replicas_admit_exactly_the_limit_together() {
    let _users = ImageUsers::enter();
    let redis = RedisServer::start();
    let docs = render("redis");
    let volume = KubeletVolume::new(&configmap_data(&docs));
    // A host name, resolved in the image (nsswitch, /etc/hosts), as a
    // Service name would be.
    let url = format!("redis://localhost:{}/0", redis.port);
    let a = Pod::play(
        &docs,
        "spillway-a",
        &volume.0.0,
        &[("REDIS_URL", url.clone())],
    );
    let b = Pod::play(&docs, "spillway-b", &volume.0.0, &[("REDIS_URL", url)]);
    a.started().await;
    b.started().await;
    let mut admitted = 0;
    for i in 0..16 {
        let pod = if i % 2 == 0 { &a } else { &b };
        if check(&pod.url("http", "/v1/check"), "shared").await == 200 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10, "two replicas sharing Redis, limit 10");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_overlay_runs_bin_ratelimit() {
    let _users = ImageUsers::enter();
    let docs = render("envoy-gateway");
    let volume = KubeletVolume::new(&configmap_data(&docs));
    let pod = Pod::play(&docs, "spillway-eg", &volume.0.0, &[]);
    pod.started().await;
    let c = crate::util::client();
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let url = pod.probe(probe);
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200, "{probe} {url}");
    }
    // The domain file mounted at RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config,
    // asked over ratelimit's /json.
    let ask = json!({"domain": "envoy-gateway", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.1"}]}]});
    let r = c
        .post(pod.url("http", "/json"))
        .json(&ask)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["overallCode"], "OK", "{body}");
}
