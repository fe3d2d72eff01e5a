//! The worker loop: one thread per queue group (queue `q` of every interface, see
//! [`QueueGroup`]), driving [`Pipeline::process_batch`] over the frames of its sockets.
//!
//! Each turn: reap the completion rings (sent frames back to the free list), refill the fill
//! rings; if a socket or an inbound handoff ring has frames, load the service-table snapshot
//! once and read the clock once, then, per socket, read up to [`BATCH`] frames from its RX
//! ring and run them as one batch, and finally drain up to [`BATCH`] frames handed over by
//! other workers and run those; then one turn of flow sync (`Pipeline::sync_turn`: a bounded
//! number of records learnt from peer gateways, a bounded slice of a dump walk; also on idle
//! turns when it has work); then kick TX where the kernel asked for it. Nothing in the loop
//! allocates.
//!
//! A batch: the held frames are lent to the pipeline as [`Frame`]s in a stack array (each over
//! its own UMEM chunk; the group checks that no frame is lent twice, so they are disjoint), [`Pipeline::process_batch`]
//! decides all of them (prefetching the flow table for the whole batch), and the verdicts are
//! applied once the frames are returned:
//!
//! - `Tx { port }`: onto the TX ring of the group's socket for `port`, the same UMEM frame
//!   from its new head, whichever socket received it (the UMEM is shared); a port the group
//!   has no socket for is counted in [`WorkerStats::other_port`] and dropped.
//! - `Drop`: recycled (the pipeline counted the reason).
//! - `Pass`: cannot be honoured, because an AF_XDP frame cannot be handed back to the kernel's
//!   stack, so it is recycled and counted in [`WorkerStats::pass_unsent`] (the steering
//!   program redirects only gateway traffic, so this should stay near zero).
//! - `Handoff { core }`: copied into the ring to that worker ([`Handoff`]) and recycled. The
//!   owner copies it into a free frame of its own UMEM and runs its pipeline on it, with the
//!   ingress port it arrived on; it goes out on the owner's sockets.
//!
//! Counting across cores: the pipeline's identity `rx == tx + pass + handoff + drops` holds per
//! core. A handed-over frame is counted twice, once as `handoff` by the core that received it
//! from the NIC and once as `rx` (and its outcome) by the owner; summing `rx` over cores
//! therefore counts it twice, and `rx - handoff` summed over cores is the number of frames
//! that came from the NICs. A frame lost between the two (ring full, no free frame at the
//! owner) is in the sender's `handoff` and in a [`WorkerStats`] drop counter, never in the
//! owner's `rx`.
//!
//! Between batches, at most every [`BOOKS_EVERY_NS`], the worker copies where its UMEM's frames
//! are ([`QueueGroup::accounting`]) into [`WorkerStats::umem`], for `/metrics`: the books cost
//! a walk of the frames' owners ten times a second, nothing per packet.
//!
//! When the RX ring stays empty for [`IDLE_SPINS`] turns the worker sleeps in `poll(2)` for
//! at most [`IDLE_POLL_MS`], so an idle gateway does not burn its cores; under load it never
//! sleeps.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::group::Accounting;
use super::group::QueueGroup;
use super::handoff::{Handoff, HandoffError};
use super::umem::Held;
use super::XskError;
use crate::pipeline::{Pipeline, Verdict};
use crate::rewrite::Frame;
use crate::table::ServiceTable;

/// Frames read from one RX ring per turn, and the most handed-over frames drained per turn.
/// 64 is the kernel's NAPI budget: it amortises the ring index updates, the snapshot load and
/// the clock read over enough frames to make them negligible, while one batch (about 64 × 100
/// ns) stays far below any timeout and keeps the burst handed to TX small next to the
/// 2048-slot rings. [`Pipeline::process_batch`] works through it in chunks of
/// [`crate::pipeline::BATCH`].
pub const BATCH: u32 = 64;

