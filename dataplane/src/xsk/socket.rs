//! [`Port`]: one AF_XDP socket bound to one (interface, queue), with its own UMEM and rings.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::ring::{Consumer, Producer};
use super::umem::{Owner, Umem, FRAME_COUNT, FRAME_SIZE};
use super::{c_name, ifindex, last_error, XskError};
use crate::rewrite::{Frame, HEADROOM};
use crate::table;

/// Ring sizes in descriptors; each a power of two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSizes {
    /// Fill ring: empty frames offered to the kernel for receiving.
    pub fill: u32,
    /// Completion ring: frames the kernel has finished sending. At least `tx`, so every frame
    /// on the TX ring has a completion slot and TX never stalls on it.
    pub comp: u32,
    /// RX ring: received packets.
    pub rx: u32,
    /// TX ring: packets to send.
    pub tx: u32,
}

impl Default for RingSizes {
    /// 2048 each: libxdp's default is 2048 for fill/completion and 2048 for RX/TX, which at
    /// 10 Gbit/s of 64-byte packets (14.9 Mpps) is 137 µs of buffering, enough to ride over a
    /// scheduling hiccup of the worker without being so deep that a stalled worker hides for
    /// long; half of [`FRAME_COUNT`] so the fill ring can be kept full while the other half of
    /// the frames is in flight on the TX side.
    fn default() -> Self {
        Self {
            fill: 2048,
            comp: 2048,
            rx: 2048,
            tx: 2048,
        }
    }
}

/// How to bind: zero-copy, copy, or zero-copy falling back to copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BindPolicy {
    /// Try zero-copy; if the driver refuses it, bind in copy mode.
    #[default]
    ZeroCopyOrCopy,
    /// Zero-copy or fail.
    ZeroCopyOnly,
    /// Copy mode only (the kernel copies between its buffers and the UMEM).
    CopyOnly,
}

/// The mode a socket is bound in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindMode {
    /// The driver DMAs into the UMEM (`XDP_ZEROCOPY`).
    ZeroCopy,
    /// The kernel copies (`XDP_COPY`); the only mode on veth.
    Copy,
}

impl fmt::Display for BindMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BindMode::ZeroCopy => "zero-copy",
            BindMode::Copy => "copy",
        })
    }
}

/// What a [`Port`] binds to and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortConfig {
    /// Interface name.
    pub iface: String,
    /// NIC queue index.
    pub queue: u32,
    /// Index of this interface in [`table::ServiceTable::ports`]: the ingress port given to
    /// the pipeline, and the only egress port this socket can send on.
    pub table_port: u8,
    /// UMEM frames ([`FRAME_COUNT`] by default).
    pub frames: u32,
    /// Ring sizes.
    pub rings: RingSizes,
    /// Zero-copy or copy.
    pub bind: BindPolicy,
}

impl PortConfig {
    /// Defaults for `iface` queue `queue`: table port 0, [`FRAME_COUNT`] frames, default ring
    /// sizes, zero-copy falling back to copy.
    pub fn new(iface: &str, queue: u32) -> Self {
        Self {
            iface: iface.to_owned(),
            queue,
            table_port: 0,
            frames: FRAME_COUNT,
            rings: RingSizes::default(),
            bind: BindPolicy::default(),
        }
    }

    fn check(&self) -> Result<(), XskError> {
        let r = &self.rings;
        for (name, n) in [
            ("fill", r.fill),
            ("comp", r.comp),
            ("rx", r.rx),
            ("tx", r.tx),
        ] {
            if !n.is_power_of_two() {
                return Err(XskError::Config(format!(
                    "{name} ring size {n} is not a power of two"
                )));
            }
        }
        if r.comp < r.tx {
            return Err(XskError::Config(format!(
                "completion ring ({}) smaller than TX ring ({})",
                r.comp, r.tx
            )));
        }
        if self.frames < r.fill {
            return Err(XskError::Config(format!(
                "{} frames cannot fill a fill ring of {}",
                self.frames, r.fill
            )));
        }
        Ok(())
    }
}

