//! The worker loop: one thread per queue group (queue `q` of every interface, see
//! [`QueueGroup`]), driving [`Pipeline::process_batch`] over the frames of its sockets.
//! The loop is generic over its port driver ([`PortDriver`]): AF_XDP's [`QueueGroup`] here,
//! DPDK's queue group in the `strait-dpdk` crate; the names below are AF_XDP's.
//!
//! Each turn: reap the completion rings (sent frames back to the free list), refill the fill
//! rings; if a socket or an inbound handoff ring has frames, load the service-table snapshot
//! once and read the clock once, then, per socket, read up to [`BATCH`] frames from its RX
//! ring and run them as one batch, and finally drain up to [`BATCH`] frames handed over by
//! other workers and run those; then one turn of flow sync (`Pipeline::sync_turn`: a bounded
//! number of records learnt from peer gateways, a bounded slice of a dump walk; also on idle
//! turns when it has work); then answers the queries of its explain desk, if any
//! (`Pipeline::explain_turn`: a read of the flow table per query; while none waits, one load
//! of the query ring's index, also on idle turns); then kick TX where the kernel asked for
//! it. Nothing in the loop allocates.
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
//! - `Pass`: given to the driver ([`PortDriver::pass`]). AF_XDP cannot honour it, because an
//!   AF_XDP frame cannot be handed back to the kernel's stack, so it is recycled and counted
//!   in [`WorkerStats::pass_unsent`] (the steering program redirects only gateway traffic, so
//!   this should stay near zero); DPDK writes it to the port's exception TAP
//!   ([`WorkerStats::passed`]).
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

