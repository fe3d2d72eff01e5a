//! [`DpdkGroup`]: queue `q` of every DPDK port of the gateway, with one mempool, served by
//! one worker: the DPDK driver of [`PortDriver`].

use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;

use strait_dataplane::rewrite::Frame;
use strait_dataplane::xsk::PortDriver;

use crate::ffi::{self, RteMbuf, RteMempool};
use crate::tap::Tap;

/// Most ports in a group, as for AF_XDP's queue groups.
pub const MAX_PORTS: usize = 8;

/// Frames taken from a port's RX queue per burst: DPDK's customary burst, which its PMDs'
/// vector paths are written for; the worker's batch of 64 is served by up to two bursts, and
/// [`strait_dataplane::pipeline::Pipeline::process_batch`] runs in chunks of this size anyway.
pub const RX_BURST: u16 = 32;

/// Busy turns between two reads of the exception TAP: its `read(2)` costs about a
/// microsecond, so reading every 16th turn keeps it under 2 ns per packet at full batches,
/// while the kernel's frames wait at most 16 turns (a few microseconds under load). Idle
/// turns read it every time.
pub const TAP_POLL_EVERY: u32 = 16;

/// RX and TX descriptors per queue (adjusted to what the PMD allows): 1024 covers a burst
/// of a few hundred microseconds at line rate on a 10G port without pinning much memory.
pub(crate) const RX_DESC: u16 = 1024;
/// See [`RX_DESC`].
pub(crate) const TX_DESC: u16 = 1024;
/// Per-lcore mempool cache: 256 mbufs, eight bursts, so a worker's allocs and frees stay in
/// its cache.
pub(crate) const POOL_CACHE: u32 = 256;
/// Frames staged for one port before its burst: the worker's TX kick (`drain_tx`, once a
/// turn) sends them in one `rte_eth_tx_burst`, so a PMD whose burst makes a syscall
/// (`net_af_xdp`, `net_af_packet`) makes one a turn, and the turn's kick is timed apart
/// from its own work as on AF_XDP. A turn stages at most one RX burst per port plus one
/// batch of handed-in frames; a port whose staging fills anyway is burst on the spot.
const TX_STAGE: usize = 128;

/// A frame the worker holds: an mbuf, and the table port it arrived on. Neither `Copy` nor
/// `Clone`: it owns the mbuf until it is given back to DPDK (sent, freed, passed to the
/// kernel), which consumes it. `Mbuf::default()` holds nothing.
#[derive(Debug)]
pub struct Mbuf {
    m: *mut RteMbuf,
    ingress: u8,
}

impl Default for Mbuf {
    fn default() -> Self {
        Self {
            m: std::ptr::null_mut(),
            ingress: 0,
        }
    }
}

impl Mbuf {
    /// The mbuf pointer, checked: a placeholder lent or sent is a bug of the caller.
    #[inline(always)]
    fn ptr(&self) -> *mut RteMbuf {
        assert!(
            !self.m.is_null(),
            "an empty Mbuf placeholder used as a frame"
        );
        self.m
    }
}

/// What the DPDK driver did, beyond [`strait_dataplane::xsk::WorkerStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DpdkStats {
    /// Frames received in several segments (larger than an mbuf), dropped.
    pub multi_segment: u64,
    /// Kernel frames that found no free mbuf, left on the TAP.
    pub tap_no_mbuf: u64,
    /// Kernel frames the port's TX queue did not take, freed.
    pub tap_tx_dropped: u64,
    /// Passed frames whose checksum a local sender had left to offload, completed before
    /// the kernel saw them.
    pub pass_completed: u64,
}

/// One port of a group.
#[derive(Debug)]
pub(crate) struct GroupPort {
    name: String,
    id: u16,
    queue: u16,
    table_port: u8,
    tap: Arc<Tap>,
    /// This group reads the TAP (it serves the port's first queue).
    reads_tap: bool,
    stash: [*mut RteMbuf; RX_BURST as usize],
    stash_len: usize,
    staged: [*mut RteMbuf; TX_STAGE],
    staged_len: usize,
}

