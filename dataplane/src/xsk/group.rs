//! [`QueueGroup`]: the sockets of one queue index on every interface, sharing one UMEM.
//!
//! In a two-arm gateway, nat traffic arrives on the client interface and leaves on the
//! backend interface, and its replies the other way. One worker serves queue `q` of every
//! interface, and the group's sockets share one UMEM (`XDP_SHARED_UMEM`), so a frame received
//! on one interface is put on another interface's TX ring as it is: no copy, and the frame
//! comes back on that socket's completion ring to the same free list.
//!
//! ```text
//!                      one UMEM, one free list, one worker
//!   veth-c queue q: fill ─► RX ──┐                       ┌─► TX ─► completion
//!                                ├─► pipeline ─► Verdict ┤
//!   veth-b queue q: fill ─► RX ──┘     Tx { port }       └─► TX ─► completion
//! ```
//!
//! The first socket registers the UMEM and binds in the chosen mode; every other one binds
//! with `XDP_SHARED_UMEM` naming the first, after registering fill and completion rings of
//! its own (the kernel requires them for another device or queue, supported since Linux
//! 5.10). The kernel gives every socket of a shared UMEM the first one's mode, so a group is
//! zero-copy only if all its interfaces are; under [`BindPolicy::ZeroCopyOrCopy`] a refusal by
//! any member rebinds the whole group in copy mode.

use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::event::{self, PollFd, PollFlags, Timespec};
use rustix::io::Errno;

use super::socket::{BindMode, BindPolicy, KernelStats, PortConfig, QueueSocket};
use super::umem::{Held, Owner, Umem, FRAME_COUNT};
use super::XskError;
use crate::rewrite::Frame;

/// Most sockets in a group (interfaces served by one worker). Per-turn arrays of the worker
/// (poll descriptors) are sized by it, on the stack. A gateway has one interface (one-arm) or
/// two (two-arm); eight leaves room for more arms while keeping those arrays small.
pub const MAX_GROUP_PORTS: usize = 8;

/// "No socket" in the table-port lookup.
const NO_PORT: u8 = u8::MAX;

/// Most TX kick rounds per [`QueueGroup::drain_tx`]: a turn stages up to a batch per socket
/// plus handed-in frames, at 32 frames per copy-mode `sendto`, with room for a kick that finds
/// the kernel busy.
const TX_KICKS: u32 = 4;

/// How long a bind waits for a busy queue to be freed by a socket closed just before
/// ([`QueueGroup::open`]).
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// How often a bind to a busy queue is tried again within [`RELEASE_WAIT`].
const RELEASE_POLL: Duration = Duration::from_millis(10);

/// Whether a bind's error says the queue is taken (`EBUSY`).
fn is_busy(source: &io::Error) -> bool {
    source.raw_os_error() == Some(Errno::BUSY.raw_os_error())
}

/// What a [`QueueGroup`] binds to and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupConfig {
    /// The NIC queue index, the same on every interface.
    pub queue: u32,
    /// One socket per interface, 1 to [`MAX_GROUP_PORTS`], distinct interfaces and table
    /// ports.
    pub ports: Vec<PortConfig>,
    /// UMEM frames for the whole group ([`FRAME_COUNT`] per socket by default); at least the
    /// sum of the fill rings.
    pub frames: u32,
    /// Zero-copy or copy.
    pub bind: BindPolicy,
}

impl GroupConfig {
    /// Queue `queue` of `ports`, [`FRAME_COUNT`] frames per socket, zero-copy falling back to
    /// copy.
    pub fn new(queue: u32, ports: Vec<PortConfig>) -> Self {
        Self {
            queue,
            frames: FRAME_COUNT.saturating_mul(ports.len().max(1) as u32),
            ports,
            bind: BindPolicy::default(),
        }
    }

    /// A group of one: queue `queue` of `iface`, as table port 0.
    pub fn single(iface: &str, queue: u32) -> Self {
        Self::new(queue, vec![PortConfig::new(iface, 0)])
    }