/// [`BATCH`] as an array length.
const B: usize = BATCH as usize;

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
    /// Batches processed (RX batches of a socket, and batches of handed-over frames).
    pub batches: u64,
    /// Frames read from the RX rings.
    pub rx: u64,
    /// Frames put on the TX rings.
    pub tx: u64,
    /// Frames the kernel reported sent (completion rings).
    pub completed: u64,
    /// `Verdict::Pass` frames, dropped because AF_XDP cannot give them to the kernel.
    pub pass_unsent: u64,
    /// `Verdict::Tx` to a port the group has no socket for, dropped.
    pub other_port: u64,
    /// Frames to send that found the TX ring full, dropped.
    pub tx_ring_full: u64,
    /// RX descriptors outside the UMEM, or naming a frame not on a fill ring, skipped (a
    /// kernel bug if ever non-zero).
    pub invalid_rx: u64,
    /// `sendto` kicks made because the kernel asked for them.
    pub tx_kicks: u64,
    /// `recvfrom` kicks made because the driver asked for fill-ring wakeups.
    pub fill_kicks: u64,
    /// Sleeps in `poll(2)` after [`IDLE_SPINS`] empty turns.
    pub idle_polls: u64,
    /// Frames handed over to their owner worker.
    pub handed_out: u64,
    /// `Verdict::Handoff` frames dropped because the ring to the owner was full.
    pub handoff_full: u64,
    /// `Verdict::Handoff` frames dropped because they are longer than a ring slot.
    pub handoff_too_big: u64,
    /// `Verdict::Handoff` frames dropped because there is no ring to the owner (the pipeline
    /// counts more cores than the mesh has workers: a configuration bug).
    pub handoff_no_ring: u64,
    /// Frames taken from the inbound handoff rings.
    pub handed_in: u64,
    /// Handed-in frames dropped because the UMEM had no free frame to copy them into.
    pub handoff_no_frame: u64,
    /// Handed-in frames the pipeline wanted to hand off again (dropped rather than bounced:
    /// the mesh and the pipelines disagree on core numbers).
    pub handoff_loop: u64,
    /// Where the UMEM's frames were at the latest look ([`QueueGroup::accounting`], taken
    /// between batches at most every [`BOOKS_EVERY_NS`], and when the worker stops).
    pub umem: Accounting,
    /// Time in turns that found frames (RX or handed in), start of the turn to its TX kick.
    pub busy: crate::stats::BusyTime,
}

/// Batches between two calls of the `publish` hook while busy: at 1 Mpps and 64-frame
/// batches, about every 65 ms, so `/metrics` is never more than a scrape interval behind, and
/// the hook's copy (a few hundred bytes) costs nothing per packet.
pub const PUBLISH_EVERY: u64 = 1024;

/// Flow-table buckets swept per idle turn: 64 buckets (512 ways) is well under a microsecond,
/// so an arriving packet waits at most that long, and an idle core still walks a million-flow
/// table in a few seconds.
pub const SWEEP_BUCKETS: usize = 64;

/// Least time between two looks at the UMEM's books ([`WorkerStats::umem`]), in nanoseconds.
/// A look walks the owner of every frame (8,192 bytes for two sockets, a few microseconds):
/// at most ten a second it costs under 0.01 % of the core and nothing per packet, and a
/// scrape every few seconds still sees fresh books.
pub const BOOKS_EVERY_NS: u64 = 100_000_000;

/// Runs the worker on `group` until `stop` is set, then returns its statistics.
///
/// `handoff` holds this worker's ends of the handoff mesh ([`Handoff::mesh`]; its core must
/// be `pipe`'s core, and the mesh as large as `pipe`'s core count), or [`Handoff::none`] for a
/// lone worker. `snapshot` is called once per turn with frames for the current service table:
/// `|| swap.load_full()` with arc-swap, or `|| &table` for a fixed one. `clock` gives the
/// pipeline's `now`, read once per such turn, and times the turns that found work
/// ([`WorkerStats::busy`], read at a turn's start and after its TX kick). The pipeline's
/// counters stay in `pipe`; `publish` sees them (and the worker's statistics) when the
/// worker turns idle, every [`PUBLISH_EVERY`] batches and, while idle, with each look at the
/// UMEM's books, to copy them where the admin API reads. While idle the worker also expires
/// flows, [`SWEEP_BUCKETS`] buckets a turn.
///
/// An idle worker sleeps in `poll(2)` on its sockets, so a frame handed to it then waits up to
/// [`IDLE_POLL_MS`].
///
/// # Errors
/// [`XskError::Io`] when a `sendto`, `recvfrom` or `poll` on a socket fails in a way
/// retrying cannot fix; the group stays usable for inspection.
pub fn run_worker<T, S, C, P>(
    group: &mut QueueGroup,
    pipe: &mut Pipeline,
    handoff: &mut Handoff,
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
    let mut st = WorkerStats {
        umem: group.accounting(),
        ..WorkerStats::default()
    };
    let mut books_at = clock.now_ns();
    let mut held = [Held::default(); B];
    let mut idle = 0u32;
    let sockets = group.ports().len();
    while !stop.load(Ordering::Relaxed) {
        let turn = clock.now_ns();
        st.completed += group.reap_completions() as u64;
        group.refill();
        if !group.rx_ready() && !handoff.is_ready() {
            st.tx_kicks += group.flush_tx()? as u64;
            st.fill_kicks += group.wake_fill()? as u64;
            idle += 1;
            let now = clock.now_ns();
            // Idle turns also keep the books fresh, so that a gateway at rest shows where
            // its frames are at rest.
            let looked = look_at_books(group, &mut st, &mut books_at, now);
            if idle == 1 || looked {
                publish(pipe, &st);
            }
            pipe.flows.sweep(now, SWEEP_BUCKETS);
            if pipe.sync_pending() {
                // Flows learnt from the peers, or a dump to walk: not idle.
                let table = snapshot();
                if pipe.sync_turn(&table, clock.now_ns()) > 0 {
                    idle = 0;
                }
            }
            if idle >= IDLE_SPINS {
                idle = 0;
                st.idle_polls += 1;
                group.wait_rx(IDLE_POLL_MS)?;
            }
            continue;
        }
        idle = 0;
        let table = snapshot();
        let now = clock.now_ns();
        let batches = st.batches;
        for s in 0..sockets {
            let (n, invalid) = group.read_rx(s, &mut held);
            st.invalid_rx += invalid as u64;
            if n > 0 {
                st.rx += n as u64;
                run_batch(
                    group,
                    pipe,
                    handoff,
                    &table,
                    now,
                    &mut held[..n],
                    false,
                    &mut st,
                );
            }
        }
        let (mut n, mut no_frame) = (0, 0u64);
        let drained = handoff.drain(B, |ingress, packet| match group.copy_in(ingress, packet) {
            Some(h) => {
                held[n] = h;
                n += 1;
            }
            None => no_frame += 1,
        });
        st.handed_in += drained as u64;
        st.handoff_no_frame += no_frame;
        if n > 0 {
            run_batch(
                group,
                pipe,
                handoff,
                &table,
                now,
                &mut held[..n],
                true,
                &mut st,
            );
        }
        pipe.sync_turn(&table, now);
        drop(table);
        st.tx_kicks += group.drain_tx()? as u64;
        st.busy.turn(turn, clock.now_ns());
        if st.batches / PUBLISH_EVERY != batches / PUBLISH_EVERY {
            let _ = look_at_books(group, &mut st, &mut books_at, now);
            publish(pipe, &st);
        }
    }
    st.umem = group.accounting();
    publish(pipe, &st);
    Ok(st)
}