impl GroupPort {
    pub(crate) fn new(
        name: String,
        id: u16,
        queue: u16,
        table_port: u8,
        tap: Arc<Tap>,
        reads_tap: bool,
    ) -> Self {
        Self {
            name,
            id,
            queue,
            table_port,
            tap,
            reads_tap,
            stash: [std::ptr::null_mut(); RX_BURST as usize],
            stash_len: 0,
            staged: [std::ptr::null_mut(); TX_STAGE],
            staged_len: 0,
        }
    }
}

/// Queue `q` of one or more DPDK ports, sharing one mempool: the unit one worker serves, as
/// [`strait_dataplane::xsk::QueueGroup`] is for AF_XDP. A frame received on one port leaves
/// on another as it is.
#[derive(Debug)]
pub struct DpdkGroup {
    ports: Vec<GroupPort>,
    by_table_port: [u8; 256],
    pool: *mut RteMempool,
    queue: u32,
    turns: u32,
    /// Frames staged since the last `submit_tx`.
    staged_new: u32,
    /// Frames the TX queues refused since the last `take_tx_refused`.
    refused: u32,
    stats: DpdkStats,
}

// SAFETY: the group's raw pointers are mbufs it owns and a mempool, all in DPDK's shared
// memory, usable from any thread; the group is used by one thread at a time (`&mut self` on
// every frame call), and the port queues it names are used by no other group.
unsafe impl Send for DpdkGroup {}

const NO_PORT: u8 = u8::MAX;

impl DpdkGroup {
    pub(crate) fn new(ports: Vec<GroupPort>, pool: *mut RteMempool, queue: u32) -> Self {
        let mut by_table_port = [NO_PORT; 256];
        for (i, p) in ports.iter().enumerate() {
            by_table_port[p.table_port as usize] = i as u8;
        }
        Self {
            ports,
            by_table_port,
            pool,
            queue,
            turns: 0,
            staged_new: 0,
            refused: 0,
            stats: DpdkStats::default(),
        }
    }

    /// `a+b/q`, as AF_XDP groups are named.
    pub fn name(&self) -> String {
        let names: Vec<&str> = self.ports.iter().map(|p| p.name.as_str()).collect();
        format!("{}/{}", names.join("+"), self.queue)
    }

    /// The driver's own counters.
    pub fn stats(&self) -> DpdkStats {
        self.stats
    }

    /// Free mbufs in the group's mempool (outside the per-thread caches).
    pub fn pool_free(&self) -> u32 {
        // SAFETY: the pool lives as long as EAL (never freed while a group exists).
        unsafe { ffi::strait_pool_avail(self.pool) }
    }

    /// The packet bytes of a live mbuf.
    ///
    /// # Safety
    /// `m` is a live mbuf that the caller owns for `'a` and does not write meanwhile.
    #[inline]
    unsafe fn packet_of<'a>(m: *mut RteMbuf) -> &'a [u8] {
        let (mut buf, mut buf_len, mut off, mut len) = (std::ptr::null_mut(), 0u16, 0u16, 0u16);
        // SAFETY: `m` is a live mbuf owned by the caller; the shim writes the outputs.
        unsafe { ffi::strait_mbuf_view(m, &mut buf, &mut buf_len, &mut off, &mut len) };
        debug_assert!(off as usize + len as usize <= buf_len as usize);
        // SAFETY: `buf[off..off + len]` lies in the mbuf's data buffer, which the caller
        // owns and does not write for 'a.
        unsafe { std::slice::from_raw_parts(buf.add(off as usize), len as usize) }
    }
}

impl DpdkGroup {
    /// Sends port `s`'s staged frames in one `rte_eth_tx_burst`; those the TX queue does
    /// not take are freed and counted. Returns the frames sent.
    #[inline]
    fn burst(&mut self, s: usize) -> u32 {
        let p = &mut self.ports[s];
        let n = p.staged_len;
        if n == 0 {
            return 0;
        }
        // SAFETY: a started port's configured queue, used by this group only; the staged
        // mbufs are owned by the group, and the PMD takes the first `k`.
        let k = unsafe { ffi::strait_tx_burst(p.id, p.queue, p.staged.as_mut_ptr(), n as u16) }
            as usize;
        if k < n {
            // SAFETY: the mbufs the PMD did not take are still ours.
            unsafe { ffi::strait_mbuf_free_bulk(p.staged[k..n].as_mut_ptr(), (n - k) as u32) };
            self.refused += (n - k) as u32;
        }
        p.staged_len = 0;
        k as u32
    }