    fn check(&self) -> Result<(), XskError> {
        if self.ports.is_empty() || self.ports.len() > MAX_GROUP_PORTS {
            return Err(XskError::Config(format!(
                "a queue group has 1 to {MAX_GROUP_PORTS} interfaces, not {}",
                self.ports.len()
            )));
        }
        for (i, p) in self.ports.iter().enumerate() {
            p.check()?;
            if p.table_port == NO_PORT {
                return Err(XskError::Config(format!(
                    "{}: table port {NO_PORT} is reserved",
                    p.iface
                )));
            }
            if let Some(q) = self.ports[..i]
                .iter()
                .find(|q| q.iface == p.iface || q.table_port == p.table_port)
            {
                return Err(XskError::Config(format!(
                    "{} (table port {}) and {} (table port {}) in one group: interfaces and \
                     table ports must differ",
                    q.iface, q.table_port, p.iface, p.table_port
                )));
            }
        }
        let fill: u64 = self.ports.iter().map(|p| p.rings.fill as u64).sum();
        if (self.frames as u64) < fill {
            return Err(XskError::Config(format!(
                "{} frames cannot fill the group's fill rings ({fill} slots)",
                self.frames
            )));
        }
        Ok(())
    }
}

/// Where every frame of a group's UMEM is, from user space's view of the rings (each ring
/// count summed over the group's sockets). Taken between batches by the thread that owns the
/// [`QueueGroup`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accounting {
    /// Frames in the UMEM.
    pub total: u32,
    /// Frames held by user space (the free list; the worker holds none between batches).
    pub held: u32,
    /// On fill rings, not yet taken by the kernel.
    pub fill: u32,
    /// On RX rings, not yet read by the worker.
    pub rx: u32,
    /// On TX rings, not yet taken by the kernel.
    pub tx: u32,
    /// On completion rings, not yet read by the worker.
    pub comp: u32,
    /// Taken by the kernel from a fill or TX ring and not yet put on an RX or completion
    /// ring: buffers a zero-copy driver has posted, packets being sent. Zero at rest in copy
    /// mode. Negative would mean the rings hold frames user space never gave the kernel.
    pub in_kernel: i64,
    /// Frames whose recorded owner disagrees with the free list (always 0 unless user space
    /// lost or duplicated a frame).
    pub misplaced: u32,
}

impl Accounting {
    /// `held + fill + rx + tx + comp + in_kernel == total`, with `in_kernel >= 0` and no
    /// misplaced frame: no frame lost or counted twice.
    pub fn balanced(&self) -> bool {
        let sum = self.held as i64
            + self.fill as i64
            + self.rx as i64
            + self.tx as i64
            + self.comp as i64
            + self.in_kernel;
        sum == self.total as i64 && self.in_kernel >= 0 && self.misplaced == 0
    }

    /// Balanced, and every frame is in a ring or held: `fill + rx + tx + comp + held ==
    /// total`. Holds in copy mode once traffic has stopped and sends have completed.
    pub fn at_rest(&self) -> bool {
        self.balanced() && self.in_kernel == 0
    }
}

/// The AF_XDP sockets of one queue index on one or more interfaces, sharing one UMEM; the unit
/// one worker serves.
///
/// Its frame calls (`read_rx`, `lend`, `stage_tx`, `submit_tx`, `reap_completions`,
/// `refill`, `take_free`, `recycle`, ...) are public so that loops other than the gateway's
/// worker (the lab's generator and `limit` forwarder) drive the rings with the same
/// discipline, without `unsafe` of their own. A [`Held`] is only a frame's name: every call
/// checks in the UMEM's books that user space owns the frame, so a stale or forged one
/// panics instead of touching memory the kernel owns.
///
/// Field order is drop order: the sockets (and their rings), then the UMEM they use.
#[derive(Debug)]
pub struct QueueGroup {
    ports: Vec<QueueSocket>,
    umem: Umem,
    /// Socket index by table port, [`NO_PORT`] where the group has no socket.
    by_table_port: [u8; 256],
    queue: u32,
    mode: BindMode,
    zero_copy_refused: Option<io::Error>,
    /// Socket whose fill ring is refilled first next turn, so a short free list is shared
    /// out in turn.
    refill_first: usize,
}