/// Where every frame of a port is, from user space's view of the rings. Taken between
/// batches by the thread that owns the [`Port`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accounting {
    /// Frames in the UMEM.
    pub total: u32,
    /// Frames held by user space (the free list; the worker holds none between batches).
    pub held: u32,
    /// On the fill ring, not yet taken by the kernel.
    pub fill: u32,
    /// On the RX ring, not yet read by the worker.
    pub rx: u32,
    /// On the TX ring, not yet taken by the kernel.
    pub tx: u32,
    /// On the completion ring, not yet read by the worker.
    pub comp: u32,
    /// Taken by the kernel from the fill or TX ring and not yet put on the RX or completion
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

/// The kernel's per-socket counters (`getsockopt(XDP_STATISTICS)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// Packets dropped for reasons other than invalid descriptors.
    pub rx_dropped: u64,
    /// Invalid RX descriptors.
    pub rx_invalid_descs: u64,
    /// Invalid TX descriptors.
    pub tx_invalid_descs: u64,
    /// Packets dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Times the fill ring was empty when a packet arrived.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the TX ring was empty when the kernel looked.
    pub tx_ring_empty_descs: u64,
}

/// What the worker does with a frame after the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send it (from the frame's current head, with its current length).
    Tx,
    /// Back to the free list.
    Recycle,
}

/// What one RX batch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Batch {
    /// Frames read from the RX ring.
    pub rx: u32,
    /// Frames put on the TX ring.
    pub tx: u32,
    /// Frames the pipeline wanted sent that found the TX ring full (recycled).
    pub tx_full: u32,
    /// RX descriptors outside the UMEM or their frame (skipped; a kernel bug).
    pub invalid: u32,
}

/// One AF_XDP socket on one (interface, queue), its UMEM and its four rings.
///
/// Single-threaded by design: the worker that owns it is the only user of its rings and
/// frames. Field order is drop order: rings, then the socket, then the UMEM.
#[derive(Debug)]
pub struct Port {
    fill: Producer<u64>,
    comp: Consumer<u64>,
    rx: Consumer<libc::xdp_desc>,
    tx: Producer<libc::xdp_desc>,
    fd: OwnedFd,
    umem: Umem,
    iface: String,
    queue: u32,
    table_port: u8,
    mode: BindMode,
    zero_copy_refused: Option<io::Error>,
}

/// The socket and rings of one bind attempt.
struct Socket {
    fill: Producer<u64>,
    comp: Consumer<u64>,
    rx: Consumer<libc::xdp_desc>,
    tx: Producer<libc::xdp_desc>,
    fd: OwnedFd,
}

impl Port {
    /// Creates the UMEM, the socket and its rings, binds to `cfg.iface` queue `cfg.queue`
    /// (zero-copy first if the policy allows, then copy mode) and fills the fill ring.
    ///
    /// The calling thread's network namespace is the one the interface is looked up in. The
    /// socket receives nothing until an XDP program redirects to it
    /// ([`super::SteerProgram::register`]).
    ///
    /// # Errors
    /// [`XskError`] naming the failed call: no such interface, UMEM allocation or
    /// registration, ring setup, or `bind` (queue busy or absent, mode refused).
    pub fn open(cfg: &PortConfig) -> Result<Self, XskError> {
        cfg.check()?;
        let idx = ifindex(&cfg.iface)?;
        let umem_err = |call, source| XskError::Umem {
            iface: cfg.iface.clone(),
            queue: cfg.queue,
            call,
            source,
        };
        let umem = Umem::new(cfg.frames).map_err(|e| umem_err("mmap", e))?;
        let (sock, mode, zero_copy_refused) = match cfg.bind {
            BindPolicy::CopyOnly => (
                Socket::open(cfg, idx, &umem, BindMode::Copy)?,
                BindMode::Copy,
                None,
            ),
            BindPolicy::ZeroCopyOnly => (
                Socket::open(cfg, idx, &umem, BindMode::ZeroCopy)?,
                BindMode::ZeroCopy,
                None,
            ),
            BindPolicy::ZeroCopyOrCopy => match Socket::open(cfg, idx, &umem, BindMode::ZeroCopy) {
                Ok(s) => (s, BindMode::ZeroCopy, None),
                // Only a refused bind falls back; a socket that cannot even be created would
                // fail the same way in copy mode.
                Err(XskError::Bind { source, .. }) => (
                    Socket::open(cfg, idx, &umem, BindMode::Copy)?,
                    BindMode::Copy,
                    Some(source),
                ),
                Err(e) => return Err(e),
            },
        };
        let Socket {
            fill,
            comp,
            rx,
            tx,
            fd,
        } = sock;
        let mut port = Self {
            fill,
            comp,
            rx,
            tx,
            fd,
            umem,
            iface: cfg.iface.clone(),
            queue: cfg.queue,
            table_port: cfg.table_port,
            mode,
            zero_copy_refused,
        };
        port.refill();
        Ok(port)
    }

