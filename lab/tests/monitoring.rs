//! The monitoring kit (`deploy/monitoring`: alert rules, their unit tests, the Grafana
//! dashboard) against real tools:
//!
//! - `promtool check rules` and `promtool test rules` (every alert fires when it should and
//!   stays silent when it should not); without promtool the test says SKIPPED, except
//!   under `CI=true`, where it fails;
//! - the dashboard's JSON is importable (inputs, schema version, panels with targets);
//! - end to end (root): a real Prometheus in the testbed's gateway namespace scrapes a real
//!   gateway every second with the rules loaded, while HTTP and UDP go through the VIP;
//!   every dashboard expression (its variables given real values) and every alert
//!   expression evaluates without error, every metric they name has series, every label
//!   they use is on those series, every label an alert's annotations print is on the
//!   series it is evaluated over, every dashboard panel has data, and the rules load with
//!   health "ok".
//!
//! ```text
//!  {p}-client: curl http://VIP/, client.py udp VIP 53       (two-arm testbed, nat)
//!  {p}-gw:     strait run --kube (the fake API server) + [gateway.bgp], then + [gateway.l2]
//!              prometheus --web.listen-address 127.0.0.1:PORT, scraping 127.0.0.1:9900
//!  test:       /api/v1/query, /api/v1/rules, /api/v1/alerts through curl in {p}-gw
//! ```
//!
//! `[gateway.bgp]` and `[gateway.l2]` exclude each other, so the gateway runs twice against
//! the same Prometheus: first with BGP (a peer that never answers: its session is down, so
//! the session family has series and the alert goes pending), then with VRRP. Each dashboard
//! panel must have data in one of the two runs; each metric must have had series
//! (`last_over_time` over the test) by the end.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::MutexGuard;
use std::thread::sleep;
use std::time::Duration;

use serde_json::Value;
use support::bed::{Bed, Gateway};
use support::e2e::{all_up, VIP};
use support::fake_api::FakeApi;
use support::harness::{
    enter_netns, free_addr, in_ns, run, serial_if, text, wait_for, Proc, Scratch, Transport,
};
use support::privileged as gate;

/// A file of the kit.
fn kit(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/monitoring")
        .join(file)
}

/// Whether `tool` answers; if not, fails under `CI=true` and says SKIPPED elsewhere.
fn have(tool: gate::Tool, test: &str) -> bool {
    let (program, probe, package) = tool;
    if Command::new(program)
        .arg(probe)
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test} needs `{program}` (apt-get install -y {package}; scripts/deps.sh installs it)"
    );
    eprintln!(
        "\n**** SKIPPED {test}: `{program}` is not installed (apt-get install -y {package}) ****\n"
    );
    false
}

#[test]
fn promtool_checks_the_rules_and_every_alert_passes_its_unit_tests() {
    if !have(gate::PROMTOOL, "the alert rules' promtool tests") {
        return;
    }
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ] {
        let out = run(Command::new("promtool").args(args).current_dir(kit("")));
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    // Every alert of the rules has a unit test.
    let tests = std::fs::read_to_string(kit("alerts_test.yml")).unwrap();
    for (name, _) in alerts() {
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "no unit test of {name} in alerts_test.yml"
        );
    }
}

// ---- the kit's expressions ---------------------------------------------------------------

/// Every alert of alerts.yml: name and expression.
fn alerts() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(kit("alerts.yml")).unwrap();
    let y: serde_yaml::Value = serde_yaml::from_str(&text).expect("alerts.yml is YAML");
    let mut out = Vec::new();
    for g in y["groups"].as_sequence().expect("groups") {
        for r in g["rules"].as_sequence().expect("rules") {
            let name = r["alert"].as_str().expect("an alert name").to_owned();
            let expr = r["expr"].as_str().expect("an expression").to_owned();
            assert!(r["for"].as_str().is_some(), "{name} has no for:");
            assert!(
                r["labels"]["severity"].as_str().is_some(),
                "{name} has no severity label"
            );
            for a in ["summary", "description"] {
                assert!(
                    r["annotations"][a].as_str().is_some(),
                    "{name} has no {a} annotation"
                );
            }
            out.push((name, expr));
        }
    }
    out
}