impl QueueGroup {
    /// Creates the UMEM and a socket per configured interface on queue `cfg.queue`, binds them
    /// (zero-copy first if the policy allows, then copy mode), and fills every fill ring.
    ///
    /// The calling thread's network namespace is the one the interfaces are looked up in. The
    /// sockets receive nothing until an XDP program redirects to them
    /// ([`super::SteerProgram::register`] with [`QueueGroup::ports`]).
    ///
    /// # Errors
    /// [`XskError`] naming the failed call: invalid configuration, no such interface, UMEM
    /// allocation or registration, ring setup, or `bind` (queue absent, mode refused, shared
    /// UMEM refused by a kernel before 5.10, or queue still busy after [`RELEASE_WAIT`]: a
    /// queue freed by a socket closed just before is waited for).
    pub fn open(cfg: &GroupConfig) -> Result<Self, XskError> {
        cfg.check()?;
        let (ports, umem, mode, zero_copy_refused) = match cfg.bind {
            BindPolicy::CopyOnly => {
                let (p, u) = Self::bind_all(cfg, BindMode::Copy)?;
                (p, u, BindMode::Copy, None)
            }
            BindPolicy::ZeroCopyOnly => {
                let (p, u) = Self::bind_all(cfg, BindMode::ZeroCopy)?;
                (p, u, BindMode::ZeroCopy, None)
            }
            BindPolicy::ZeroCopyOrCopy => match Self::bind_all(cfg, BindMode::ZeroCopy) {
                Ok((p, u)) => (p, u, BindMode::ZeroCopy, None),
                // Only a refused bind falls back; a socket that cannot even be created would
                // fail the same way in copy mode, and so would a queue that is busy.
                Err(XskError::Bind { source, .. }) if !is_busy(&source) => {
                    let (p, u) = Self::bind_all(cfg, BindMode::Copy)?;
                    (p, u, BindMode::Copy, Some(source))
                }
                Err(e) => return Err(e),
            },
        };
        let mut by_table_port = [NO_PORT; 256];
        for (i, p) in ports.iter().enumerate() {
            by_table_port[p.table_port() as usize] = i as u8;
        }
        let mut group = Self {
            ports,
            umem,
            by_table_port,
            queue: cfg.queue,
            mode,
            zero_copy_refused,
            refill_first: 0,
        };
        group.refill();
        Ok(group)
    }

    /// [`Self::bind_once`], tried again while a queue is busy, for up to [`RELEASE_WAIT`].
    ///
    /// The kernel frees a closed socket's queue late: the queue's buffer pool is released by
    /// deferred work in the kernel, tens of milliseconds after the close (40-90 ms measured on
    /// veth, longer on a loaded machine). Until then a bind to that queue fails with `EBUSY`.
    /// A gateway restarted at once, or a worker reopened on the same queue, meets exactly
    /// that window. A queue held by a live socket stays busy, and the bind error is returned
    /// when the wait is over.
    fn bind_all(cfg: &GroupConfig, mode: BindMode) -> Result<(Vec<QueueSocket>, Umem), XskError> {
        let deadline = Instant::now() + RELEASE_WAIT;
        loop {
            match Self::bind_once(cfg, mode) {
                Err(XskError::Bind { ref source, .. })
                    if is_busy(source) && Instant::now() < deadline =>
                {
                    std::thread::sleep(RELEASE_POLL)
                }
                done => return done,
            }
        }
    }