    /// The mode the socket is bound in.
    pub fn bind_mode(&self) -> BindMode {
        self.mode
    }

    /// Why zero-copy was refused, when the policy fell back to copy mode.
    pub fn zero_copy_refused(&self) -> Option<&io::Error> {
        self.zero_copy_refused.as_ref()
    }

    /// Interface name.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Queue index.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// This interface's index in the service table's ports.
    pub fn table_port(&self) -> u8 {
        self.table_port
    }

    /// Where every frame is; see [`Accounting`].
    pub fn accounting(&self) -> Accounting {
        let [free, fill_owned, worker, tx_owned] = self.umem.owners();
        let fill = self.fill.pending();
        let rx = self.rx.pending();
        let tx = self.tx.pending();
        let comp = self.comp.pending();
        let in_kernel = (fill_owned as i64 - fill as i64 - rx as i64)
            + (tx_owned as i64 - tx as i64 - comp as i64);
        Accounting {
            total: self.umem.count(),
            held: self.umem.free_len() as u32 + worker,
            fill,
            rx,
            tx,
            comp,
            in_kernel,
            misplaced: free.abs_diff(self.umem.free_len() as u32) + worker,
        }
    }

    /// The kernel's counters for this socket.
    ///
    /// # Errors
    /// [`XskError::Io`] if `getsockopt(XDP_STATISTICS)` fails.
    pub fn kernel_stats(&self) -> Result<KernelStats, XskError> {
        let mut s = libc::xdp_statistics {
            rx_dropped: 0,
            rx_invalid_descs: 0,
            tx_invalid_descs: 0,
            rx_ring_full: 0,
            rx_fill_ring_empty_descs: 0,
            tx_ring_empty_descs: 0,
        };
        getsockopt(self.fd.as_fd(), libc::XDP_STATISTICS, &mut s).map_err(|source| {
            XskError::Io {
                iface: self.iface.clone(),
                queue: self.queue,
                call: "getsockopt(XDP_STATISTICS)",
                source,
            }
        })?;
        Ok(KernelStats {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs,
            tx_ring_empty_descs: s.tx_ring_empty_descs,
        })
    }

    /// Moves completed TX frames to the free list. Returns how many.
    #[inline]
    pub(crate) fn reap_completions(&mut self) -> u32 {
        let n = self.comp.peek(u32::MAX);
        for i in 0..n {
            let addr = self.comp.read(i);
            match self.umem.frame_of(addr, 0) {
                Some(idx) => self.umem.recycle(idx, Owner::Tx),
                None => debug_assert!(false, "completion address {addr:#x} outside the UMEM"),
            }
        }
        self.comp.release(n);
        n
    }

    /// Moves free frames to the fill ring, as many as fit. Returns how many.
    #[inline]
    pub(crate) fn refill(&mut self) -> u32 {
        let want = self.umem.free_len() as u32;
        if want == 0 {
            return 0;
        }
        let n = self.fill.free(want).min(want);
        for i in 0..n {
            // `n <= free_len`, so the list has a frame for every slot.
            let Some(addr) = self.umem.pop_free() else {
                unreachable!("free list shorter than its length")
            };
            let idx = (addr / FRAME_SIZE as u64) as u32;
            self.umem.hand_over(idx, Owner::Free, Owner::Fill);
            self.fill.write(i, addr);
        }
        self.fill.submit(n);
        n
    }

    /// Descriptors waiting on the RX ring (at most `max`).
    #[inline]
    pub(crate) fn rx_ready(&mut self, max: u32) -> u32 {
        self.rx.peek(max)
    }

