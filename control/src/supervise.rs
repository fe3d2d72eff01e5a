//! Supervision by systemd (`Type=notify`, `WatchdogSec=`), through the `sd-notify` crate:
//! `READY=1` once the gateway forwards, `STOPPING=1` when it drains, and a watchdog fed
//! only while every worker makes progress, so a stalled worker (stuck in a loop, blocked
//! in the kernel) gets the process restarted by systemd. Outside systemd (no
//! `NOTIFY_SOCKET`) every call does nothing.
//!
//! A worker's progress is its heartbeat ([`CoreStats::heartbeat`]): the time
//! its loop last read the clock, once per turn, busy or idle (an idle turn sleeps at most a
//! millisecond in `poll`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::{info, warn};

use crate::cores::CoreStats;

/// Tells systemd the gateway is ready (it forwards, the VIPs are claimed).
pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells systemd the gateway is stopping (draining).
pub fn stopping(status: &str) {
    notify(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        warn!("sd_notify: {e}");
    }
}

/// The watchdog feeder: fed at half systemd's `WatchdogSec` while every worker's heartbeat
/// moved since the last feed.
#[derive(Debug)]
pub struct Watchdog {
    every: Duration,
    next: Instant,
    beats: Vec<u64>,
    /// The worker last found stalled, so that it is logged once per stall.
    stalled: Option<String>,
}

impl Watchdog {
    /// The feeder systemd asks for (`WATCHDOG_USEC` for this process), if any.
    pub fn from_env() -> Option<Self> {
        let timeout = sd_notify::watchdog_enabled()?;
        info!("systemd watchdog: {timeout:?}, fed while every worker makes progress");
        Some(Self::new(timeout))
    }

    /// A feeder for a watchdog of `timeout`.
    pub fn new(timeout: Duration) -> Self {
        let every = timeout / 2;
        Self {
            every,
            next: Instant::now() + every,
            beats: Vec::new(),
            stalled: None,
        }
    }

    /// Feeds the watchdog when due and every worker of `cores` moved; returns whether it
    /// fed it.
    pub fn tick(&mut self, cores: &[Arc<CoreStats>], now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.every;
        let beats: Vec<u64> = cores
            .iter()
            .map(|c| c.heartbeat.load(Ordering::Relaxed))
            .collect();
        let stuck = cores
            .iter()
            .zip(&beats)
            .zip(self.beats.iter().chain(std::iter::repeat(&u64::MAX)))
            .find(|((_, now), before)| now == before)
            .map(|((c, _), _)| c.name.clone());
        self.beats = beats;
        match stuck {
            Some(name) => {
                if self.stalled.as_ref() != Some(&name) {
                    warn!(worker = %name, "worker made no progress in {:?}: not feeding the watchdog", self.every);
                }
                self.stalled = Some(name);
                false
            }
            None => {
                self.stalled = None;
                notify(&[NotifyState::Watchdog]);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fed_only_while_every_worker_moves() {
        let cores: Vec<Arc<CoreStats>> = (0..2)
            .map(|i| {
                Arc::new(CoreStats {
                    name: format!("eth0/{i}"),
                    ..Default::default()
                })
            })
            .collect();
        let mut w = Watchdog::new(Duration::from_secs(2));
        let t0 = Instant::now();
        let beat = |i: usize, v: u64| cores[i].heartbeat.store(v, Ordering::Relaxed);
        beat(0, 1);
        beat(1, 1);
        assert!(!w.tick(&cores, t0), "not due yet");
        assert!(w.tick(&cores, t0 + Duration::from_secs(1)), "both moved");
        beat(0, 2);
        assert!(
            !w.tick(&cores, t0 + Duration::from_secs(2)),
            "worker 1 stalled"
        );
        assert_eq!(w.stalled.as_deref(), Some("eth0/1"));
        beat(0, 3);
        beat(1, 3);
        assert!(
            w.tick(&cores, t0 + Duration::from_secs(3)),
            "both moved again"
        );
        assert!(w.stalled.is_none());
    }
}