    /// A fresh UMEM and every socket bound in `mode`: the first registers the UMEM, the others
    /// share it. On error everything made so far is closed.
    fn bind_once(cfg: &GroupConfig, mode: BindMode) -> Result<(Vec<QueueSocket>, Umem), XskError> {
        let first = &cfg.ports[0];
        let umem = Umem::new(cfg.frames).map_err(|source| XskError::Umem {
            iface: first.iface.clone(),
            queue: cfg.queue,
            call: "mmap",
            source,
        })?;
        let mut ports: Vec<QueueSocket> = Vec::with_capacity(cfg.ports.len());
        for pc in &cfg.ports {
            let shared = ports.first().map(|p| p.as_fd());
            let port = QueueSocket::open(pc, cfg.queue, &umem, mode, shared)?;
            ports.push(port);
        }
        Ok((ports, umem))
    }

    /// The mode the sockets are bound in.
    pub fn bind_mode(&self) -> BindMode {
        self.mode
    }

    /// Why zero-copy was refused, when the policy fell back to copy mode.
    pub fn zero_copy_refused(&self) -> Option<&io::Error> {
        self.zero_copy_refused.as_ref()
    }

    /// The queue index.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// The sockets, in configuration order.
    pub fn ports(&self) -> &[QueueSocket] {
        &self.ports
    }

    /// A name for logs and metrics: `iface/q` for one interface, `a+b/q` for several.
    pub fn name(&self) -> String {
        let ifaces: Vec<&str> = self.ports.iter().map(QueueSocket::iface).collect();
        format!("{}/{}", ifaces.join("+"), self.queue)
    }

    /// Where every frame of the UMEM is; see [`Accounting`].
    pub fn accounting(&self) -> Accounting {
        let [free, fill_owned, worker, tx_owned, lent] = self.umem.owners();
        let [mut fill, mut rx, mut tx, mut comp] = [0u32; 4];
        for p in &self.ports {
            let [f, r, t, c] = p.ring_levels();
            fill += f;
            rx += r;
            tx += t;
            comp += c;
        }
        let in_kernel = (fill_owned as i64 - fill as i64 - rx as i64)
            + (tx_owned as i64 - tx as i64 - comp as i64);
        let free_len = self.umem.free_len() as u32;
        Accounting {
            total: self.umem.count(),
            held: free_len + worker + lent,
            fill,
            rx,
            tx,
            comp,
            in_kernel,
            misplaced: free.abs_diff(free_len) + worker + lent,
        }
    }

    /// The kernel's counters, summed over the group's sockets.
    ///
    /// # Errors
    /// [`XskError::Io`] if `getsockopt(XDP_STATISTICS)` fails on a socket.
    pub fn kernel_stats(&self) -> Result<KernelStats, XskError> {
        let mut sum = KernelStats::default();
        for p in &self.ports {
            sum.add(&p.kernel_stats()?);
        }
        Ok(sum)
    }

    /// The socket sending on table port `port`, if the group has one.
    #[inline(always)]
    pub fn socket_for(&self, port: u8) -> Option<usize> {
        match self.by_table_port[port as usize] {
            NO_PORT => None,
            s => Some(s as usize),
        }
    }

    /// Moves completed TX frames of every socket to the free list. Returns how many.
    #[inline]
    pub fn reap_completions(&mut self) -> u32 {
        let umem = &mut self.umem;
        self.ports
            .iter_mut()
            .map(|p| p.reap_completions(umem))
            .sum()
    }

    /// Moves free frames to the fill rings, starting with a different socket each call.
    /// Returns how many.
    #[inline]
    pub fn refill(&mut self) -> u32 {
        let k = self.ports.len();
        let first = self.refill_first;
        self.refill_first = (first + 1) % k;
        let mut n = 0;
        for i in 0..k {
            n += self.ports[(first + i) % k].refill(&mut self.umem);
        }
        n
    }