    /// Reads up to `max` received frames, gives each to `f` as a [`Frame`] spanning its whole
    /// UMEM chunk, and puts the ones `f` wants sent on the TX ring (from the frame's head
    /// after `f`, so encapsulation in the headroom needs no copy); the others go back to the
    /// free list. Does not kick the kernel; see [`Port::flush_tx`].
    #[inline]
    pub(crate) fn rx_batch(
        &mut self,
        max: u32,
        mut f: impl FnMut(&mut Frame<'_>) -> Action,
    ) -> Batch {
        let n = self.rx.peek(max);
        let mut b = Batch {
            rx: n,
            ..Batch::default()
        };
        if n == 0 {
            return b;
        }
        let room = self.tx.free(n).min(n);
        for i in 0..n {
            let d = self.rx.read(i);
            let Some(idx) = self.umem.frame_of(d.addr, d.len) else {
                b.invalid += 1;
                continue;
            };
            self.umem.hand_over(idx, Owner::Fill, Owner::Worker);
            let head = (d.addr % FRAME_SIZE as u64) as usize;
            let mut frame = Frame::new(self.umem.chunk_mut(idx), head, d.len as usize);
            let action = f(&mut frame);
            let (head, len) = (frame.head(), frame.len());
            match action {
                Action::Tx if b.tx < room => {
                    self.umem.hand_over(idx, Owner::Worker, Owner::Tx);
                    self.tx.write(
                        b.tx,
                        libc::xdp_desc {
                            addr: idx as u64 * FRAME_SIZE as u64 + head as u64,
                            len: len as u32,
                            options: 0,
                        },
                    );
                    b.tx += 1;
                }
                Action::Tx => {
                    b.tx_full += 1;
                    self.umem.recycle(idx, Owner::Worker);
                }
                Action::Recycle => self.umem.recycle(idx, Owner::Worker),
            }
        }
        self.rx.release(n);
        self.tx.submit(b.tx);
        b
    }

    /// Asks the kernel to send what is on the TX ring, if there is anything and the kernel set
    /// `XDP_RING_NEED_WAKEUP` on it (always in copy mode, where each `sendto` sends a bounded
    /// number of frames). Returns whether a syscall was made.
    ///
    /// # Errors
    /// [`XskError::Io`] for a `sendto` error other than the transient `EAGAIN`, `EBUSY`,
    /// `ENOBUFS` (retried on the next call) and `ENETDOWN` (the link is down; frames stay
    /// queued).
    #[inline]
    pub(crate) fn flush_tx(&mut self) -> Result<bool, XskError> {
        if !self.tx.needs_wakeup() || self.tx.pending() == 0 {
            return Ok(false);
        }
        // SAFETY: a zero-length sendto with null buffer and address, which AF_XDP takes as
        // "process the TX ring"; nothing is read from or written to user memory.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            let e = last_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN) => {}
                _ => return Err(self.io_error("sendto", e)),
            }
        }
        Ok(true)
    }

    /// Kicks the driver to refill its RX buffers from the fill ring if it asked for it
    /// (zero-copy drivers with need_wakeup; never in copy mode). Returns whether a syscall
    /// was made.
    ///
    /// # Errors
    /// [`XskError::Io`] for a `recvfrom` error other than `EAGAIN`/`EBUSY`/`ENETDOWN`.
    #[inline]
    pub(crate) fn wake_fill(&mut self) -> Result<bool, XskError> {
        if !self.fill.needs_wakeup() {
            return Ok(false);
        }
        // SAFETY: a zero-length recvfrom with null buffer and address, which AF_XDP takes as
        // a wakeup for the RX side; nothing is written to user memory.
        let r = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = last_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EBUSY | libc::ENETDOWN) => {}
                _ => return Err(self.io_error("recvfrom", e)),
            }
        }
        Ok(true)
    }

    /// Sleeps until the RX ring has a packet or `timeout_ms` passes (`poll(2)`; in copy mode
    /// the poll also drives pending TX).
    ///
    /// # Errors
    /// [`XskError::Io`] if `poll` fails other than by a signal.
    pub(crate) fn wait_rx(&mut self, timeout_ms: i32) -> Result<(), XskError> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd that lives across the call.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if r < 0 {
            let e = last_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(self.io_error("poll", e));
            }
        }
        Ok(())
    }

    fn io_error(&self, call: &'static str, source: io::Error) -> XskError {
        XskError::Io {
            iface: self.iface.clone(),
            queue: self.queue,
            call,
            source,
        }
    }
}

