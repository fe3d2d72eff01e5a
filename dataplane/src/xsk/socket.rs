//! [`Port`]: one AF_XDP socket bound to one (interface, queue), and its four rings. The
//! UMEM belongs to the [`super::QueueGroup`] the socket is a member of.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::ring::{Consumer, Producer};
use super::umem::{Held, Owner, Umem, FRAME_SIZE};
use super::{c_name, ifindex, last_error, XskError};
use crate::rewrite::HEADROOM;
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
    /// long; half of [`super::FRAME_COUNT`] so the fill ring can be kept full while the other
    /// half of the frames is in flight on the TX side.
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

/// One member of a queue group: which interface, and its place in the service table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortConfig {
    /// Interface name.
    pub iface: String,
    /// Index of this interface in [`table::ServiceTable::ports`]: the ingress port given to
    /// the pipeline for frames received here, and the egress port that sends on this socket.
    pub table_port: u8,
    /// Ring sizes of this socket.
    pub rings: RingSizes,
}

impl PortConfig {
    /// `iface` as table port `table_port`, default ring sizes.
    pub fn new(iface: &str, table_port: u8) -> Self {
        Self {
            iface: iface.to_owned(),
            table_port,
            rings: RingSizes::default(),
        }
    }

    pub(crate) fn check(&self) -> Result<(), XskError> {
        let r = &self.rings;
        for (name, n) in [
            ("fill", r.fill),
            ("comp", r.comp),
            ("rx", r.rx),
            ("tx", r.tx),
        ] {
            if !n.is_power_of_two() {
                return Err(XskError::Config(format!(
                    "{}: {name} ring size {n} is not a power of two",
                    self.iface
                )));
            }
        }
        if r.comp < r.tx {
            return Err(XskError::Config(format!(
                "{}: completion ring ({}) smaller than TX ring ({})",
                self.iface, r.comp, r.tx
            )));
        }
        Ok(())
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

impl KernelStats {
    /// Adds another socket's counters into these (for a group's totals).
    pub fn add(&mut self, o: &KernelStats) {
        self.rx_dropped += o.rx_dropped;
        self.rx_invalid_descs += o.rx_invalid_descs;
        self.tx_invalid_descs += o.tx_invalid_descs;
        self.rx_ring_full += o.rx_ring_full;
        self.rx_fill_ring_empty_descs += o.rx_fill_ring_empty_descs;
        self.tx_ring_empty_descs += o.tx_ring_empty_descs;
    }
}

/// One AF_XDP socket on one (interface, queue) and its four rings, a member of a
/// [`super::QueueGroup`] whose UMEM it uses.
///
/// Single-threaded by design: the worker that owns the group is the only user of its rings.
/// Field order is drop order: rings, then the socket. The group drops its ports before the
/// UMEM.
#[derive(Debug)]
pub struct Port {
    fill: Producer<u64>,
    comp: Consumer<u64>,
    rx: Consumer<libc::xdp_desc>,
    tx: Producer<libc::xdp_desc>,
    fd: OwnedFd,
    iface: String,
    queue: u32,
    table_port: u8,
    /// TX descriptors written after the published ones and not yet submitted.
    tx_staged: u32,
}

impl Port {
    /// Creates the socket and its four rings and binds it to `cfg.iface` queue `queue`.
    ///
    /// With `shared: None` the socket registers `umem` (`XDP_UMEM_REG`) and binds in `mode`.
    /// With `shared: Some(first)` it uses the UMEM `first` registered (`XDP_SHARED_UMEM`,
    /// `sxdp_shared_umem_fd`); it still gets fill and completion rings of its own, which the
    /// kernel requires for a socket on another device or queue (Linux 5.10 and later), and
    /// inherits `first`'s mode and need-wakeup setting, since a shared bind may not name
    /// them.
    pub(crate) fn open(
        cfg: &PortConfig,
        queue: u32,
        umem: &Umem,
        mode: BindMode,
        shared: Option<BorrowedFd<'_>>,
    ) -> Result<Self, XskError> {
        let ifindex = ifindex(&cfg.iface)?;
        let err = |call, source| XskError::Socket {
            iface: cfg.iface.clone(),
            queue,
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

        if shared.is_none() {
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
                queue,
                call: "setsockopt(XDP_UMEM_REG)",
                source,
            })?;
        }
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
        // Before bind, the fill and completion offsets map this socket's own rings (the ones
        // just sized), also for a socket that will share another's UMEM.
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

        let (flags, shared_fd) = match shared {
            // The kernel refuses mode flags on a shared bind (EINVAL): the mode is the UMEM
            // owner's.
            Some(first) => (libc::XDP_SHARED_UMEM, first.as_raw_fd() as u32),
            None => (
                libc::XDP_USE_NEED_WAKEUP
                    | match mode {
                        BindMode::ZeroCopy => libc::XDP_ZEROCOPY,
                        BindMode::Copy => libc::XDP_COPY,
                    },
                0,
            ),
        };
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: shared_fd,
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
                queue,
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
            iface: cfg.iface.clone(),
            queue,
            table_port: cfg.table_port,
            tx_staged: 0,
        })
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
        getsockopt(self.fd.as_fd(), libc::XDP_STATISTICS, &mut s)
            .map_err(|source| self.io_error("getsockopt(XDP_STATISTICS)", source))?;
        Ok(KernelStats {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs,
            tx_ring_empty_descs: s.tx_ring_empty_descs,
        })
    }

    /// Descriptors on the rings as user space sees them: (fill, rx, tx, comp) published and
    /// not yet taken by the other side.
    pub(crate) fn ring_levels(&self) -> [u32; 4] {
        [
            self.fill.pending(),
            self.rx.pending(),
            self.tx.pending(),
            self.comp.pending(),
        ]
    }

    /// Moves this socket's completed TX frames to the free list. Returns how many.
    #[inline]
    pub(crate) fn reap_completions(&mut self, umem: &mut Umem) -> u32 {
        let n = self.comp.peek(u32::MAX);
        for i in 0..n {
            let addr = self.comp.read(i);
            match umem.frame_of(addr, 0) {
                // A frame not on a TX ring is left where it is (`recycle` checks).
                Some(idx) => {
                    umem.recycle(idx, Owner::Tx);
                }
                None => debug_assert!(false, "completion address {addr:#x} outside the UMEM"),
            }
        }
        self.comp.release(n);
        n
    }

    /// Moves free frames to the fill ring, as many as fit. Returns how many.
    #[inline]
    pub(crate) fn refill(&mut self, umem: &mut Umem) -> u32 {
        let want = umem.free_len() as u32;
        if want == 0 {
            return 0;
        }
        let n = self.fill.free(want).min(want);
        for i in 0..n {
            // `n <= free_len`, so the list has a frame for every slot.
            let Some(addr) = umem.pop_free() else {
                unreachable!("free list shorter than its length")
            };
            let idx = (addr / FRAME_SIZE as u64) as u32;
            umem.hand_over(idx, Owner::Free, Owner::Fill);
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

    /// Reads up to `out.len()` received frames into `out`, handing each to the worker, and
    /// gives the RX slots back. Returns (frames read, descriptors skipped): a descriptor that
    /// leaves the UMEM or its frame, or names a frame that was not on a fill ring, is skipped
    /// (a kernel bug if ever seen).
    #[inline]
    pub(crate) fn read_rx(&mut self, umem: &mut Umem, out: &mut [Held]) -> (usize, u32) {
        let n = self.rx.peek(out.len() as u32);
        let mut got = 0;
        let mut invalid = 0;
        for i in 0..n {
            let d = self.rx.read(i);
            match umem.frame_of(d.addr, d.len) {
                Some(idx) if umem.take(idx, Owner::Fill) => {
                    out[got] = Held {
                        idx,
                        head: (d.addr % FRAME_SIZE as u64) as u32,
                        len: d.len,
                        ingress: self.table_port,
                    };
                    got += 1;
                }
                _ => invalid += 1,
            }
        }
        self.rx.release(n);
        (got, invalid)
    }

    /// Writes `h` (a frame the worker holds) as the next TX descriptor, from the packet's
    /// current head, and hands the frame to the kernel's TX side; published by
    /// [`Port::submit_tx`]. Returns false (and keeps the frame) when the ring is full.
    #[inline]
    pub(crate) fn stage_tx(&mut self, umem: &mut Umem, h: &Held) -> bool {
        if self.tx.free(self.tx_staged + 1) <= self.tx_staged {
            return false;
        }
        umem.hand_over(h.idx, Owner::Worker, Owner::Tx);
        self.tx.write(
            self.tx_staged,
            libc::xdp_desc {
                addr: h.idx as u64 * FRAME_SIZE as u64 + h.head as u64,
                len: h.len,
                options: 0,
            },
        );
        self.tx_staged += 1;
        true
    }

    /// Publishes the staged TX descriptors. Returns how many.
    #[inline]
    pub(crate) fn submit_tx(&mut self) -> u32 {
        let n = self.tx_staged;
        self.tx.submit(n);
        self.tx_staged = 0;
        n
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

    pub(crate) fn io_error(&self, call: &'static str, source: io::Error) -> XskError {
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

// SAFETY: a Port owns its socket and ring mappings exclusively (none of their pointers
// escape except through borrows of the Port), and nothing in them is tied to the thread that
// created them, so moving the Port to a worker thread is sound. It is not Sync: the rings'
// cached indices assume a single user.
unsafe impl Send for Port {}

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
    fn loopback_has_a_zero_mac() {
        let p = interface_port("lo").expect("lo exists in every namespace");
        assert_eq!(p.mac, [0; 6]);
        assert!(p.mtu >= 1500);
    }

    #[test]
    fn kernel_stats_add_up() {
        let one = KernelStats {
            rx_dropped: 1,
            rx_invalid_descs: 2,
            tx_invalid_descs: 3,
            rx_ring_full: 4,
            rx_fill_ring_empty_descs: 5,
            tx_ring_empty_descs: 6,
        };
        let mut sum = one;
        sum.add(&one);
        assert_eq!(sum.rx_dropped + sum.tx_ring_empty_descs, 14);
        assert_eq!(sum.rx_fill_ring_empty_descs, 10);
    }
}