    /// The packet bytes of a live mbuf, writable.
    ///
    /// # Safety
    /// `m` is a live mbuf that the caller owns for `'a`, with no other view of it meanwhile.
    #[inline]
    unsafe fn packet_of_mut<'a>(m: *mut RteMbuf) -> &'a mut [u8] {
        let (mut buf, mut buf_len, mut off, mut len) = (std::ptr::null_mut(), 0u16, 0u16, 0u16);
        // SAFETY: `m` is a live mbuf owned by the caller; the shim writes the outputs.
        unsafe { ffi::strait_mbuf_view(m, &mut buf, &mut buf_len, &mut off, &mut len) };
        // SAFETY: `buf[off..off + len]` lies in the mbuf's data buffer, which the caller
        // owns without another view for 'a.
        unsafe { std::slice::from_raw_parts_mut(buf.add(off as usize), len as usize) }
    }
}

impl PortDriver for DpdkGroup {
    type Held = Mbuf;
    type Error = io::Error;

    #[inline]
    fn ports(&self) -> usize {
        self.ports.len()
    }

    #[inline]
    fn reap_completions(&mut self) -> u32 {
        // PMDs free sent mbufs themselves.
        0
    }

    #[inline]
    fn refill(&mut self) -> u32 {
        // PMDs refill their RX descriptors from the mempool themselves.
        0
    }

    #[inline]
    fn rx_ready(&mut self) -> bool {
        // A burst is the only way to look at most PMDs' queues: take it into the port's
        // stash, which `read_rx` hands out.
        let mut any = false;
        for p in &mut self.ports {
            if p.stash_len == 0 {
                // SAFETY: a started port and one of its configured queues, used by this
                // group only; `stash` has room for RX_BURST pointers.
                p.stash_len =
                    unsafe { ffi::strait_rx_burst(p.id, p.queue, p.stash.as_mut_ptr(), RX_BURST) }
                        as usize;
            }
            any |= p.stash_len > 0;
        }
        any
    }

    #[inline]
    fn read_rx(&mut self, s: usize, out: &mut [Mbuf]) -> (usize, u32) {
        let p = &mut self.ports[s];
        let take = p.stash_len.min(out.len());
        let (mut n, mut invalid) = (0, 0u32);
        for &m in &p.stash[..take] {
            let (mut buf, mut buf_len, mut off, mut len) = (std::ptr::null_mut(), 0u16, 0u16, 0u16);
            // SAFETY: `m` came from rx_burst and is owned by the stash.
            let segs =
                unsafe { ffi::strait_mbuf_view(m, &mut buf, &mut buf_len, &mut off, &mut len) };
            if segs != 1 {
                // SAFETY: owned by the stash, dropped from it here.
                unsafe { ffi::strait_mbuf_free(m) };
                invalid += 1;
                self.stats.multi_segment += 1;
                continue;
            }
            out[n] = Mbuf {
                m,
                ingress: p.table_port,
            };
            n += 1;
        }
        p.stash.copy_within(take..p.stash_len, 0);
        p.stash_len -= take;
        (n, invalid)
    }

    #[inline]
    fn lend<'a>(&'a mut self, batch: &[Mbuf], out: &mut [Frame<'a>]) {
        assert!(out.len() >= batch.len(), "one frame slot per held frame");
        for (h, f) in batch.iter().zip(out.iter_mut()) {
            // SAFETY: `h` owns its single-segment mbuf (read_rx dropped the others,
            // copy_in makes single ones) and no two `Mbuf`s own the same one, so the frames
            // are disjoint; they borrow `self` for 'a, and the mbufs cannot be given back
            // (which needs `&mut self`) while they live.
            *f = unsafe { crate::frame_of(h.ptr()) };
        }
    }