/// Copies the UMEM's books into `st` if [`BOOKS_EVERY_NS`] passed since the last look;
/// whether it did. Called between batches, when the worker holds no frame.
#[inline]
fn look_at_books(group: &QueueGroup, st: &mut WorkerStats, at: &mut u64, now: u64) -> bool {
    if now.saturating_sub(*at) < BOOKS_EVERY_NS {
        return false;
    }
    st.umem = group.accounting();
    *at = now;
    true
}

/// Runs the held frames `batch` through the pipeline and applies the verdicts: TX on the
/// group's sockets, handoff, or recycling. `handed_in` says the frames came from other
/// workers (and must not be handed off again).
#[allow(clippy::too_many_arguments)]
#[inline]
fn run_batch(
    group: &mut QueueGroup,
    pipe: &mut Pipeline,
    handoff: &mut Handoff,
    table: &ServiceTable,
    now: u64,
    batch: &mut [Held],
    handed_in: bool,
    st: &mut WorkerStats,
) {
    let n = batch.len();
    debug_assert!(n <= B);
    st.batches += 1;
    let mut verdicts = [Verdict::Pass; B];
    {
        // Placeholders over an empty buffer (no allocation); `lend` replaces the first `n`.
        let mut frames: [Frame<'_>; B] = std::array::from_fn(|_| Frame::new(&mut [], 0, 0));
        group.lend(batch, &mut frames[..n]);
        // One `process_batch` per run of frames with the same ingress port: one run for an
        // RX batch, usually one for handed-in frames too.
        let mut i = 0;
        while i < n {
            let ingress = batch[i].ingress;
            let j = i + batch[i..]
                .iter()
                .take_while(|h| h.ingress == ingress)
                .count();
            pipe.process_batch(table, now, ingress, &mut frames[i..j], &mut verdicts[i..j]);
            i = j;
        }
        for (h, f) in batch.iter_mut().zip(&frames[..n]) {
            h.head = f.head() as u32;
            h.len = f.len() as u32;
        }
    }
    for (h, v) in batch.iter().zip(&verdicts[..n]) {
        match *v {
            Verdict::Tx { port } => match group.socket_for(port) {
                Some(s) if group.stage_tx(s, h) => continue,
                Some(_) => st.tx_ring_full += 1,
                None => st.other_port += 1,
            },
            Verdict::Drop(_) => {}
            Verdict::Pass => st.pass_unsent += 1,
            Verdict::Handoff { .. } if handed_in => st.handoff_loop += 1,
            Verdict::Handoff { core } => match handoff.send(core, h.ingress, group.packet(h)) {
                Ok(()) => st.handed_out += 1,
                Err(HandoffError::Full) => st.handoff_full += 1,
                Err(HandoffError::TooBig) => st.handoff_too_big += 1,
                Err(HandoffError::NoRing) => st.handoff_no_ring += 1,
            },
        }
        group.recycle(h);
    }
    st.tx += group.submit_tx() as u64;
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