    /// Whether any socket has a received frame waiting.
    #[inline]
    pub fn rx_ready(&mut self) -> bool {
        self.ports.iter_mut().any(|p| p.rx_ready(1) > 0)
    }

    /// Reads up to `out.len()` frames from socket `s`'s RX ring; see [`QueueSocket::read_rx`].
    #[inline]
    pub fn read_rx(&mut self, s: usize, out: &mut [Held]) -> (usize, u32) {
        self.ports[s].read_rx(&mut self.umem, out)
    }

    /// Lends held frames to the pipeline; see [`Umem::lend`].
    #[inline]
    pub fn lend<'a>(&'a mut self, batch: &[Held], out: &mut [Frame<'a>]) {
        self.umem.lend(batch, out);
    }

    /// The packet of a held frame.
    #[inline]
    pub fn packet(&self, h: &Held) -> &[u8] {
        self.umem.packet(h)
    }

    /// A free frame holding a copy of `packet`, as received on `ingress`; see
    /// [`Umem::copy_in`].
    #[inline]
    pub fn copy_in(&mut self, ingress: u8, packet: &[u8]) -> Option<Held> {
        self.umem.copy_in(ingress, packet)
    }

    /// Takes a frame off the free list for user space to write and send (a generator's TX
    /// frame), with its packet at `head`, `len` bytes; `None` when no frame is free.
    #[inline]
    pub fn take_free(&mut self, head: u32, len: u32) -> Option<Held> {
        let addr = self.umem.pop_free()?;
        let idx = (addr / super::FRAME_SIZE as u64) as u32;
        self.umem.hand_over(idx, Owner::Free, Owner::Worker);
        Some(Held {
            idx,
            head,
            len,
            ingress: 0,
        })
    }

    /// Returns a held frame to the free list.
    #[inline]
    pub fn recycle(&mut self, h: &Held) {
        self.umem.recycle(h.idx, Owner::Worker);
    }

    /// Stages a held frame on socket `s`'s TX ring; see [`QueueSocket::stage_tx`].
    #[inline]
    pub fn stage_tx(&mut self, s: usize, h: &Held) -> bool {
        self.ports[s].stage_tx(&mut self.umem, h)
    }

    /// Publishes every socket's staged TX descriptors. Returns how many.
    #[inline]
    pub fn submit_tx(&mut self) -> u32 {
        self.ports.iter_mut().map(QueueSocket::submit_tx).sum()
    }

    /// [`QueueSocket::flush_tx`] on every socket. Returns the syscalls made.
    ///
    /// # Errors
    /// As [`QueueSocket::flush_tx`].
    #[inline]
    pub fn flush_tx(&mut self) -> Result<u32, XskError> {
        let mut n = 0;
        for p in &mut self.ports {
            n += p.flush_tx()? as u32;
        }
        Ok(n)
    }

    /// Kicks TX until every socket's ring is empty, at most [`TX_KICKS`] rounds: in copy
    /// mode one `sendto` sends at most 32 frames (the kernel's TX_BATCH_SIZE), fewer than a
    /// turn can stage, and frames left waiting let the RX ring overflow under load, so the
    /// excess is better dropped by the kernel there, before any work was spent on it.
    /// [`Self::flush_tx`] makes no syscall once the rings are empty or the kernel does not
    /// ask for one. Returns the syscalls made.
    ///
    /// # Errors
    /// As [`QueueSocket::flush_tx`].
    #[inline]
    pub fn drain_tx(&mut self) -> Result<u32, XskError> {
        let mut n = 0;
        for _ in 0..TX_KICKS {
            let k = self.flush_tx()?;
            n += k;
            if k == 0 {
                break;
            }
        }
        Ok(n)
    }

    /// [`QueueSocket::wake_fill`] on every socket. Returns the syscalls made.
    ///
    /// # Errors
    /// As [`QueueSocket::wake_fill`].
    #[inline]
    pub fn wake_fill(&mut self) -> Result<u32, XskError> {
        let mut n = 0;
        for p in &mut self.ports {
            n += p.wake_fill()? as u32;
        }
        Ok(n)
    }