impl MonotonicClock {
    /// A clock counting from `origin`: workers whose clocks share one origin stamp their
    /// capture records on one time line ([`crate::capture::Hub::origin`]).
    pub fn since(origin: Instant) -> Self {
        Self { origin }
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
    /// Frames put on the TX rings (DPDK: handed to the PMD and taken).
    pub tx: u64,
    /// Frames the kernel reported sent (completion rings).
    pub completed: u64,
    /// `Verdict::Pass` frames, dropped because the driver cannot give them to the kernel
    /// (AF_XDP) or the kernel side was full (DPDK's exception interface).
    pub pass_unsent: u64,
    /// `Verdict::Pass` frames given to the kernel (DPDK: written to the port's exception
    /// interface).
    pub passed: u64,
    /// Frames the kernel sent through the ports (DPDK: read from the exception interface).
    pub exception_out: u64,
    /// `Verdict::Tx` to a port the group has no socket for, dropped.
    pub other_port: u64,
    /// Frames to send that found the TX ring full, dropped.
    pub tx_ring_full: u64,
    /// Frames counted in `tx` that the port then refused (a DPDK PMD's TX queue full at the
    /// turn's kick), freed, and taken out of `tx` again.
    pub tx_refused: u64,
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

impl WorkerStats {
    /// Moves `n` frames the port refused after [`PortDriver::submit_tx`] counted them from
    /// `tx` to `tx_refused`.
    #[inline]
    fn refused(&mut self, n: u32) {
        let n = u64::from(n);
        self.tx -= n;
        self.tx_refused += n;
    }
}

/// A port driver: the rings one worker serves (queue `q` of each of its interfaces) and the
/// frames in them. [`run_worker`] is generic over it, so the loop (rings in,
/// [`Pipeline::process_batch`], rings out, handoff, counters) is written once; AF_XDP
/// ([`QueueGroup`]) is one driver, DPDK (the `strait-dpdk` crate) the other.
///
/// A port is identified by its index in the driver (`s`, `0..ports()`), and by the service
/// table's port number (`u8`) that the pipeline's verdicts name.
///
/// A [`PortDriver::Held`] names one frame the worker holds. Only the driver makes one
/// (`read_rx`, `copy_in`); handing it back (`recycle`, `stage_tx`, `pass`) consumes it, so a
/// driver whose frames are not in books of its own (DPDK's mbufs) can trust that no frame is
/// held twice. `Held::default()` is a placeholder that names no frame.
pub trait PortDriver {
    /// A frame held by the worker.
    type Held: Default;
    /// What a failed ring syscall reports.
    type Error;

    /// Ports served (sockets, DPDK ports).
    fn ports(&self) -> usize;
    /// Start of a turn: frames the hardware or kernel is done with back to the free list
    /// (completions), free frames onto the receive side. Returns the frames completed.
    fn reap_completions(&mut self) -> u32;
    /// Free frames onto the receive side (fill rings); DPDK refills in its PMDs.
    fn refill(&mut self) -> u32;
    /// Whether a frame is waiting on any port (cheap; called on every turn).
    fn rx_ready(&mut self) -> bool;
    /// Reads up to `out.len()` frames (the driver may take fewer) from port `s`; returns
    /// how many, and how many invalid descriptors were skipped.
    fn read_rx(&mut self, s: usize, out: &mut [Self::Held]) -> (usize, u32);
    /// Lends the frames of `batch` to the pipeline, one [`Frame`] each in `out`.
    fn lend<'a>(&'a mut self, batch: &[Self::Held], out: &mut [Frame<'a>]);
    /// Records a frame's packet extent after the pipeline moved it.
    fn set_extent(h: &mut Self::Held, head: usize, len: usize);
    /// The table port a frame arrived on.
    fn ingress(h: &Self::Held) -> u8;
    /// The packet bytes of a held frame.
    fn packet(&self, h: &Self::Held) -> &[u8];
    /// A free frame holding a copy of `packet` as received on `ingress`, if one is free.
    fn copy_in(&mut self, ingress: u8, packet: &[u8]) -> Option<Self::Held>;
    /// Gives a frame back to the free list.
    fn recycle(&mut self, h: Self::Held);
    /// The driver's port that sends on table port `port`, if it has one.
    fn socket_for(&self, port: u8) -> Option<usize>;
    /// Stages a frame for sending on port `s`; `Err` gives it back when there is no room.
    ///
    /// # Errors
    /// The frame, when the TX side is full.
    fn stage_tx(&mut self, s: usize, h: Self::Held) -> Result<(), Self::Held>;
    /// Sends what was staged, or queues it for the turn's kick ([`PortDriver::drain_tx`]);
    /// returns how many frames left or were queued to leave.
    fn submit_tx(&mut self) -> u32;
    /// Gives a `Verdict::Pass` frame to the kernel; `Err` gives it back when the driver has
    /// no way to (AF_XDP: the steering program passes the kernel's traffic before it gets
    /// here) or the kernel side is full.
    ///
    /// # Errors
    /// The frame, when it could not be passed.
    fn pass(&mut self, h: Self::Held) -> Result<(), Self::Held>;
    /// Frames the kernel sends through the ports (the exception path's way back); returns
    /// how many were forwarded. `busy` says the worker is under load, where a driver may poll
    /// less often.
    fn exception(&mut self, _busy: bool) -> u32 {
        0
    }
    /// Kicks TX where the kernel asked for it (DPDK: bursts what is staged); returns the
    /// syscalls (bursts) made.
    ///
    /// # Errors
    /// When a kick fails in a way retrying cannot fix.
    fn flush_tx(&mut self) -> Result<u32, Self::Error>;
    /// Kicks TX until it is drained (bounded); returns the syscalls made.
    ///
    /// # Errors
    /// As [`PortDriver::flush_tx`].
    fn drain_tx(&mut self) -> Result<u32, Self::Error>;
    /// Frames counted by [`PortDriver::submit_tx`] that the port then refused (a DPDK PMD's
    /// full TX queue at the kick), since the last call; freed by the driver.
    fn take_tx_refused(&mut self) -> u32 {
        0
    }
    /// Wakes the receive side where the kernel asked for it; returns the syscalls made.
    ///
    /// # Errors
    /// As [`PortDriver::flush_tx`].
    fn wake_fill(&mut self) -> Result<u32, Self::Error>;
    /// Sleeps until a frame may be waiting, at most `timeout_ms`.
    ///
    /// # Errors
    /// When the wait itself fails.
    fn wait_rx(&mut self, timeout_ms: i32) -> Result<(), Self::Error>;
    /// Where the driver's frames are (AF_XDP's UMEM books); a driver without such books
    /// (DPDK's mempools) reports none.
    fn accounting(&self) -> Accounting {
        Accounting::default()
    }
}

impl PortDriver for QueueGroup {
    type Held = Held;
    type Error = XskError;

    #[inline]
    fn ports(&self) -> usize {
        QueueGroup::ports(self).len()
    }
    #[inline]
    fn reap_completions(&mut self) -> u32 {
        QueueGroup::reap_completions(self)
    }
    #[inline]
    fn refill(&mut self) -> u32 {
        QueueGroup::refill(self)
    }
    #[inline]
    fn rx_ready(&mut self) -> bool {
        QueueGroup::rx_ready(self)
    }
    #[inline]
    fn read_rx(&mut self, s: usize, out: &mut [Held]) -> (usize, u32) {
        QueueGroup::read_rx(self, s, out)
    }
    #[inline]
    fn lend<'a>(&'a mut self, batch: &[Held], out: &mut [Frame<'a>]) {
        QueueGroup::lend(self, batch, out);
    }
    #[inline]
    fn set_extent(h: &mut Held, head: usize, len: usize) {
        h.head = head as u32;
        h.len = len as u32;
    }
    #[inline]
    fn ingress(h: &Held) -> u8 {
        h.ingress
    }
    #[inline]
    fn packet(&self, h: &Held) -> &[u8] {
        QueueGroup::packet(self, h)
    }
    #[inline]
    fn copy_in(&mut self, ingress: u8, packet: &[u8]) -> Option<Held> {
        QueueGroup::copy_in(self, ingress, packet)
    }
    #[inline]
    fn recycle(&mut self, h: Held) {
        QueueGroup::recycle(self, &h);
    }
    #[inline]
    fn socket_for(&self, port: u8) -> Option<usize> {
        QueueGroup::socket_for(self, port)
    }
    #[inline]
    fn stage_tx(&mut self, s: usize, h: Held) -> Result<(), Held> {
        if QueueGroup::stage_tx(self, s, &h) {
            Ok(())
        } else {
            Err(h)
        }
    }
    #[inline]
    fn submit_tx(&mut self) -> u32 {
        QueueGroup::submit_tx(self)
    }
    #[inline]
    fn pass(&mut self, h: Held) -> Result<(), Held> {
        // An AF_XDP frame cannot be handed back to the kernel's stack.
        Err(h)
    }
    #[inline]
    fn flush_tx(&mut self) -> Result<u32, XskError> {
        QueueGroup::flush_tx(self)
    }
    #[inline]
    fn drain_tx(&mut self) -> Result<u32, XskError> {
        QueueGroup::drain_tx(self)
    }
    #[inline]
    fn wake_fill(&mut self) -> Result<u32, XskError> {
        QueueGroup::wake_fill(self)
    }
    fn wait_rx(&mut self, timeout_ms: i32) -> Result<(), XskError> {
        QueueGroup::wait_rx(self, timeout_ms)
    }
    fn accounting(&self) -> Accounting {
        QueueGroup::accounting(self)
    }
}

/// Batches between two calls of the `publish` hook while busy: at 1 Mpps and 64-frame
/// batches, about every 65 ms, so `/metrics` is never more than a scrape interval behind, and
/// the hook's copy (a few hundred bytes) costs nothing per packet.
pub const PUBLISH_EVERY: u64 = 1024;

/// Least time between two calls of the `publish` hook made because the pipeline counted a
/// failed connection attempt ([`crate::passive`]) while busy: 1 ms, so the control side,
/// which looks every few milliseconds, sees a failing backend within a few of them, and a
/// backend refusing thousands of connections a second costs at most a thousand copies of
/// the sample a second (a few microseconds each), only while it fails.
pub const PASSIVE_PUBLISH_NS: u64 = 1_000_000;

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
/// worker turns idle, every [`PUBLISH_EVERY`] batches, at most every [`PASSIVE_PUBLISH_NS`]
/// while the pipeline counts failed connection attempts ([`crate::passive`]) and, while idle,
/// with each look at the UMEM's books, to copy them where the admin API reads. While idle the
/// worker also expires flows, [`SWEEP_BUCKETS`] buckets a turn; while busy, the pipeline does
/// at its table's pace ([`crate::flow::FlowTable::sweep_paced`]).
///
/// An idle worker sleeps in `poll(2)` on its sockets, so a frame handed to it then waits up to
/// [`IDLE_POLL_MS`].
///
/// # Errors
/// [`XskError::Io`] when a `sendto`, `recvfrom` or `poll` on a socket fails in a way
/// retrying cannot fix; the group stays usable for inspection.
pub fn run_worker<D, T, S, C, P>(
    group: &mut D,
    pipe: &mut Pipeline,
    handoff: &mut Handoff,
    mut snapshot: S,
    stop: &AtomicBool,
    mut clock: C,
    mut publish: P,
) -> Result<WorkerStats, D::Error>
where
    D: PortDriver,
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
    let mut held: [D::Held; B] = std::array::from_fn(|_| D::Held::default());
    let mut idle = 0u32;
    // The passive-health total last published, and when.
    let (mut passive_seen, mut passive_at) = (0u64, 0u64);
    let sockets = group.ports();
    while !stop.load(Ordering::Relaxed) {
        let turn = clock.now_ns();
        st.completed += group.reap_completions() as u64;
        group.refill();
        st.exception_out += group.exception(idle == 0) as u64;
        if !group.rx_ready() && !handoff.is_ready() {
            st.tx_kicks += group.flush_tx()? as u64;
            st.fill_kicks += group.wake_fill()? as u64;
            st.refused(group.take_tx_refused());
            idle += 1;
            let now = clock.now_ns();
            // Idle turns also keep the books fresh, so that a gateway at rest shows where
            // its frames are at rest.
            let looked = look_at_books(group, &mut st, &mut books_at, now);
            if idle == 1 || looked {
                passive_seen = pipe.passive.total();
                publish(pipe, &st);
            }
            pipe.sweep(&snapshot(), now, SWEEP_BUCKETS);
            if pipe.sync_pending() {
                // Flows learnt from the peers, or a dump to walk: not idle.
                let table = snapshot();
                if pipe.sync_turn(&table, clock.now_ns()) > 0 {
                    idle = 0;
                }
            }
            if pipe.explain_pending() {
                let table = snapshot();
                pipe.explain_turn(&table, clock.now_ns());
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
        if pipe.explain_pending() {
            pipe.explain_turn(&table, now);
        }
        drop(table);
        let kick = clock.now_ns();
        st.tx_kicks += group.drain_tx()? as u64;
        st.busy.turn(turn, kick, clock.now_ns());
        st.refused(group.take_tx_refused());
        if st.batches / PUBLISH_EVERY != batches / PUBLISH_EVERY {
            let _ = look_at_books(group, &mut st, &mut books_at, now);
            passive_seen = pipe.passive.total();
            publish(pipe, &st);
        } else if pipe.passive.total() != passive_seen
            && now.saturating_sub(passive_at) >= PASSIVE_PUBLISH_NS
        {
            // A backend failed connection attempts: the control side decides on it soon.
            (passive_seen, passive_at) = (pipe.passive.total(), now);
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
fn look_at_books<D: PortDriver>(group: &D, st: &mut WorkerStats, at: &mut u64, now: u64) -> bool {
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
fn run_batch<D: PortDriver>(
    group: &mut D,
    pipe: &mut Pipeline,
    handoff: &mut Handoff,
    table: &ServiceTable,
    now: u64,
    batch: &mut [D::Held],
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
            let ingress = D::ingress(&batch[i]);
            let j = i + batch[i..]
                .iter()
                .take_while(|h| D::ingress(h) == ingress)
                .count();
            pipe.process_batch(table, now, ingress, &mut frames[i..j], &mut verdicts[i..j]);
            i = j;
        }
        for (h, f) in batch.iter_mut().zip(&frames[..n]) {
            D::set_extent(h, f.head(), f.len());
        }
    }
    for (h, v) in batch.iter_mut().zip(&verdicts[..n]) {
        let h = std::mem::take(h);
        let h = match *v {
            Verdict::Tx { port } => match group.socket_for(port) {
                Some(s) => match group.stage_tx(s, h) {
                    Ok(()) => continue,
                    Err(h) => {
                        st.tx_ring_full += 1;
                        h
                    }
                },
                None => {
                    st.other_port += 1;
                    h
                }
            },
            Verdict::Drop(_) => h,
            Verdict::Pass => match group.pass(h) {
                Ok(()) => {
                    st.passed += 1;
                    continue;
                }
                Err(h) => {
                    st.pass_unsent += 1;
                    h
                }
            },
            Verdict::Handoff { .. } if handed_in => {
                st.handoff_loop += 1;
                h
            }
            Verdict::Handoff { core } => {
                match handoff.send(core, D::ingress(&h), group.packet(&h)) {
                    Ok(()) => st.handed_out += 1,
                    Err(HandoffError::Full) => st.handoff_full += 1,
                    Err(HandoffError::TooBig) => st.handoff_too_big += 1,
                    Err(HandoffError::NoRing) => st.handoff_no_ring += 1,
                }
                h
            }
        };
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