impl AsFd for Port {
    /// The AF_XDP socket, for the XSKMAP.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

// SAFETY: a Port owns its socket, ring mappings and UMEM exclusively (none of their pointers
// escape except through borrows of the Port), and nothing in them is tied to the thread that
// created them, so moving the Port to a worker thread is sound. It is not Sync: the rings'
// cached indices assume a single user.
unsafe impl Send for Port {}

impl Socket {
    fn open(cfg: &PortConfig, ifindex: u32, umem: &Umem, mode: BindMode) -> Result<Self, XskError> {
        let err = |call, source| XskError::Socket {
            iface: cfg.iface.clone(),
            queue: cfg.queue,
            call,
            source,
        };
        // SAFETY: plain socket(2); the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(err("socket(AF_XDP)", last_error()));
        }
        // SAFETY: `raw` is a new, valid descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let reg = libc::xdp_umem_reg {
            addr: umem.addr(),
            len: umem.len() as u64,
            chunk_size: FRAME_SIZE,
            headroom: HEADROOM as u32,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(fd.as_fd(), libc::XDP_UMEM_REG, &reg).map_err(|source| XskError::Umem {
            iface: cfg.iface.clone(),
            queue: cfg.queue,
            call: "setsockopt(XDP_UMEM_REG)",
            source,
        })?;
        let r = &cfg.rings;
        for (opt, size, call) in [
            (
                libc::XDP_UMEM_FILL_RING,
                r.fill,
                "setsockopt(XDP_UMEM_FILL_RING)",
            ),
            (
                libc::XDP_UMEM_COMPLETION_RING,
                r.comp,
                "setsockopt(XDP_UMEM_COMPLETION_RING)",
            ),
            (libc::XDP_RX_RING, r.rx, "setsockopt(XDP_RX_RING)"),
            (libc::XDP_TX_RING, r.tx, "setsockopt(XDP_TX_RING)"),
        ] {
            setsockopt(fd.as_fd(), opt, &size).map_err(|e| err(call, e))?;
        }
        let zero = libc::xdp_ring_offset {
            producer: 0,
            consumer: 0,
            desc: 0,
            flags: 0,
        };
        let mut off = libc::xdp_mmap_offsets {
            rx: zero,
            tx: zero,
            fr: zero,
            cr: zero,
        };
        getsockopt(fd.as_fd(), libc::XDP_MMAP_OFFSETS, &mut off)
            .map_err(|e| err("getsockopt(XDP_MMAP_OFFSETS)", e))?;
        let fill = Producer::map(
            fd.as_fd(),
            &off.fr,
            r.fill,
            libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t,
        )
        .map_err(|e| err("mmap(fill ring)", e))?;
        let comp = Consumer::map(
            fd.as_fd(),
            &off.cr,
            r.comp,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t,
        )
        .map_err(|e| err("mmap(completion ring)", e))?;
        let rx = Consumer::map(fd.as_fd(), &off.rx, r.rx, libc::XDP_PGOFF_RX_RING)
            .map_err(|e| err("mmap(RX ring)", e))?;
        let tx = Producer::map(fd.as_fd(), &off.tx, r.tx, libc::XDP_PGOFF_TX_RING)
            .map_err(|e| err("mmap(TX ring)", e))?;
        debug_assert_eq!(fill.size(), r.fill);

        let flags = libc::XDP_USE_NEED_WAKEUP
            | match mode {
                BindMode::ZeroCopy => libc::XDP_ZEROCOPY,
                BindMode::Copy => libc::XDP_COPY,
            };
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: cfg.queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `sa` is a valid sockaddr_xdp and the length passed is its size; bind only
        // reads it.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_xdp).cast(),
                size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(XskError::Bind {
                iface: cfg.iface.clone(),
                queue: cfg.queue,
                mode,
                source: last_error(),
            });
        }
        Ok(Self {
            fill,
            comp,
            rx,
            tx,
            fd,
        })
    }
}