    /// Sleeps until a socket's RX ring has a packet or `timeout_ms` passes (`poll(2)` over
    /// the group; in copy mode the poll also drives pending TX).
    ///
    /// # Errors
    /// [`XskError::Io`] if `poll` fails other than by a signal.
    pub fn wait_rx(&mut self, timeout_ms: i32) -> Result<(), XskError> {
        let n = self.ports.len();
        // An array on the stack, not a Vec: the worker idles through here. Slots past `n`
        // repeat the last socket and are not passed to poll.
        let mut fds: [PollFd<'_>; MAX_GROUP_PORTS] =
            std::array::from_fn(|i| PollFd::new(&self.ports[i.min(n - 1)], PollFlags::IN));
        let timeout = (timeout_ms >= 0).then(|| Timespec {
            tv_sec: (timeout_ms / 1000).into(),
            tv_nsec: ((timeout_ms % 1000) * 1_000_000).into(),
        });
        match event::poll(&mut fds[..n], timeout.as_ref()) {
            Ok(_) | Err(Errno::INTR) => Ok(()),
            Err(e) => Err(self.ports[0].io_error("poll", e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_checked_before_any_syscall() {
        let bad = |f: fn(&mut GroupConfig)| {
            let mut c = GroupConfig::single("strait-nope0", 0);
            f(&mut c);
            matches!(QueueGroup::open(&c), Err(XskError::Config(_)))
        };
        assert!(bad(|c| c.ports[0].rings.fill = 1000));
        assert!(bad(|c| c.ports[0].rings.rx = 0));
        assert!(bad(|c| {
            c.ports[0].rings.comp = 1024;
            c.ports[0].rings.tx = 2048;
        }));
        assert!(bad(|c| c.frames = 100));
        assert!(bad(|c| c.ports.clear()));
        assert!(bad(|c| {
            let again = c.ports[0].clone();
            c.ports.push(again);
        }));
        assert!(bad(|c| {
            let mut other = PortConfig::new("strait-nope1", 0);
            other.table_port = c.ports[0].table_port;
            c.ports.push(other);
        }));
        assert!(bad(|c| {
            c.ports = (0..=MAX_GROUP_PORTS)
                .map(|i| PortConfig::new(&format!("strait-nope{i}"), i as u8))
                .collect()
        }));
        assert!(bad(|c| c.ports[0].table_port = NO_PORT));
    }

    #[test]
    fn frames_default_to_a_share_per_socket() {
        let c = GroupConfig::new(3, vec![PortConfig::new("a", 0), PortConfig::new("b", 1)]);
        assert_eq!(c.frames, 2 * FRAME_COUNT);
        assert_eq!(c.queue, 3);
    }

    #[test]
    fn a_missing_interface_is_named() {
        let e = QueueGroup::open(&GroupConfig::single("strait-nope0", 0))
            .expect_err("no such interface");
        assert!(matches!(e, XskError::NoInterface { .. }), "{e:?}");
        assert!(e.to_string().contains("strait-nope0"), "{e}");
    }

    #[test]
    fn accounting_identities() {
        let mut a = Accounting {
            total: 8,
            held: 2,
            fill: 3,
            rx: 1,
            tx: 1,
            comp: 0,
            in_kernel: 1,
            misplaced: 0,
        };
        assert!(a.balanced());
        assert!(!a.at_rest(), "a frame is still in the kernel");
        a.in_kernel = 0;
        a.comp = 1;
        assert!(a.at_rest());
        a.misplaced = 1;
        assert!(!a.balanced());
        a.misplaced = 0;
        a.held = 3;
        a.in_kernel = -1;
        assert!(
            !a.balanced(),
            "the rings cannot hold more than they were given"
        );
    }
}
