//! The worker loop: one thread per (interface, queue), driving [`Pipeline::process`] over the
//! frames of one [`Port`].
//!
//! Each turn: reap the completion ring (sent frames back to the free list), refill the fill
//! ring, read up to [`BATCH`] frames from the RX ring; for a batch, load the service-table
//! snapshot once and read the clock once, run every frame through the pipeline in place, put
//! the frames to send on the TX ring (the same UMEM frame, from its new head) and recycle the
//! rest; then kick TX if the kernel asked for it. Nothing in the loop allocates.
//!
//! Verdicts other than `Tx`: `Drop` recycles the frame (the pipeline counted the reason);
//! `Pass` cannot be honoured, because an AF_XDP frame cannot be handed back to the kernel's
//! stack, so it is recycled and counted in [`WorkerStats::pass_unsent`] (the steering program
//! redirects only gateway traffic, so this should stay near zero); `Handoff` is counted and
//! dropped until the cross-core rings exist.
//!
//! When the RX ring stays empty for [`IDLE_SPINS`] turns the worker sleeps in `poll(2)` for
//! at most [`IDLE_POLL_MS`], so an idle gateway does not burn its cores; under load it never
//! sleeps.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::socket::{Action, Port};
use super::XskError;
use crate::pipeline::{Pipeline, Verdict};
use crate::table::ServiceTable;

/// Frames read from the RX ring per turn. 64 is the kernel's NAPI budget: it amortises the
/// ring index updates, the snapshot load and the clock read over enough frames to make them
/// negligible, while one batch (about 64 × 100 ns) stays far below any timeout and keeps the
/// burst handed to TX small next to the 2048-slot rings.
pub const BATCH: u32 = 64;

/// Empty turns before the worker sleeps in `poll(2)`. About 1024 × 50 ns ≈ 50 µs of spinning:
/// long enough to not sleep between the packets of a busy link, short enough that an idle
/// worker gives its core back almost at once.
pub const IDLE_SPINS: u32 = 1024;

/// Longest sleep of an idle worker, in milliseconds: the latency the first packet after a
/// silence can pay (the socket wakes the poll as soon as a packet arrives, so normally far
/// less), and the longest a stop request waits.
pub const IDLE_POLL_MS: i32 = 1;

/// A monotonic clock in nanoseconds, read once per batch.
pub trait Clock {
    /// Nanoseconds since an arbitrary, fixed origin; never decreases.
    fn now_ns(&mut self) -> u64;
}

/// [`Clock`] over [`std::time::Instant`]: nanoseconds since the clock was made.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ns(&mut self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

impl<F: FnMut() -> u64> Clock for F {
    #[inline]
    fn now_ns(&mut self) -> u64 {
        self()
    }
}

/// What a worker did, beyond the pipeline's own [`crate::stats::Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Batches processed (turns that found frames).
    pub batches: u64,
    /// Frames read from the RX ring.
    pub rx: u64,
    /// Frames put on the TX ring.
    pub tx: u64,
    /// Frames the kernel reported sent (completion ring).
    pub completed: u64,
    /// `Verdict::Pass` frames, dropped because AF_XDP cannot give them to the kernel.
    pub pass_unsent: u64,
    /// `Verdict::Handoff` frames, dropped (no cross-core rings yet).
    pub handoff_dropped: u64,
    /// `Verdict::Tx` to a port other than this socket's, dropped.
    pub other_port: u64,
    /// Frames to send that found the TX ring full, dropped.
    pub tx_ring_full: u64,
    /// RX descriptors outside the UMEM, skipped (a kernel bug if ever non-zero).
    pub invalid_rx: u64,
    /// `sendto` kicks made because the kernel asked for them.
    pub tx_kicks: u64,
    /// `recvfrom` kicks made because the driver asked for fill-ring wakeups.
    pub fill_kicks: u64,
    /// Sleeps in `poll(2)` after [`IDLE_SPINS`] empty turns.
    pub idle_polls: u64,
}

