//! The testbed of `strait testbed up` (namespaces `{prefix}-client`, `-gw`, `-sw`, `-bN`)
//! and a gateway (`strait run`) in its gateway namespace, each taken down on drop, also
//! when the test fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::harness::{in_ns, must, run, strait, text, Proc, Scratch, LAB};

/// The client's address on the testbed; the servers echo it (`client=192.0.2.2:PORT`).
pub const CLIENT: &str = "192.0.2.2";

/// A testbed and a scratch directory for the test's files, both removed on drop.
#[derive(Debug)]
pub struct Bed {
    /// The namespaces' prefix.
    pub prefix: String,
    /// `testbed up --json`'s summary (`config`, `backends` with `name`, `namespace`,
    /// `ipv4`, `pid`).
    pub info: Value,
    /// The scratch directory.
    pub dir: Scratch,
}

impl Bed {
    /// `strait testbed up --prefix PREFIX --json ARGS..`.
    pub fn up(prefix: &str, args: &[&str]) -> Bed {
        let mut bed = Bed::guard(prefix);
        let out = run(Command::new(LAB)
            .args(["testbed", "up", "--prefix", prefix, "--json"])
            .args(args));
        assert!(
            out.status.success(),
            "strait testbed up failed:\n{}",
            text(&out.stderr)
        );
        bed.info = serde_json::from_slice(&out.stdout).expect("testbed up --json prints JSON");
        bed
    }

    /// The guard alone: takes down testbed `prefix` on drop (after an `up` of the test's own
    /// that may have failed half-way).
    pub fn guard(prefix: &str) -> Bed {
        Bed {
            prefix: prefix.to_owned(),
            info: Value::Null,
            dir: Scratch::new(&format!("{prefix}-bed")),
        }
    }

    /// The namespace of `role` (`client`, `gw`, `b1`, ...).
    pub fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    /// Runs `args` in the namespace of `role`.
    pub fn exec(&self, role: &str, args: &[&str]) -> Output {
        run(&mut in_ns(&self.ns(role), args))
    }

    /// Runs `args` in the namespace of `role`; its stdout. Panics naming it unless it
    /// succeeds.
    pub fn must(&self, role: &str, args: &[&str]) -> String {
        must(&mut in_ns(&self.ns(role), args))
    }

    /// curl from the client (3 s at most): the body, trimmed, or curl's exit status and
    /// error.
    pub fn curl(&self, url: &str) -> Result<String, String> {
        let o = self.exec("client", &["curl", "-sS", "--max-time", "3", url]);
        if o.status.success() {
            Ok(text(&o.stdout).trim().to_owned())
        } else {
            Err(format!("{}: {}", o.status, text(&o.stderr).trim()))
        }
    }

    /// `n` requests to `url`, each on a new connection; the answers.
    pub fn requests(&self, url: &str, n: usize) -> Vec<Option<String>> {
        (0..n).map(|_| self.curl(url).ok()).collect()
    }

    /// The generated gateway configuration.
    pub fn config(&self) -> PathBuf {
        PathBuf::from(self.info["config"].as_str().expect("config path"))
    }

    /// The testbed's gateway settings (interfaces, admin address) without its services,
    /// written to `gateway.toml` in the testbed's directory: for a gateway whose every
    /// service comes from Kubernetes.
    pub fn gateway_config(&self) -> PathBuf {
        let full = std::fs::read_to_string(self.config()).expect("testbed configuration");
        let gateway = full.split("\n[[services]]").next().unwrap_or_default();
        let out = self.dir.join("gateway.toml");
        std::fs::write(&out, gateway).expect("writing the gateway configuration");
        out
    }

    /// The backends of the summary.
    pub fn backends(&self) -> &[Value] {
        self.info["backends"].as_array().expect("backends")
    }

    /// Backend `name` (`b1`, ...) of the summary.
    pub fn backend(&self, name: &str) -> &Value {
        self.backends()
            .iter()
            .find(|b| b["name"] == name)
            .unwrap_or_else(|| panic!("no backend {name}"))
    }

    /// The IPv4 address of backend `name`.
    pub fn backend_ip(&self, name: &str) -> String {
        self.backend(name)["ipv4"]
            .as_str()
            .expect("backend address")
            .to_owned()
    }

    /// The pid of backend `name`'s server.
    pub fn backend_pid(&self, name: &str) -> u32 {
        self.backend(name)["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .expect("backend pid")
    }

    /// `strait testbed serve --name NAME ARGS..` in the namespace of `role`, killed on drop.
    pub fn serve(&self, role: &str, name: &str, args: &[&str]) -> Proc {
        Proc::spawn(
            in_ns(&self.ns(role), [LAB, "testbed", "serve", "--name", name])
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let out = Command::new(LAB)
            .args(["testbed", "down", "--prefix", &self.prefix])
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "strait testbed down --prefix {}: {}",
                self.prefix,
                text(&o.stderr)
            ),
            Err(e) => eprintln!("strait testbed down --prefix {}: {e}", self.prefix),
        }
    }
}