    #[inline]
    fn set_extent(h: &mut Mbuf, head: usize, len: usize) {
        // SAFETY: `h` owns its mbuf; the pipeline kept the packet inside the buffer, so
        // both fit in u16 (a buffer is at most 64 KiB).
        unsafe { ffi::strait_mbuf_set(h.ptr(), head as u16, len as u16) };
    }

    #[inline]
    fn ingress(h: &Mbuf) -> u8 {
        h.ingress
    }

    #[inline]
    fn packet(&self, h: &Mbuf) -> &[u8] {
        // SAFETY: `h` owns its mbuf; the slice borrows `h` through `&self`'s caller, and
        // nothing writes the mbuf while it is held outside a lent frame.
        unsafe { Self::packet_of(h.ptr()) }
    }

    #[inline]
    fn copy_in(&mut self, ingress: u8, packet: &[u8]) -> Option<Mbuf> {
        // SAFETY: the pool is live; a null return is handled.
        let m = unsafe { ffi::strait_mbuf_alloc(self.pool) };
        if m.is_null() {
            return None;
        }
        let (mut buf, mut buf_len, mut off, mut len) = (std::ptr::null_mut(), 0u16, 0u16, 0u16);
        // SAFETY: a fresh mbuf, ours.
        unsafe { ffi::strait_mbuf_view(m, &mut buf, &mut buf_len, &mut off, &mut len) };
        if off as usize + packet.len() > buf_len as usize {
            // SAFETY: ours, given back.
            unsafe { ffi::strait_mbuf_free(m) };
            return None;
        }
        // SAFETY: `packet.len()` bytes from `buf + off` lie in the fresh mbuf's buffer
        // (checked above), which nothing else references.
        unsafe {
            std::ptr::copy_nonoverlapping(packet.as_ptr(), buf.add(off as usize), packet.len());
            ffi::strait_mbuf_set(m, off, packet.len() as u16);
        }
        Some(Mbuf { m, ingress })
    }

    #[inline]
    fn recycle(&mut self, h: Mbuf) {
        if !h.m.is_null() {
            // SAFETY: `h` owned the mbuf and is consumed.
            unsafe { ffi::strait_mbuf_free(h.m) };
        }
    }

    #[inline]
    fn socket_for(&self, port: u8) -> Option<usize> {
        match self.by_table_port[port as usize] {
            NO_PORT => None,
            s => Some(s as usize),
        }
    }

    #[inline]
    fn stage_tx(&mut self, s: usize, h: Mbuf) -> Result<(), Mbuf> {
        if self.ports[s].staged_len == TX_STAGE {
            self.burst(s);
        }
        let p = &mut self.ports[s];
        if p.staged_len == TX_STAGE {
            return Err(h);
        }
        p.staged[p.staged_len] = h.ptr();
        p.staged_len += 1;
        self.staged_new += 1;
        Ok(())
    }

    /// The frames staged since the last call: they leave in the turn's kick
    /// ([`PortDriver::drain_tx`]), or earlier when a port's staging fills.
    #[inline]
    fn submit_tx(&mut self) -> u32 {
        std::mem::take(&mut self.staged_new)
    }

    #[inline]
    fn pass(&mut self, h: Mbuf) -> Result<(), Mbuf> {
        let Some(s) = self.socket_for(h.ingress) else {
            return Err(h);
        };
        // SAFETY: `h` owns its mbuf and nothing else views it; the slice lives for this
        // function only.
        let packet = unsafe { Self::packet_of_mut(h.ptr()) };
        // The kernel verifies what it reads from a TAP: a segment a local sender left to
        // offload (on the testbed's veths, or a VM's tap on the segment) is completed first.
        if strait_dataplane::rewrite::complete_partial(packet) {
            self.stats.pass_completed += 1;
        }
        if !self.ports[s].tap.write(packet) {
            return Err(h);
        }
        self.recycle(h);
        Ok(())
    }