/// Batches between two calls of the `publish` hook while busy: at 1 Mpps and 64-frame
/// batches, about every 65 ms, so `/metrics` is never more than a scrape interval behind, and
/// the hook's copy (a few hundred bytes) costs nothing per packet.
pub const PUBLISH_EVERY: u64 = 1024;

/// Flow-table buckets swept per idle turn: 64 buckets (512 ways) is well under a microsecond,
/// so an arriving packet waits at most that long, and an idle core still walks a million-flow
/// table in a few seconds.
pub const SWEEP_BUCKETS: usize = 64;

/// Runs the worker on `port` until `stop` is set, then returns its statistics.
///
/// `snapshot` is called once per batch for the current service table: `|| swap.load_full()`
/// with arc-swap, or `|| &table` for a fixed one. `clock` gives the pipeline's `now`, read once
/// per batch. The pipeline's counters stay in `pipe`; `publish` sees them (and the worker's
/// statistics) when the worker turns idle and every [`PUBLISH_EVERY`] batches, to copy them
/// where the admin API reads. While idle the worker also expires flows, [`SWEEP_BUCKETS`]
/// buckets a turn.
///
/// # Errors
/// [`XskError::Io`] when a `sendto`, `recvfrom` or `poll` on the socket fails in a way
/// retrying cannot fix; the port stays usable for inspection.
pub fn run_worker<T, S, C, P>(
    port: &mut Port,
    pipe: &mut Pipeline,
    mut snapshot: S,
    stop: &AtomicBool,
    mut clock: C,
    mut publish: P,
) -> Result<WorkerStats, XskError>
where
    T: Deref<Target = ServiceTable>,
    S: FnMut() -> T,
    C: Clock,
    P: FnMut(&Pipeline, &WorkerStats),
{
    let mut st = WorkerStats::default();
    let ingress = port.table_port();
    let mut idle = 0u32;
    while !stop.load(Ordering::Relaxed) {
        st.completed += port.reap_completions() as u64;
        port.refill();
        if port.rx_ready(BATCH) == 0 {
            st.tx_kicks += port.flush_tx()? as u64;
            st.fill_kicks += port.wake_fill()? as u64;
            idle += 1;
            if idle == 1 {
                publish(pipe, &st);
            }
            pipe.flows.sweep(clock.now_ns(), SWEEP_BUCKETS);
            if idle >= IDLE_SPINS {
                idle = 0;
                st.idle_polls += 1;
                port.wait_rx(IDLE_POLL_MS)?;
            }
            continue;
        }
        idle = 0;
        let table = snapshot();
        let now = clock.now_ns();
        let (mut pass, mut handoff, mut other) = (0u64, 0u64, 0u64);
        let b = port.rx_batch(BATCH, |frame| {
            match pipe.process(&table, now, ingress, frame) {
                Verdict::Tx { port } if port == ingress => Action::Tx,
                Verdict::Tx { .. } => {
                    other += 1;
                    Action::Recycle
                }
                Verdict::Drop(_) => Action::Recycle,
                Verdict::Pass => {
                    pass += 1;
                    Action::Recycle
                }
                Verdict::Handoff { .. } => {
                    handoff += 1;
                    Action::Recycle
                }
            }
        });
        drop(table);
        st.batches += 1;
        st.rx += b.rx as u64;
        st.tx += b.tx as u64;
        st.tx_ring_full += b.tx_full as u64;
        st.invalid_rx += b.invalid as u64;
        st.pass_unsent += pass;
        st.handoff_dropped += handoff;
        st.other_port += other;
        st.tx_kicks += port.flush_tx()? as u64;
        if st.batches % PUBLISH_EVERY == 0 {
            publish(pipe, &st);
        }
    }
    publish(pipe, &st);
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_does_not_go_back() {
        let mut c = MonotonicClock::new();
        let a = c.now_ns();
        let b = c.now_ns();
        assert!(b >= a);
        let mut fixed = || 42u64;
        assert_eq!(Clock::now_ns(&mut fixed), 42);
    }
}