/// The backend named in a testbed server's answer `backend=NAME client=ADDR:PORT`.
pub fn backend_of(answer: &str) -> Option<&str> {
    answer.split_whitespace().next()?.strip_prefix("backend=")
}

/// Answers per backend (by the answer's first word, `backend=` taken off); failed requests
/// are not counted.
pub fn tally(answers: &[Option<String>]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for a in answers.iter().flatten() {
        let first = a.split_whitespace().next().unwrap_or("");
        *m.entry(first.trim_start_matches("backend=").to_owned())
            .or_default() += 1;
    }
    m
}

/// Asserts that every answer shows the client's own address: the backend (`who`) saw it.
pub fn assert_client_seen(answers: &[Option<String>], who: &str) {
    for a in answers.iter().flatten() {
        assert!(
            a.contains(&format!("client={CLIENT}:")),
            "the {who} did not see the client's address: {a}"
        );
    }
}

/// A gateway (`strait run`) in a testbed's gateway namespace, its stderr in a log in the
/// testbed's scratch directory; stopped on drop (SIGTERM, SIGKILL after 10 s).
#[derive(Debug)]
pub struct Gateway {
    ns: String,
    proc: Option<Proc>,
    log: PathBuf,
}

impl Gateway {
    /// `strait run --config CONFIG` in `bed`'s gateway namespace, for [`Gateway::spawn`]
    /// (add the flags).
    pub fn command(bed: &Bed, config: &Path) -> Command {
        let mut c = in_ns(&bed.ns("gw"), [strait(), "run", "--config"]);
        c.arg(config);
        c
    }

    /// Starts `cmd` (a gateway in `bed`'s gateway namespace) and waits up to 20 s for
    /// `ready`; panics with the log when it exits or is not ready in time.
    pub fn spawn(bed: &Bed, mut cmd: Command, ready: impl Fn(&Gateway) -> bool) -> Gateway {
        let log = bed.dir.join("gateway.log");
        let stderr = std::fs::File::create(&log).expect("gateway log");
        let proc = Proc::spawn(cmd.stdout(Stdio::null()).stderr(stderr));
        let mut g = Gateway {
            ns: bed.ns("gw"),
            proc: Some(proc),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = g.running().child().try_wait().ok().flatten() {
                panic!("gateway exited ({s}):\n{}", g.log_text());
            }
            if ready(&g) {
                return g;
            }
            assert!(
                Instant::now() < deadline,
                "gateway not ready in 20 s:\n{}",
                g.log_text()
            );
            sleep(Duration::from_millis(100));
        }
    }

    fn running(&mut self) -> &mut Proc {
        self.proc.as_mut().expect("the gateway runs")
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.proc.as_ref().expect("the gateway runs").pid()
    }

    /// SIGKILL (as the OOM killer or a crash would end it), and waits until it is gone.
    pub fn kill(&mut self) {
        let mut proc = self.proc.take().expect("the gateway runs");
        proc.signal("KILL");
        let _ = proc.child().wait();
    }

    /// Waits up to `timeout` for the gateway to exit by itself; its status, if it did.
    pub fn exited_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.running().child().try_wait().ok().flatten() {
                self.proc = None;
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// Whether the admin API answers `/healthz` with `ok`.
    pub fn healthy(&self) -> bool {
        self.get("/healthz") == "ok\n"
    }

    /// What the gateway logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `METHOD path` on the admin API (127.0.0.1:9900 in the gateway namespace); the body,
    /// empty when it does not answer.
    pub fn admin(&self, method: &str, path: &str) -> String {
        let url = format!("http://127.0.0.1:9900{path}");
        let out = run(&mut in_ns(
            &self.ns,
            ["curl", "-s", "--max-time", "5", "-X", method, &url],
        ));
        text(&out.stdout)
    }

    /// `GET path` on the admin API.
    pub fn get(&self, path: &str) -> String {
        self.admin("GET", path)
    }

    /// `/services` as JSON.
    pub fn services(&self) -> Option<Value> {
        serde_json::from_str(&self.get("/services")).ok()
    }

    /// The sum of the samples of metric family `name` (with or without `_total`), if any.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let metrics = self.get("/metrics");
        let values: Vec<f64> = metrics
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                let family = l.split(['{', ' ']).next().unwrap_or("");
                family == name || family.strip_suffix("_total") == Some(name)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    /// SIGTERM, and its exit status (SIGKILL if it has not exited in 10 s).
    pub fn stop(&mut self) -> ExitStatus {
        let mut proc = self.proc.take().expect("the gateway runs");
        proc.stop(Duration::from_secs(10))
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if self.proc.is_some() {
            let _ = self.stop();
        }
    }
}