/// `setsockopt(fd, SOL_XDP, opt, value)`.
fn setsockopt<T>(fd: BorrowedFd<'_>, opt: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live T of `size_of::<T>()` bytes, which the kernel only
    // reads; T is one of the plain C structs or integers the option expects.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(last_error());
    }
    Ok(())
}

/// `getsockopt(fd, SOL_XDP, opt, out)`, requiring the kernel to fill all of `out`.
fn getsockopt<T>(fd: BorrowedFd<'_>, opt: libc::c_int, out: &mut T) -> io::Result<()> {
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `out` points to a live, writable T of `len` bytes; the kernel writes at most
    // `len` bytes and reports how many in `len`. T is a plain C struct for which any bytes
    // are a valid value.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            (out as *mut T).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(last_error());
    }
    if len as usize != size_of::<T>() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "kernel returned {len} bytes, expected {} (kernel too old)",
                size_of::<T>()
            ),
        ));
    }
    Ok(())
}

/// The MAC and MTU of `iface` (in the calling thread's network namespace), as the service
/// table's [`table::Port`] wants them.
///
/// # Errors
/// [`XskError::Link`] naming the failed `socket`/`ioctl`.
pub fn interface_port(iface: &str) -> Result<table::Port, XskError> {
    let err = |call, source| XskError::Link {
        iface: iface.to_owned(),
        call,
        source,
    };
    let name = c_name(iface)?;
    let bytes = name.as_bytes_with_nul();
    if bytes.len() > libc::IFNAMSIZ {
        return Err(err(
            "ifreq",
            io::Error::new(io::ErrorKind::InvalidInput, "interface name too long"),
        ));
    }
    // SAFETY: plain socket(2); checked below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(err("socket(AF_INET)", last_error()));
    }
    // SAFETY: `raw` is a new, valid descriptor that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut name_field = [0 as libc::c_char; libc::IFNAMSIZ];
    for (d, s) in name_field.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let mut req = libc::ifreq {
        ifr_name: name_field,
        ifr_ifru: libc::__c_anonymous_ifr_ifru { ifru_mtu: 0 },
    };
    // SAFETY: SIOCGIFHWADDR reads the name from and writes the hardware address into `req`,
    // a valid ifreq that lives across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } < 0 {
        return Err(err("ioctl(SIOCGIFHWADDR)", last_error()));
    }
    // SAFETY: after SIOCGIFHWADDR succeeded the union holds `ifru_hwaddr`.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    req.ifr_ifru = libc::__c_anonymous_ifr_ifru { ifru_mtu: 0 };
    // SAFETY: as above, for SIOCGIFMTU, which writes `ifru_mtu`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut req) } < 0 {
        return Err(err("ioctl(SIOCGIFMTU)", last_error()));
    }
    // SAFETY: after SIOCGIFMTU succeeded the union holds `ifru_mtu`.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    Ok(table::Port {
        mac,
        mtu: mtu.clamp(0, u16::MAX as i32) as u16,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_checked_before_any_syscall() {
        let bad = |f: fn(&mut PortConfig)| {
            let mut c = PortConfig::new("strait-nope0", 0);
            f(&mut c);
            matches!(Port::open(&c), Err(XskError::Config(_)))
        };
        assert!(bad(|c| c.rings.fill = 1000));
        assert!(bad(|c| c.rings.rx = 0));
        assert!(bad(|c| {
            c.rings.comp = 1024;
            c.rings.tx = 2048;
        }));
        assert!(bad(|c| c.frames = 100));
    }

    #[test]
    fn a_missing_interface_is_named() {
        let e = Port::open(&PortConfig::new("strait-nope0", 0)).expect_err("no such interface");
        assert!(matches!(e, XskError::NoInterface { .. }), "{e:?}");
        assert!(e.to_string().contains("strait-nope0"), "{e}");
    }

    #[test]
    fn loopback_has_a_zero_mac() {
        let p = interface_port("lo").expect("lo exists in every namespace");
        assert_eq!(p.mac, [0; 6]);
        assert!(p.mtu >= 1500);
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
