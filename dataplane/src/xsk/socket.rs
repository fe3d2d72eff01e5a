//! [`QueueSocket`]: one AF_XDP socket bound to one (interface, queue), and its four rings. The
//! UMEM belongs to the [`super::QueueGroup`] the socket is a member of.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::io::Errno;
use rustix::net::xdp::{
    SocketAddrXdp, SocketAddrXdpFlags, SocketAddrXdpWithSharedUmem, XdpDesc, XdpDescOptions,
    XdpUmemReg, XdpUmemRegFlags, XDP_PGOFF_RX_RING, XDP_PGOFF_TX_RING,
    XDP_UMEM_PGOFF_COMPLETION_RING, XDP_UMEM_PGOFF_FILL_RING,
};
use rustix::net::{sockopt, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use strait_config::model::MacAddr;

use super::ring::{Consumer, MapError, Producer};
use super::umem::{Held, Owner, Umem, FRAME_SIZE};
use super::{ifindex, last_error, link_socket, XskError};
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
/// Single-threaded by design: the worker that owns the group is the only user of its rings
/// (a QueueSocket may move to the worker's thread, but is not Sync). Field order is drop
/// order: rings, then the socket. The group drops its ports before the UMEM.
#[derive(Debug)]
pub struct QueueSocket {
    fill: Producer<u64>,
    comp: Consumer<u64>,
    rx: Consumer<XdpDesc>,
    /// Holds the TX descriptors staged by [`QueueSocket::stage_tx`] until
    /// [`QueueSocket::submit_tx`].
    tx: Producer<XdpDesc>,
    fd: OwnedFd,
    iface: String,
    queue: u32,
    table_port: u8,
}

impl QueueSocket {
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
        let err = |call, source: Errno| XskError::Socket {
            iface: cfg.iface.clone(),
            queue,
            call,
            source: source.into(),
        };
        let fd = rustix::net::socket_with(
            AddressFamily::XDP,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| err("socket(AF_XDP)", e))?;

        if shared.is_none() {
            let reg = XdpUmemReg {
                addr: umem.addr(),
                len: umem.len() as u64,
                chunk_size: FRAME_SIZE,
                headroom: HEADROOM as u32,
                flags: XdpUmemRegFlags::empty(),
                tx_metadata_len: 0,
            };
            sockopt::set_xdp_umem_reg(&fd, reg).map_err(|source| XskError::Umem {
                iface: cfg.iface.clone(),
                queue,
                call: "setsockopt(XDP_UMEM_REG)",
                source: source.into(),
            })?;
        }
        let r = &cfg.rings;
        sockopt::set_xdp_umem_fill_ring_size(&fd, r.fill)
            .map_err(|e| err("setsockopt(XDP_UMEM_FILL_RING)", e))?;
        sockopt::set_xdp_umem_completion_ring_size(&fd, r.comp)
            .map_err(|e| err("setsockopt(XDP_UMEM_COMPLETION_RING)", e))?;
        sockopt::set_xdp_rx_ring_size(&fd, r.rx).map_err(|e| err("setsockopt(XDP_RX_RING)", e))?;
        sockopt::set_xdp_tx_ring_size(&fd, r.tx).map_err(|e| err("setsockopt(XDP_TX_RING)", e))?;
        let off =
            sockopt::xdp_mmap_offsets(&fd).map_err(|e| err("getsockopt(XDP_MMAP_OFFSETS)", e))?;
        let map_err = |ring, call| {
            move |e| match e {
                MapError::Layout(reason) => XskError::RingLayout {
                    iface: cfg.iface.clone(),
                    queue,
                    ring,
                    reason,
                },
                MapError::Mmap(source) => XskError::Socket {
                    iface: cfg.iface.clone(),
                    queue,
                    call,
                    source,
                },
            }
        };
        // Before bind, the fill and completion offsets map this socket's own rings (the ones
        // just sized), also for a socket that will share another's UMEM.
        let fill = Producer::map(fd.as_fd(), &off.fr, r.fill, XDP_UMEM_PGOFF_FILL_RING)
            .map_err(map_err("fill", "mmap(fill ring)"))?;
        let comp = Consumer::map(fd.as_fd(), &off.cr, r.comp, XDP_UMEM_PGOFF_COMPLETION_RING)
            .map_err(map_err("completion", "mmap(completion ring)"))?;
        let rx = Consumer::map(fd.as_fd(), &off.rx, r.rx, XDP_PGOFF_RX_RING)
            .map_err(map_err("RX", "mmap(RX ring)"))?;
        let tx = Producer::map(fd.as_fd(), &off.tx, r.tx, XDP_PGOFF_TX_RING)
            .map_err(map_err("TX", "mmap(TX ring)"))?;

        let bound = match shared {
            // The kernel refuses mode flags on a shared bind (EINVAL): the mode is the UMEM
            // owner's.
            Some(first) => rustix::net::bind(
                &fd,
                &SocketAddrXdpWithSharedUmem {
                    addr: SocketAddrXdp::new(SocketAddrXdpFlags::XDP_SHARED_UMEM, ifindex, queue),
                    shared_umem_fd: first,
                },
            ),
            None => {
                let flags = SocketAddrXdpFlags::XDP_USE_NEED_WAKEUP
                    | match mode {
                        BindMode::ZeroCopy => SocketAddrXdpFlags::XDP_ZEROCOPY,
                        BindMode::Copy => SocketAddrXdpFlags::XDP_COPY,
                    };
                rustix::net::bind(&fd, &SocketAddrXdp::new(flags, ifindex, queue))
            }
        };
        bound.map_err(|source| XskError::Bind {
            iface: cfg.iface.clone(),
            queue,
            mode,
            source: source.into(),
        })?;
        Ok(Self {
            fill,
            comp,
            rx,
            tx,
            fd,
            iface: cfg.iface.clone(),
            queue,
            table_port: cfg.table_port,
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
        let s = sockopt::xdp_statistics(&self.fd)
            .map_err(|e| self.io_error("getsockopt(XDP_STATISTICS)", e.into()))?;
        // The last three counters came with Linux 5.9, before the shared UMEM across devices
        // (5.10) a group needs.
        let (Some(rx_ring_full), Some(rx_fill_ring_empty_descs), Some(tx_ring_empty_descs)) = (
            s.rx_ring_full,
            s.rx_fill_ring_empty_descs,
            s.tx_ring_empty_descs,
        ) else {
            return Err(self.io_error(
                "getsockopt(XDP_STATISTICS)",
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    "kernel without the 5.9 counters (kernel too old)",
                ),
            ));
        };
        Ok(KernelStats {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full,
            rx_fill_ring_empty_descs,
            tx_ring_empty_descs,
        })
    }

    /// Descriptors on the rings as user space sees them: (fill, rx, tx, comp) published and
    /// not yet taken by the other side.
    pub(crate) fn ring_levels(&self) -> [u32; 4] {
        // The ring a frame goes to is read before the ring it leaves (RX before fill,
        // completion before TX): a frame the kernel moves between the two reads is then
        // counted in neither ring (in the kernel, a moment) rather than in both, so the
        // books never show more frames than there are.
        let rx = self.rx.pending();
        let comp = self.comp.pending();
        [self.fill.pending(), rx, self.tx.pending(), comp]
    }

    /// Moves this socket's completed TX frames to the free list. Returns how many.
    #[inline]
    pub(crate) fn reap_completions(&mut self, umem: &mut Umem) -> u32 {
        let done = self.comp.peek(u32::MAX);
        for addr in done.iter() {
            match umem.frame_of(addr, 0) {
                // A frame not on a TX ring is left where it is (`recycle` checks).
                Some(idx) => {
                    umem.recycle(idx, Owner::Tx);
                }
                None => debug_assert!(false, "completion address {addr:#x} outside the UMEM"),
            }
        }
        done.release()
    }

    /// Moves free frames to the fill ring, as many as fit. Returns how many.
    #[inline]
    pub(crate) fn refill(&mut self, umem: &mut Umem) -> u32 {
        let want = umem.free_len() as u32;
        if want == 0 {
            return 0;
        }
        let mut slots = self.fill.reserve(want);
        while slots.remaining() > 0 {
            // At most `free_len` slots were reserved, so the list has a frame for every one.
            let Some(addr) = umem.pop_free() else {
                unreachable!("free list shorter than its length")
            };
            let idx = (addr / FRAME_SIZE as u64) as u32;
            umem.hand_over(idx, Owner::Free, Owner::Fill);
            slots.push(addr);
        }
        slots.submit()
    }

    /// Descriptors waiting on the RX ring (at most `max`).
    #[inline]
    pub(crate) fn rx_ready(&mut self, max: u32) -> u32 {
        self.rx.peek(max).len()
    }

    /// Reads up to `out.len()` received frames into `out`, handing each to the worker, and
    /// gives the RX slots back. Returns (frames read, descriptors skipped): a descriptor that
    /// leaves the UMEM or its frame, or names a frame that was not on a fill ring, is skipped
    /// (a kernel bug if ever seen).
    #[inline]
    pub(crate) fn read_rx(&mut self, umem: &mut Umem, out: &mut [Held]) -> (usize, u32) {
        let received = self.rx.peek(out.len() as u32);
        let mut got = 0;
        let mut invalid = 0;
        for d in received.iter() {
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
        received.release();
        (got, invalid)
    }

    /// Writes `h` (a frame the worker holds) as the next TX descriptor, from the packet's
    /// current head, and hands the frame to the kernel's TX side; published by
    /// [`QueueSocket::submit_tx`]. Returns false (and keeps the frame) when the ring is full.
    #[inline]
    pub(crate) fn stage_tx(&mut self, umem: &mut Umem, h: &Held) -> bool {
        let mut slot = self.tx.reserve(1);
        if slot.remaining() == 0 {
            return false;
        }
        umem.hand_over(h.idx, Owner::Worker, Owner::Tx);
        slot.push(XdpDesc {
            addr: h.idx as u64 * FRAME_SIZE as u64 + h.head as u64,
            len: h.len,
            options: XdpDescOptions::empty(),
        });
        // Left staged: the turn's TX descriptors are published together by `submit_tx`.
        true
    }

    /// Publishes the staged TX descriptors. Returns how many.
    #[inline]
    pub(crate) fn submit_tx(&mut self) -> u32 {
        self.tx.submit()
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
        // A zero-length send (sendto with no address), which AF_XDP takes as "process the TX
        // ring".
        match rustix::net::send(&self.fd, &[], SendFlags::DONTWAIT) {
            Ok(_) | Err(Errno::AGAIN | Errno::BUSY | Errno::NOBUFS | Errno::NETDOWN) => {}
            Err(e) => return Err(self.io_error("sendto", e.into())),
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
        // A zero-length recv (recvfrom with no address), which AF_XDP takes as a wakeup for
        // the RX side.
        match rustix::net::recv(&self.fd, &mut [0u8; 0], RecvFlags::DONTWAIT) {
            Ok(_) | Err(Errno::AGAIN | Errno::BUSY | Errno::NETDOWN) => {}
            Err(e) => return Err(self.io_error("recvfrom", e.into())),
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

impl AsFd for QueueSocket {
    /// The AF_XDP socket, for the XSKMAP.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
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
    let name = iface.as_bytes();
    if name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(err(
            "ifreq",
            io::Error::new(io::ErrorKind::InvalidInput, "not an interface name"),
        ));
    }
    let sock = link_socket().map_err(|e| err("socket(AF_INET)", e.into()))?;
    // Zeroed, so the name is NUL-terminated (it is shorter than IFNAMSIZ).
    let mut name_field = [0 as libc::c_char; libc::IFNAMSIZ];
    for (d, s) in name_field.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let mut req = libc::ifreq {
        ifr_name: name_field,
        ifr_ifru: libc::__c_anonymous_ifr_ifru { ifru_mtu: 0 },
    };
    // Neither rustix (its `netdevice` maps names and indexes only) nor nix wraps these two
    // ioctls without `unsafe` of our own; nix's `getifaddrs` has the MAC but not the MTU.
    // SAFETY: SIOCGIFHWADDR reads the name from and writes the hardware address into `req`, a
    // valid ifreq that lives across the call; once it succeeded, the union holds
    // `ifru_hwaddr`, which is the field read.
    let hw = unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) < 0 {
            return Err(err("ioctl(SIOCGIFHWADDR)", last_error()));
        }
        req.ifr_ifru.ifru_hwaddr
    };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    req.ifr_ifru = libc::__c_anonymous_ifr_ifru { ifru_mtu: 0 };
    // SAFETY: as above, for SIOCGIFMTU, after which the union holds `ifru_mtu`.
    let mtu = unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut req) < 0 {
            return Err(err("ioctl(SIOCGIFMTU)", last_error()));
        }
        req.ifr_ifru.ifru_mtu
    };
    Ok(table::Port::new(
        MacAddr(mac),
        mtu.clamp(0, u16::MAX as i32) as u16,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_a_zero_mac() {
        let p = interface_port("lo").expect("lo exists in every namespace");
        assert_eq!(p.mac_addr(), MacAddr([0; 6]));
        assert!(p.mtu >= 1500);
    }

    #[test]
    fn interfaces_are_looked_up_by_name() {
        assert_eq!(
            ifindex("lo").expect("lo exists"),
            1,
            "lo is the first link of a namespace"
        );
        for bad in ["strait-nope0", "a-name-longer-than-ifnamsiz", "lo\0"] {
            let e = ifindex(bad).expect_err("no such interface");
            assert!(
                matches!(
                    e,
                    XskError::NoInterface {
                        call: "ioctl(SIOCGIFINDEX)",
                        ..
                    }
                ),
                "{e:?}"
            );
        }
        assert!(matches!(
            interface_port("lo\0"),
            Err(XskError::Link { call: "ifreq", .. })
        ));
    }

    #[test]
    fn a_refused_ring_layout_names_the_call_and_the_ring() {
        let e = XskError::RingLayout {
            iface: "eth0".into(),
            queue: 3,
            ring: "fill",
            reason: super::super::RingLayoutError::NoFlags,
        };
        let shown = e.to_string();
        assert!(
            shown.contains("eth0 queue 3")
                && shown.contains("getsockopt(XDP_MMAP_OFFSETS)")
                && shown.contains("fill ring")
                && shown.contains("5.4"),
            "{shown}"
        );
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
