//! The forwarding loop of `strait-lab l2fwd`, written once over the gateway's
//! [`PortDriver`]: AF_XDP's queue group for `limit` ([`super::forwarder`]), the DPDK group for
//! `limit-dpdk` ([`super::dpdk`]). It keeps [`strait_dataplane::xsk::run_worker`]'s ring
//! discipline without the pipeline: reap completions, refill, read up to [`BATCH`] frames on
//! the RX port, rewrite their Ethernet addresses in place, stage them on the TX port, free
//! whatever arrives on the TX port, then the turn's TX kick (AF_XDP: `sendto` until the
//! ring is empty; DPDK: one `rte_eth_tx_burst` per port), timed apart as the gateway's
//! workers time theirs ([`strait_dataplane::stats::BusyTime`]), so the two costs per packet
//! compare. After [`IDLE_SPINS`] empty turns it sleeps in the driver's `wait_rx`. Nothing in
//! the loop allocates.

use std::sync::atomic::{AtomicBool, Ordering};

use strait_dataplane::rewrite::Frame;
use strait_dataplane::stats::BusyTime;
use strait_dataplane::xsk::worker::{IDLE_POLL_MS, IDLE_SPINS, PUBLISH_EVERY};
use strait_dataplane::xsk::{Clock, MonotonicClock, PortDriver, BATCH};

/// What the forwarding loop did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct L2fwdStats {
    /// Frames read from the RX ring.
    pub rx: u64,
    /// Frames put on the TX ring.
    pub tx: u64,
    /// Frames the kernel reported sent (completion ring): the forwarded count.
    pub forwarded: u64,
    /// Frames dropped because the TX ring was full.
    pub tx_ring_full: u64,
    /// Frames shorter than an Ethernet header, dropped.
    pub runts: u64,
    /// RX descriptors outside the UMEM or naming a frame not on a fill ring (a kernel bug if
    /// ever non-zero).
    pub invalid_rx: u64,
    /// RX batches forwarded.
    pub batches: u64,
    /// `sendto` kicks made because the kernel asked for them.
    pub tx_kicks: u64,
    /// `recvfrom` kicks made because the driver asked for fill-ring wakeups.
    pub fill_kicks: u64,
    /// Sleeps in `poll(2)` after [`strait_dataplane::xsk::worker::IDLE_SPINS`] empty turns.
    pub idle_polls: u64,
    /// Time in turns that found frames, as the gateway's workers count it.
    pub busy: BusyTime,
}

/// [`BATCH`] as an array length.
const B: usize = BATCH as usize;
/// The RX port's index in the driver.
pub(crate) const RX: usize = 0;
/// The TX port's index in the driver.
pub(crate) const TX: usize = 1;
/// Shortest frame forwarded: an Ethernet header.
const ETH_HLEN: usize = 14;

/// Where [`L2fwdStats::forwarded`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Forwarded {
    /// The driver's completions: frames the kernel reported sent (AF_XDP).
    Completions,
    /// Frames the driver took for sending and did not refuse at the kick (DPDK's PMDs free
    /// what they sent themselves).
    Taken,
}

/// Forwards from [`RX`] to [`TX`] of `group` until `stop` is set, rewriting the destination
/// MAC to `dst` and the source to `src`; `publish` sees the statistics when the loop turns
/// idle and every [`PUBLISH_EVERY`] batches while busy. Returns them; frames still on a TX
/// ring are the caller's to wait for.
///
/// # Errors
/// The driver's, when a kick or the idle wait fails in a way retrying cannot fix.
pub(crate) fn forward<D: PortDriver, P: FnMut(&L2fwdStats)>(
    group: &mut D,
    src: [u8; 6],
    dst: [u8; 6],
    counted: Forwarded,
    stop: &AtomicBool,
    publish: &mut P,
) -> Result<L2fwdStats, D::Error> {
    let mut st = L2fwdStats::default();
    let mut held: [D::Held; B] = std::array::from_fn(|_| D::Held::default());
    let mut idle = 0u32;
    let mut clock = MonotonicClock::new();
    while !stop.load(Ordering::Relaxed) {
        let turn = clock.now_ns();
        let completed = group.reap_completions() as u64;
        if counted == Forwarded::Completions {
            st.forwarded += completed;
        }
        group.refill();
        if !group.rx_ready() {
            st.tx_kicks += group.flush_tx()? as u64;
            st.fill_kicks += group.wake_fill()? as u64;
            refused(&mut st, group.take_tx_refused(), counted);
            idle += 1;
            if idle == 1 {
                publish(&st);
            }
            if idle >= IDLE_SPINS {
                idle = 0;
                st.idle_polls += 1;
                group.wait_rx(IDLE_POLL_MS)?;
            }
            continue;
        }
        idle = 0;
        let (n, invalid) = group.read_rx(RX, &mut held);
        st.invalid_rx += invalid as u64;
        if n > 0 {
            st.rx += n as u64;
            st.batches += 1;
            forward_batch(group, &mut held[..n], dst, src, counted, &mut st);
            if st.batches % PUBLISH_EVERY == 0 {
                publish(&st);
            }
        }
        // What arrives on the TX port is not forwarded (a DPDK port there takes the wire
        // from the kernel; AF_XDP has no steering program there, so nothing arrives).
        let (m, _) = group.read_rx(TX, &mut held);
        for h in &mut held[..m] {
            group.recycle(std::mem::take(h));
        }
        let kick = clock.now_ns();
        st.tx_kicks += group.drain_tx()? as u64;
        st.busy.turn(turn, kick, clock.now_ns());
        refused(&mut st, group.take_tx_refused(), counted);
    }
    Ok(st)
}

/// Moves `n` frames the TX port refused at the kick from `tx` (and `forwarded`, where it
/// counts frames taken) to `tx_ring_full`.
#[inline]
fn refused(st: &mut L2fwdStats, n: u32, counted: Forwarded) {
    let n = u64::from(n);
    st.tx -= n;
    if counted == Forwarded::Taken {
        st.forwarded -= n;
    }
    st.tx_ring_full += n;
}

/// Rewrites the Ethernet addresses of the held frames `batch` in place and stages them on
/// [`TX`]; runts and frames the TX side has no room for are freed and counted.
#[inline]
fn forward_batch<D: PortDriver>(
    group: &mut D,
    batch: &mut [D::Held],
    dst: [u8; 6],
    src: [u8; 6],
    counted: Forwarded,
    st: &mut L2fwdStats,
) {
    let n = batch.len();
    debug_assert!(n <= B);
    let mut ok = [false; B];
    {
        // Placeholders over an empty buffer (no allocation); `lend` replaces the first `n`.
        let mut frames: [Frame<'_>; B] = std::array::from_fn(|_| Frame::new(&mut [], 0, 0));
        group.lend(batch, &mut frames[..n]);
        for (f, ok) in frames[..n].iter_mut().zip(&mut ok) {
            let d = f.data_mut();
            if d.len() >= ETH_HLEN {
                d[..6].copy_from_slice(&dst);
                d[6..12].copy_from_slice(&src);
                *ok = true;
            }
        }
    }
    for (h, ok) in batch.iter_mut().zip(&ok[..n]) {
        let h = std::mem::take(h);
        if !ok {
            st.runts += 1;
            group.recycle(h);
            continue;
        }
        if let Err(h) = group.stage_tx(TX, h) {
            st.tx_ring_full += 1;
            group.recycle(h);
        }
    }
    let sent = group.submit_tx() as u64;
    st.tx += sent;
    if counted == Forwarded::Taken {
        st.forwarded += sent;
    }
}
