//! What the Kubernetes source's integration tests share (`kube.rs`, `ipam.rs`): starting
//! the source against the fake API server, and waiting for what it publishes.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use strait_config::model;
use strait_control::kube;
use strait_control::kubemodel;
use strait_control::kubemodel::settings::Settings;
use strait_testkit::fake_api::FakeApi;
use strait_testkit::harness::Scratch;

/// The source against `api`, publishing into a channel.
pub fn start(
    api: &FakeApi,
    dir: &Scratch,
    st: Settings,
) -> (kube::Source, Receiver<Vec<model::Service>>) {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing::Level::INFO)
        .try_init();
    let kc = api.kubeconfig(dir.path());
    let (tx, rx) = mpsc::channel();
    let src = kube::spawn_feed(Some(&kc), st, move |p: kubemodel::Publication| {
        let _ = tx.send(p.services.iter().map(|s| (**s).clone()).collect());
    })
    .unwrap();
    (src, rx)
}

/// Receives lists until one satisfies `pred`; panics after `secs` with the last one.
pub fn until(
    rx: &Receiver<Vec<model::Service>>,
    secs: u64,
    what: &str,
    pred: impl Fn(&[model::Service]) -> bool,
) -> Vec<model::Service> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut last = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                if pred(&l) {
                    return l;
                }
                last = Some(l);
            }
            Err(RecvTimeoutError::Timeout) => {
                panic!("timed out waiting for {what}; last list: {last:#?}")
            }
            Err(RecvTimeoutError::Disconnected) => panic!("source stopped waiting for {what}"),
        }
    }
}

/// Polls `cond` every 20 ms for up to `secs`.
pub fn eventually(secs: u64, what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