#[test]
fn every_alert_says_why_its_for_is_what_it_is() {
    // alerts() refuses a rule without for:, severity, summary or description.
    let names: Vec<_> = alerts().into_iter().map(|(n, _)| n).collect();
    assert!(names.len() >= 10, "{names:?}");
    let text = std::fs::read_to_string(kit("alerts.yml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut fors = 0;
    for (i, l) in lines.iter().enumerate() {
        if l.trim_start().starts_with("for:") {
            fors += 1;
            assert!(
                lines[i - 1].trim_start().starts_with('#'),
                "alerts.yml line {}: `{}` without a comment giving its reason above it",
                i + 1,
                l.trim()
            );
        }
    }
    assert_eq!(fors, names.len());
}

/// The dashboard's JSON.
fn dashboard() -> Value {
    let text = std::fs::read_to_string(kit("dashboard.json")).unwrap();
    serde_json::from_str(&text).expect("dashboard.json is JSON")
}

/// Every panel of the dashboard (rows' panels too) but the rows: title and expressions.
fn panels(d: &Value) -> Vec<(String, Vec<String>)> {
    fn walk(ps: &[Value], out: &mut Vec<(String, Vec<String>)>) {
        for p in ps {
            if p["type"] == "row" {
                walk(p["panels"].as_array().map_or(&[][..], Vec::as_slice), out);
                continue;
            }
            let exprs = p["targets"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            out.push((p["title"].as_str().unwrap_or("?").to_owned(), exprs));
        }
    }
    let mut out = Vec::new();
    walk(d["panels"].as_array().expect("panels"), &mut out);
    out
}

/// The queries of the dashboard's template variables (`label_values(...)`).
fn variable_queries(d: &Value) -> Vec<String> {
    d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter_map(|v| v["definition"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn the_dashboard_is_importable_and_every_panel_queries_prometheus() {
    let d = dashboard();
    assert!(
        d["schemaVersion"].as_u64().is_some_and(|v| v >= 30),
        "schemaVersion"
    );
    assert!(d["uid"].as_str().is_some() && d["title"].as_str().is_some());
    let inputs = d["__inputs"].as_array().expect("__inputs");
    assert!(
        inputs
            .iter()
            .any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus"),
        "no DS_PROMETHEUS datasource input: {inputs:?}"
    );
    let ps = panels(&d);
    assert!(ps.len() >= 20, "{} panels", ps.len());
    for (title, exprs) in &ps {
        assert!(!exprs.is_empty(), "panel {title} has no target");
        for e in exprs {
            assert!(
                !metric_names(e).is_empty(),
                "panel {title}: no metric in {e}"
            );
        }
    }
    // Every panel and target reads the imported datasource.
    let text = serde_json::to_string(&d["panels"]).unwrap();
    assert!(
        !text.contains("\"uid\":\"prometheus\""),
        "a hard-coded datasource"
    );
    fn datasources(v: &Value, out: &mut Vec<Value>) {
        match v {
            Value::Object(m) => {
                if let Some(ds) = m.get("datasource") {
                    out.push(ds.clone());
                }
                m.values().for_each(|v| datasources(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| datasources(v, out)),
            _ => {}
        }
    }
    let mut ds = Vec::new();
    datasources(&d["panels"], &mut ds);
    assert!(ds.len() > ps.len());
    for v in ds {
        assert_eq!(v["uid"], "${DS_PROMETHEUS}", "{v}");
    }
}

/// A PromQL expression's tokens as the checkers below read it: words (metric, label,
/// function and keyword names, numbers, durations), each with the `{...}` depth it lies at
/// and whether a `{` follows it directly, and the other characters but whitespace.
/// Strings are left out: their words are no names (backtick strings are raw, the others
/// take backslash escapes).
#[derive(Debug, PartialEq)]
enum Token<'a> {
    Word {
        text: &'a str,
        braces: usize,
        selects: bool,
    },
    Punct(u8),
}

fn tokens(expr: &str) -> Vec<Token<'_>> {
    let b = expr.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let (mut out, mut i, mut braces) = (Vec::new(), 0, 0usize);
    while i < b.len() {
        match b[i] {
            q @ (b'"' | b'\'' | b'`') => {
                i += 1;
                while i < b.len() && b[i] != q {
                    i += if b[i] == b'\\' && q != b'`' { 2 } else { 1 };
                }
                i += 1;
            }
            c if word(c) => {
                let start = i;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                out.push(Token::Word {
                    text: &expr[start..i],
                    braces,
                    selects: b.get(i) == Some(&b'{'),
                });
            }
            c if c.is_ascii_whitespace() => i += 1,
            c => {
                match c {
                    b'{' => braces += 1,
                    b'}' => braces = braces.saturating_sub(1),
                    _ => {}
                }
                out.push(Token::Punct(c));
                i += 1;
            }
        }
    }
    out
}

/// The metric names an expression selects. Every family of the gateway starts with
/// `strait_`, so the names are the words that start so outside label matchers (`{...}`)
/// and strings (a label or function never does), and Prometheus's own `up`.
fn metric_names(expr: &str) -> BTreeSet<String> {
    tokens(expr)
        .into_iter()
        .filter_map(|t| match t {
            Token::Word {
                text, braces: 0, ..
            } if text.starts_with("strait_") || text == "up" => Some(text.to_owned()),
            _ => None,
        })
        .collect()
}

/// The label names an expression uses: in matchers (`{reason!~"..."}`, not `__name__`),
/// each with the metric its selector names (`None` for a selector without one), and in
/// the lists of `by`, `without`, `on`, `ignoring`, `group_left` and `group_right` (with
/// `None`: they apply to whatever their operands hold). A label a family does not have
/// matches nothing (or, negated, everything) and groups nothing, without an error from
/// Prometheus: [`Prometheus::check_labels`] finds them.
fn label_uses(expr: &str) -> BTreeSet<(Option<String>, String)> {
    let mut uses = BTreeSet::new();
    let toks = tokens(expr);
    // The metric the selector being read names, if any; whether a grouping list is open.
    let (mut selector, mut list): (Option<&str>, bool) = (None, false);
    for (k, t) in toks.iter().enumerate() {
        let next = toks.get(k + 1);
        match *t {
            Token::Word {
                text,
                braces: 0,
                selects,
            } => {
                if selects {
                    selector = Some(text);
                } else if list {
                    uses.insert((None, text.to_owned()));
                }
                list |= matches!(
                    text,
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) && next == Some(&Token::Punct(b'('));
            }
            Token::Word { text, .. } => {
                let matcher = matches!(next, Some(Token::Punct(b'=' | b'!')));
                if matcher && text != "__name__" {
                    uses.insert((selector.map(str::to_owned), text.to_owned()));
                }
            }
            Token::Punct(b')') => list = false,
            Token::Punct(b'}') => selector = None,
            Token::Punct(_) => {}
        }
    }
    uses
}

/// The label names of [`label_uses`].
fn label_names(expr: &str) -> BTreeSet<String> {
    label_uses(expr).into_iter().map(|(_, l)| l).collect()
}

/// The labels an alert's annotations print (`{{ $labels.peer }}`), by alert name.
fn annotation_labels() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(kit("alerts.yml")).unwrap();
    let y: serde_yaml::Value = serde_yaml::from_str(&text).expect("alerts.yml is YAML");
    let mut out = BTreeMap::new();
    for g in y["groups"].as_sequence().expect("groups") {
        for r in g["rules"].as_sequence().expect("rules") {
            let mut labels = BTreeSet::new();
            for (_, a) in r["annotations"].as_mapping().expect("annotations") {
                for part in a.as_str().unwrap_or("").split("$labels.").skip(1) {
                    let l: String = part
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    labels.insert(l);
                }
            }
            out.insert(r["alert"].as_str().expect("alert").to_owned(), labels);
        }
    }
    out
}

/// An alert's expression without its final comparison with a number (`... > 10`): the
/// series the alert is evaluated over, whatever their values now.
fn without_threshold(expr: &str) -> Option<&str> {
    let e = expr.trim_end();
    let number = e.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    if number.len() == e.len() {
        return None;
    }
    let rest = number.trim_end();
    ["==", "!=", ">=", "<=", ">", "<"]
        .iter()
        .find_map(|op| rest.strip_suffix(op))
        .map(str::trim_end)
}

/// `expr` with the dashboard's variables given `values` (name without `$` to value);
/// an error naming a variable left without one.
fn substitute(expr: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = expr.to_owned();
    // Longest names first, so `$__rate_interval` is not taken for a `$__rate`.
    let mut names: Vec<_> = values.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        out = out
            .replace(&format!("${{{n}}}"), &values[n])
            .replace(&format!("${n}"), &values[n]);
    }
    match out.find('$') {
        Some(i) => Err(format!(
            "`{expr}`: variable {} has no value",
            out[i..]
                .split(|c: char| !(c == '$' || c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("")
        )),
        None => Ok(out),
    }
}

/// The metrics `expr` names that are not among `present` (the names Prometheus has
/// series of): a misspelt or missing family.
fn missing_metrics(expr: &str, present: &BTreeSet<String>) -> Vec<String> {
    metric_names(expr)
        .into_iter()
        .filter(|n| !present.contains(n))
        .collect()
}

#[test]
fn the_checker_finds_metric_names_and_a_misspelt_one() {
    assert_eq!(
        metric_names(
            r#"sum by (service, direction) (rate(strait_service_packets_total{instance=~"$instance",service=~"strait_x"}[5m])) / on (instance) group_left strait_flow_table_capacity"#
        ),
        ["strait_flow_table_capacity", "strait_service_packets_total"]
            .map(str::to_owned)
            .into()
    );
    assert_eq!(
        metric_names(r#"up{job="strait"} == 0 unless on (instance) group_left strait_draining"#),
        ["strait_draining", "up"].map(str::to_owned).into()
    );
    let present: BTreeSet<String> = ["strait_rx_packets_total", "strait_tx_packets_total"]
        .map(str::to_owned)
        .into();
    assert!(missing_metrics("rate(strait_rx_packets_total[1m])", &present).is_empty());
    assert_eq!(
        missing_metrics(
            "rate(strait_rx_packet_total[1m]) + strait_tx_packets_total",
            &present
        ),
        ["strait_rx_packet_total"]
    );
    let vars: BTreeMap<String, String> = [("instance", "gw"), ("__rate_interval", "15s")]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
    assert_eq!(
        substitute(r#"rate(x{instance=~"$instance"}[$__rate_interval])"#, &vars).unwrap(),
        r#"rate(x{instance=~"gw"}[15s])"#
    );
    assert!(substitute(r#"x{service=~"$service"}"#, &vars)
        .unwrap_err()
        .contains("$service"));
    // The kit's own expressions all name metrics the checker can see.
    for (name, expr) in alerts() {
        assert!(!metric_names(&expr).is_empty(), "{name}: {expr}");
    }
}

#[test]
fn the_checker_finds_the_labels_an_expression_uses() {
    assert_eq!(
        label_names(
            r#"sum by (job, instance, reason) (rate(strait_dropped_packets_total{reason!~"a|b", core = "x"}[5m])) / on (instance) group_left (service) strait_y{__name__="z"} > 10"#
        ),
        ["core", "instance", "job", "reason", "service"]
            .map(str::to_owned)
            .into()
    );
    // A function's arguments and a string's words are not labels, nor a raw string's
    // backslash an escape.
    assert!(label_names(r#"rate(strait_x{service=~"by (peer)"}[5m])"#)
        .into_iter()
        .eq(["service".to_owned()]));
    assert!(label_names(r#"strait_x{a=~`\d`, b="y"}"#)
        .into_iter()
        .eq(["a".to_owned(), "b".to_owned()]));
    // A matcher belongs to its own selector's metric; a list to every operand.
    let uses = label_uses(
        r#"strait_rx_packets_total{reason="x"} + on (core) strait_dropped_packets_total"#,
    );
    let owned = |m: Option<&str>, l: &str| (m.map(str::to_owned), l.to_owned());
    assert_eq!(
        uses,
        [
            owned(Some("strait_rx_packets_total"), "reason"),
            owned(None, "core")
        ]
        .into()
    );
    assert_eq!(
        without_threshold("max by (peer) (strait_bgp_session_up) == 0"),
        Some("max by (peer) (strait_bgp_session_up)")
    );
    assert_eq!(
        without_threshold("sum(\n  rate(x[5m])\n) > 10.5\n"),
        Some("sum(\n  rate(x[5m])\n)")
    );
    assert_eq!(without_threshold("x > y"), None);
    // Every alert of the kit has its threshold at the end and prints labels it can have.
    let printed = annotation_labels();
    for (name, expr) in alerts() {
        assert!(without_threshold(&expr).is_some(), "{name}: {expr}");
        assert!(printed[&name].contains("instance"), "{name}");
    }
}

// ---- end to end ----------------------------------------------------------------------------

/// Root and the tools this test drives.
fn privileged() -> bool {
    gate::privileged(
        "monitoring end-to-end",
        &[
            gate::IP,
            gate::CURL,
            gate::PYTHON,
            gate::BIRD,
            gate::KEEPALIVED,
            gate::PROMETHEUS,
        ],
    )
}

/// A Prometheus in a namespace, scraping the gateway's admin listener there every second
/// with the kit's rules; killed by pid on drop, its data directory removed.
struct Prometheus {
    ns: String,
    port: u16,
    proc: Proc,
    dir: Scratch,
}

impl Prometheus {
    /// Starts one in namespace `ns` on a free port of its loopback; waits until it is ready.
    fn start(ns: &str) -> Prometheus {
        let dir = Scratch::new(&format!("{ns}-prometheus"));
        let port = {
            let ns = ns.to_owned();
            std::thread::spawn(move || {
                enter_netns(&ns);
                free_addr(Transport::Tcp).port()
            })
            .join()
            .unwrap()
        };
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: strait\n    static_configs:\n      - targets: ['127.0.0.1:9900']\n",
                kit("alerts.yml").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let proc = Proc::spawn(
            in_ns(ns, ["prometheus"])
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(log),
        );
        let p = Prometheus {
            ns: ns.to_owned(),
            port,
            proc,
            dir,
        };
        wait_for("prometheus ready", Duration::from_secs(30), || {
            (p.get("/-/ready", &[]).contains("Ready")).then_some(())
        });
        p
    }

    /// `GET path` with the query parameters `params` (URL-encoded by curl): the body.
    fn get(&self, path: &str, params: &[(&str, &str)]) -> String {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let mut args = vec![
            "curl".to_owned(),
            "-sS".into(),
            "--max-time".into(),
            "10".into(),
            "-G".into(),
            url,
        ];
        for (k, v) in params {
            args.push("--data-urlencode".into());
            args.push(format!("{k}={v}"));
        }
        text(&run(&mut in_ns(&self.ns, args)).stdout)
    }

    /// The series `expr` evaluates to now, or Prometheus's error.
    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let body = self.get("/api/v1/query", &[("query", expr)]);
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!("{}: {}", v["errorType"], v["error"]));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// The metric names, of `names`, that had series at some time in the last hour.
    fn present(&self, names: &BTreeSet<String>) -> BTreeSet<String> {
        names
            .iter()
            .filter(|n| {
                self.query(&format!("count(last_over_time({{__name__=\"{n}\"}}[1h]))"))
                    .is_ok_and(|r| !r.is_empty())
            })
            .cloned()
            .collect()
    }

    /// What is wrong with `expr` here: Prometheus refuses it, or a metric it names never
    /// had series. `Ok` with its series count otherwise.
    fn check(&self, expr: &str) -> Result<usize, String> {
        let n = self
            .query(expr)
            .map_err(|e| format!("`{expr}`: {e}"))?
            .len();
        let missing = missing_metrics(expr, &self.present(&metric_names(expr)));
        if missing.is_empty() {
            Ok(n)
        } else {
            Err(format!("`{expr}`: no series of {}", missing.join(", ")))
        }
    }

    /// What is wrong with the labels `expr` uses: one that no series of the metric its
    /// selector names (or, for a grouping list or a selector without a name, of any metric
    /// the expression names) ever had. A misspelt or missing label matches nothing, or
    /// negated everything, and groups nothing, without an error.
    fn check_labels(&self, expr: &str) -> Result<(), String> {
        let all: Vec<String> = metric_names(expr).into_iter().collect();
        let mut missing = Vec::new();
        for (metric, l) in label_uses(expr) {
            let names = match metric {
                Some(m) => vec![m],
                None if all.is_empty() => continue,
                None => all.clone(),
            };
            let q = format!(
                "count(last_over_time({{__name__=~\"{}\",{l}!=\"\"}}[1h]))",
                names.join("|")
            );
            if !self.query(&q).is_ok_and(|r| !r.is_empty()) {
                missing.push(format!("{l} (on {})", names.join(", ")));
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "`{expr}`: no series has label {}",
                missing.join("; ")
            ))
        }
    }

    /// Its log, for failure messages.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.proc.stop(Duration::from_secs(5));
    }
}

/// Labels the alerts print that their series lack now, for every alert with series now
/// (added to `seen`): an annotation naming a label its expression does not keep prints an
/// empty value when the alert fires.
fn annotation_problems(
    prom: &Prometheus,
    printed: &BTreeMap<String, BTreeSet<String>>,
    seen: &mut BTreeSet<String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, expr) in alerts() {
        let inner = without_threshold(&expr).expect("a threshold");
        let series = prom.query(inner).unwrap_or_default();
        if !series.is_empty() {
            seen.insert(name.clone());
        }
        for s in &series {
            for l in &printed[&name] {
                if s["metric"][l].as_str().is_none_or(str::is_empty) {
                    problems.push(format!(
                        "{name} prints $labels.{l}, which its series lack: {}",
                        s["metric"]
                    ));
                }
            }
        }
    }
    problems
}

/// A `label_values(SELECTOR, LABEL)` variable query as an expression and the label.
fn label_values(q: &str) -> Option<(&str, &str)> {
    let inner = q.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim(), label.trim()))
}

/// The testbed's configuration with `extra` (TOML tables) added, written to `name`.
fn config_with(bed: &Bed, name: &str, extra: &str) -> PathBuf {
    let base = std::fs::read_to_string(bed.config()).expect("testbed configuration");
    let path = bed.dir.join(name);
    std::fs::write(&path, format!("{base}\n{extra}")).unwrap();
    path
}

/// `strait run --config CONFIG --kube` (the fake API server) in the gateway namespace,
/// ready when healthy with every backend up.
fn gateway(bed: &Bed, fake: &FakeApi, config: &Path) -> Gateway {
    let mut cmd = Gateway::command(bed, config);
    cmd.args(["--kube", "--kubeconfig"])
        .arg(fake.kubeconfig(bed.dir.path()))
        .args(["--kube-mode", "nat", "--kube-pool", "203.0.113.64/28"]);
    Gateway::spawn(bed, cmd, |g| {
        g.healthy() && g.services().is_some_and(|v| all_up(&v))
    })
}

/// HTTP requests and UDP datagrams through the VIP, every one answered.
fn traffic(bed: &Bed) {
    let answers = bed.vip_requests(30);
    let failed = answers.iter().filter(|a| a.is_none()).count();
    assert_eq!(failed, 0, "{failed} of 30 HTTP requests failed");
    let out = run(&mut bed.python(&["udp", VIP, "53", "30000", "200"]));
    let report = text(&out.stdout);
    assert!(
        report.contains("sent=200 answered=200"),
        "UDP through the VIP: {report}{}",
        text(&out.stderr)
    );
}

/// Each dashboard expression (its variables given `vars`) evaluated: its series count.
/// Panics when Prometheus refuses one.
fn evaluate_dashboard(
    prom: &Prometheus,
    d: &Value,
    vars: &BTreeMap<String, String>,
) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (title, exprs) in panels(d) {
        for e in exprs {
            let q = substitute(&e, vars).unwrap_or_else(|e| panic!("panel {title}: {e}"));
            let n = prom
                .query(&q)
                .unwrap_or_else(|err| panic!("panel {title}: `{q}`: {err}"));
            out.insert(format!("{title}: {q}"), n.len());
        }
    }
    out
}

/// Waits until Prometheus has scraped the gateway for `seconds` more seconds.
fn scrapes(prom: &Prometheus, seconds: u64) {
    wait_for("the gateway scraped", Duration::from_secs(30), || {
        let up = prom.query("up{job=\"strait\"} == 1").ok()?;
        (!up.is_empty()).then_some(())
    });
    sleep(Duration::from_secs(seconds));
}

/// Every rule loaded, with health "ok"; each alert's state.
fn rules(prom: &Prometheus) -> BTreeMap<String, String> {
    let v: Value = serde_json::from_str(&prom.get("/api/v1/rules", &[])).expect("rules JSON");
    let mut out = BTreeMap::new();
    for g in v["data"]["groups"].as_array().expect("groups") {
        for r in g["rules"].as_array().expect("rules") {
            let name = r["name"].as_str().unwrap_or("?").to_owned();
            assert_eq!(r["health"], "ok", "rule {name}: {r}");
            out.insert(name, r["state"].as_str().unwrap_or("?").to_owned());
        }
    }
    out
}

/// Values for the dashboard's variables as Grafana would offer them: each variable's
/// `label_values(EXPR, LABEL)` asked of Prometheus (as `group by (LABEL) (EXPR)`, the
/// variables before it substituted), its first value taken; and the interval variables.
fn variable_values(prom: &Prometheus, d: &Value) -> BTreeMap<String, String> {
    let mut vars: BTreeMap<String, String> = [
        ("__rate_interval".to_owned(), "15s".to_owned()),
        ("__interval".to_owned(), "1s".to_owned()),
    ]
    .into();
    for v in d["templating"]["list"].as_array().expect("templating.list") {
        let name = v["name"].as_str().expect("a variable name").to_owned();
        let def = v["definition"].as_str().expect("a variable query");
        let inner = def
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {name}: not label_values(..): {def}"));
        let (expr, label) = inner.rsplit_once(',').expect("label_values(EXPR, LABEL)");
        let expr =
            substitute(expr.trim(), &vars).unwrap_or_else(|e| panic!("variable {name}: {e}"));
        let label = label.trim();
        let q = format!("group by ({label}) ({expr})");
        let mut values: Vec<String> = prom
            .query(&q)
            .unwrap_or_else(|e| panic!("variable {name}: `{q}`: {e}"))
            .iter()
            .filter_map(|r| r["metric"][label].as_str().map(str::to_owned))
            .collect();
        values.sort();
        let first = values
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("variable {name}: `{q}` has no values"));
        vars.insert(name, first);
    }
    vars
}

/// What the end-to-end test holds, dropped in this order: Prometheus, the fake API
/// server, the testbed, then the serial lock.
struct World {
    prom: Prometheus,
    fake: FakeApi,
    bed: Bed,
    _serial: MutexGuard<'static, ()>,
}

#[test]
fn prometheus_scrapes_a_gateway_under_traffic_and_every_panel_and_alert_has_data() {
    let Some(serial) = serial_if(privileged) else {
        return;
    };
    let prefix = format!("sm{}", std::process::id() % 100_000);
    let bed = Bed::up(&prefix, &["--topology", "two-arm", "--backends", "2"]);
    let fake = FakeApi::start_in_netns(&bed.ns("gw"));
    let prom = Prometheus::start(&bed.ns("gw"));
    let w = World {
        prom,
        fake,
        bed,
        _serial: serial,
    };
    let (bed, prom) = (&w.bed, &w.prom);
    let d = dashboard();
    let alerts = alerts();
    let printed = annotation_labels();
    let mut seen = BTreeSet::new();

    // 1. BGP, to a peer on the client segment that never answers: the session stays down.
    let bgp = config_with(
        bed,
        "bgp.toml",
        "[gateway.bgp]\nasn = 64512\nrouter_id = \"192.0.2.1\"\n\n\
         [[gateway.bgp.peers]]\naddress = \"192.0.2.254\"\nasn = 64513\n",
    );
    let gw = gateway(bed, &w.fake, &bgp);
    scrapes(prom, 2);
    traffic(bed);
    scrapes(prom, 4);
    let vars = variable_values(prom, &d);
    assert_eq!(vars["instance"], "127.0.0.1:9900", "{vars:?}");
    let first = evaluate_dashboard(prom, &d, &vars);
    // The families the alerts read say what the live gateway is: workers turning, the
    // cluster's view current, both backends of each service serving.
    for healthy in [
        "max(strait_worker_heartbeat_age_seconds) < 3",
        "strait_kube_stale_seconds == 0",
        "min(strait_service_serving_backends{service=~\"web|echo\"}) == 2",
        "strait_backends_without_next_hop == 0",
        "sum(strait_umem_misplaced_frames) == 0",
    ] {
        let r = prom.query(healthy).unwrap();
        assert!(!r.is_empty(), "not so on the live gateway: {healthy}");
    }
    let states = rules(prom);
    assert_eq!(states.len(), alerts.len(), "{states:?}");
    // The rules run over the real series: the dead session's alert is pending.
    assert_eq!(
        states.get("StraitBgpSessionDown").map(String::as_str),
        Some("pending"),
        "{states:?}\n{}",
        prom.log()
    );
    let mut problems = annotation_problems(prom, &printed, &mut seen);
    drop(gw);

    // 2. VRRP instead (the gateway alone on its segment owns every VIP).
    let l2 = config_with(
        bed,
        "l2.toml",
        "[gateway.l2]\nname = \"gw1\"\nmembers = [\"gw1\"]\n",
    );
    let gw = gateway(bed, &w.fake, &l2);
    scrapes(prom, 2);
    traffic(bed);
    scrapes(prom, 4);
    let second = evaluate_dashboard(prom, &d, &vars);
    rules(prom);
    problems.extend(annotation_problems(prom, &printed, &mut seen));
    let unseen: Vec<_> = printed.keys().filter(|a| !seen.contains(*a)).collect();
    assert!(
        unseen.is_empty(),
        "alerts without series in either run, their labels unchecked: {unseen:?}"
    );
    // Alone on its segment, the gateway took every VIP once.
    let r = prom
        .query("strait_vrrp_owner == 1 and strait_vrrp_owner_changes_total == 1")
        .unwrap();
    assert!(
        !r.is_empty(),
        "VRRP ownership not taken, or taken more than once"
    );

    // Every panel had data in one of the runs.
    let empty: Vec<_> = first
        .iter()
        .filter(|(q, n)| **n == 0 && second.get(*q) == Some(&0))
        .map(|(q, _)| q.clone())
        .collect();
    assert!(
        empty.is_empty(),
        "panels without data:\n{}",
        empty.join("\n")
    );

    // Every expression, the alerts' and the variables' too, evaluates, every metric it
    // names had series, and every label it uses is one of theirs.
    let exprs = panels(&d)
        .into_iter()
        .flat_map(|(_, e)| e)
        .map(|e| substitute(&e, &vars).unwrap())
        .chain(alerts.iter().map(|(_, e)| e.clone()));
    for e in exprs {
        if let Err(p) = prom.check(&e).and_then(|_| prom.check_labels(&e)) {
            problems.push(p);
        }
    }
    for q in variable_queries(&d) {
        let names = metric_names(&q);
        let missing: Vec<_> = names.difference(&prom.present(&names)).cloned().collect();
        if !missing.is_empty() {
            problems.push(format!(
                "variable `{q}`: no series of {}",
                missing.join(", ")
            ));
        }
        let (selector, label) = label_values(&q)
            .unwrap_or_else(|| panic!("variable query `{q}` is not label_values(SELECTOR, LABEL)"));
        let selector = substitute(selector, &vars).unwrap();
        if let Err(p) = prom.check_labels(&format!("sum by ({label}) ({selector})")) {
            problems.push(format!("variable `{q}`: {p}"));
        }
    }
    assert!(
        problems.is_empty(),
        "{}\n(metrics of the gateway: {})",
        problems.join("\n"),
        gw.get("/metrics")
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // And the checker refuses a panel over a misspelt metric, or with a misspelt label.
    let misspelt = "sum(rate(strait_rx_packet_total[15s]))";
    let err = prom.check(misspelt).unwrap_err();
    assert!(err.contains("strait_rx_packet_total"), "{err}");
    assert!(prom
        .check("sum(rate(strait_rx_packets_total[15s]))")
        .is_ok());
    for misspelt in [
        r#"sum(rate(strait_dropped_packets_total{reasn!~"other_host"}[5m]))"#,
        "sum by (instance, reasn) (rate(strait_dropped_packets_total[5m]))",
    ] {
        let err = prom.check_labels(misspelt).unwrap_err();
        assert!(err.contains("has label reasn"), "{err}");
    }
    // A label on another operand's family is not this selector's.
    let err = prom
        .check_labels(
            r#"strait_rx_packets_total{reason="x"} + on (core) strait_dropped_packets_total"#,
        )
        .unwrap_err();
    assert!(err.contains("reason (on strait_rx_packets_total)"), "{err}");
    prom.check_labels(r#"sum by (instance, reason) (rate(strait_dropped_packets_total{reason!~"other_host"}[5m]))"#)
        .unwrap();
    drop(gw);
}