    fn exception(&mut self, busy: bool) -> u32 {
        self.turns = self.turns.wrapping_add(1);
        if busy && !self.turns.is_multiple_of(TAP_POLL_EVERY) {
            return 0;
        }
        let mut total = 0;
        for p in &mut self.ports {
            if !p.reads_tap {
                continue;
            }
            let mut burst = [std::ptr::null_mut::<RteMbuf>(); RX_BURST as usize];
            let mut n = 0;
            while n < RX_BURST as usize {
                // SAFETY: the pool is live; null is handled.
                let m = unsafe { ffi::strait_mbuf_alloc(self.pool) };
                if m.is_null() {
                    self.stats.tap_no_mbuf += 1;
                    break;
                }
                let (mut buf, mut buf_len, mut off, mut len) =
                    (std::ptr::null_mut(), 0u16, 0u16, 0u16);
                // SAFETY: a fresh mbuf, ours.
                unsafe { ffi::strait_mbuf_view(m, &mut buf, &mut buf_len, &mut off, &mut len) };
                // SAFETY: the room after the headroom of the fresh mbuf's buffer, ours.
                let room = unsafe {
                    std::slice::from_raw_parts_mut(
                        buf.add(off as usize),
                        buf_len as usize - off as usize,
                    )
                };
                match p.tap.read(room) {
                    Some(k) => {
                        // SAFETY: ours; `k` bytes were written in the buffer.
                        unsafe { ffi::strait_mbuf_set(m, off, k as u16) };
                        burst[n] = m;
                        n += 1;
                    }
                    None => {
                        // SAFETY: ours, unused.
                        unsafe { ffi::strait_mbuf_free(m) };
                        break;
                    }
                }
            }
            if n == 0 {
                continue;
            }
            // SAFETY: the port's queue of this group; the mbufs are ours and the PMD takes
            // the first `k`.
            let k = unsafe { ffi::strait_tx_burst(p.id, p.queue, burst.as_mut_ptr(), n as u16) }
                as usize;
            if k < n {
                // SAFETY: the ones the PMD did not take are still ours.
                unsafe { ffi::strait_mbuf_free_bulk(burst[k..n].as_mut_ptr(), (n - k) as u32) };
                self.stats.tap_tx_dropped += (n - k) as u64;
            }
            total += k as u32;
        }
        total
    }

    /// One burst on every port with staged frames; returns the bursts made.
    #[inline]
    fn flush_tx(&mut self) -> Result<u32, io::Error> {
        let mut bursts = 0;
        for s in 0..self.ports.len() {
            if self.ports[s].staged_len > 0 {
                self.burst(s);
                bursts += 1;
            }
        }
        Ok(bursts)
    }

    /// As [`PortDriver::flush_tx`]: a burst takes what the queue has room for at once, and
    /// what it refuses is freed and counted rather than kept for another try.
    #[inline]
    fn drain_tx(&mut self) -> Result<u32, io::Error> {
        self.flush_tx()
    }

    #[inline]
    fn take_tx_refused(&mut self) -> u32 {
        std::mem::take(&mut self.refused)
    }

    #[inline]
    fn wake_fill(&mut self) -> Result<u32, io::Error> {
        Ok(0)
    }

    /// Polling PMDs have no descriptor to sleep on: the worker sleeps in `poll(2)` on the
    /// TAPs it reads (so the kernel's frames wake it) for at most `timeout_ms`, and a frame
    /// arriving on the port meanwhile waits that long.
    fn wait_rx(&mut self, timeout_ms: i32) -> Result<(), io::Error> {
        let mut arr = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; MAX_PORTS];
        let mut n = 0;
        for p in self.ports.iter().filter(|p| p.reads_tap) {
            use std::os::fd::AsRawFd;
            arr[n] = libc::pollfd {
                fd: p.tap.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            n += 1;
        }
        // SAFETY: `arr[..n]` are valid pollfd structs for the call.
        let r = unsafe { libc::poll(arr.as_mut_ptr(), n as libc::nfds_t, timeout_ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Drop for DpdkGroup {
    fn drop(&mut self) {
        for p in &mut self.ports {
            if p.stash_len > 0 {
                // SAFETY: stashed mbufs are ours.
                unsafe { ffi::strait_mbuf_free_bulk(p.stash.as_mut_ptr(), p.stash_len as u32) };
            }
            if p.staged_len > 0 {
                // SAFETY: staged mbufs are ours.
                unsafe { ffi::strait_mbuf_free_bulk(p.staged.as_mut_ptr(), p.staged_len as u32) };
            }
        }
    }
}
