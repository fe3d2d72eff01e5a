//! The AF_XDP driver: the only IO of the packet path, and the largest of the workspace's
//! unsafe islands (all listed in docs/architecture.md, "Unsafe islands").
//!
//! ```text
//!     queue q of interface A (client arm)       queue q of interface B (backend arm)
//!                   │                                         │
//!     XDP program strait_steer per interface (prog.rs, bpf/steer.bpf.c):
//!     service traffic bpf_redirect_map(xsks, q); everything else XDP_PASS (kernel stack)
//!                   ▼                                         ▼
//!  ┌─ QueueGroup q (group.rs): a socket per interface, one shared UMEM, one worker ─┐
//!  │  socket A: fill ─► RX ─┐                          ┌─► TX A ─► completion A   │
//!  │  socket B: fill ─► RX ─┼─► run_worker (worker.rs) ─┼─► TX B ─► completion B   │
//!  │  handoff ring in ──────┘   batch of Frames over    ├─► Drop / Pass: recycle    │
//!  │  (copied into a free frame) UMEM chunks,           └─► Handoff { core }: copy ─┼─► ring to
//!  │       ▲                    process_batch                                      │   that core
//!  │       └── free list ◄── completions, recycled frames                          │
//!  └────────────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! Decisions:
//!
//! - **Raw AF_XDP rather than xsk-rs.** The pipeline encapsulates in place by moving the
//!   packet's start back into the frame headroom, so the TX descriptor must start earlier than
//!   the RX one. xsk-rs 0.11 keeps a descriptor's address crate-private and hides the UMEM
//!   base, so a moved frame could only be sent after copying it back; and its libxdp wants
//!   bpffs and its own dispatcher. The four rings are a page of code (ring.rs) with the
//!   kernel's documented protocol, and every access to them is below. The syscalls go through
//!   rustix, whose typed AF_XDP socket options, `bind` address, `poll` and wake-ups need no
//!   `unsafe` here; only `mmap`/`munmap` (mmap.rs) and the two link ioctls rustix does not
//!   wrap (`SIOCGIFHWADDR`, `SIOCGIFMTU`, socket.rs) remain `unsafe` calls.
//! - **One worker per queue index, one UMEM per worker** ([`QueueGroup`]): the sockets of
//!   queue q on every interface share one UMEM (`XDP_SHARED_UMEM`, each with its own fill and
//!   completion rings), so a nat frame that arrives on the client interface leaves on the
//!   backend interface's TX ring without a copy. Each worker still owns its frames, its rings
//!   and its free list; nothing of a UMEM is shared between cores. Frames of [`FRAME_SIZE`]
//!   bytes, aligned mode; the kernel puts [`crate::rewrite::HEADROOM`] bytes of user headroom
//!   plus its own 256-byte XDP headroom in front of every received packet, and the worker hands
//!   the whole chunk to [`crate::rewrite::Frame`] so an encapsulation only moves the head.
//! - **Cross-core handoff by copy** ([`Handoff`], handoff.rs): a nat reply that lands on a
//!   queue whose worker does not own its flow is copied into a bounded SPSC ring to the owner,
//!   which copies it into a frame of its own UMEM. Rare by design, so the copies are cheap next
//!   to tying two workers' UMEMs together.
//! - **Zero-copy first, then copy mode**, reported by [`QueueGroup::bind_mode`]; veth only has
//!   copy mode. `XDP_USE_NEED_WAKEUP` is always requested, and the worker makes a syscall only
//!   when the kernel sets the flag on the ring concerned (or when it idles, see [`worker`]).
//! - **Our own XDP program** (`strait_steer`, loaded with libbpf-rs) redirects only traffic
//!   the pipeline forwards, because an AF_XDP frame cannot be given back to the kernel. Its
//!   maps follow the service table ([`SteerProgram::update_maps`]).
//!
//! Safety: `unsafe` is allowed in this module of the crate (and in `hint`). Each block says
//! which invariant makes it sound; the recurring ones are (a) a ring pointer stays valid while
//! its mapping (an `Mmap` of mmap.rs, owned by the same struct) lives, and points where the
//! kernel's offsets, checked at open against the mapping's length and the types' alignment,
//! say; (b) a ring slot is touched only through a reservation of free slots (producer) or a
//! peek of published ones (consumer), which cannot reach past what the protocol's indices give
//! us; (c) a UMEM frame is touched by user space only while the frame's state says user space
//! owns it (it was read from the RX or completion ring and not yet put on the fill or TX ring);
//! (d) addresses from the kernel are bounds-checked before they index the UMEM; (e) frames lent
//! to the pipeline together are pairwise distinct, checked when they are lent, so their `&mut`
//! chunks are disjoint; and (f) a handoff ring slot is accessed by its producer or its consumer
//! only, as the ring's acquire/release indices partition them.

#![allow(unsafe_code)]

mod attach;
mod fast;
mod group;
mod handoff;
mod mmap;
mod prog;
mod ring;
mod socket;
mod umem;
pub mod worker;

use std::io;

pub use attach::{Aligned, AttachMode, AttachPolicy, XdpProgram};
pub use fast::BYTES as STEER_COPY_BYTES;
pub use group::{Accounting, GroupConfig, QueueGroup, MAX_GROUP_PORTS};
pub use handoff::{Handoff, HandoffConfig, HandoffError, HandoffRx, HandoffTx, HANDOFF_SLOTS};
pub use prog::{MapSync, SteerCounters, SteerProgram, SteerStats};
pub use ring::LayoutError as RingLayoutError;
pub use socket::{
    interface_port, BindMode, BindPolicy, KernelStats, PortConfig, QueueSocket, RingSizes,
};
pub use umem::{Held, FRAME_COUNT, FRAME_SIZE, MAX_PACKET, RX_OFFSET};
pub use worker::{run_worker, Clock, MonotonicClock, PortDriver, WorkerStats, BATCH};

/// Setup and IO errors of the AF_XDP layer. Each names the call that failed.
#[derive(Debug, thiserror::Error)]
pub enum XskError {
    /// The interface does not exist in this network namespace.
    #[error("interface {iface}: {call}: {source}")]
    NoInterface {
        /// Interface name.
        iface: String,
        /// The call that failed (`ioctl(SIOCGIFINDEX)`, or the `socket` it is made on).
        call: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// A configuration value the kernel would refuse (ring sizes, frame count).
    #[error("invalid AF_XDP configuration: {0}")]
    Config(String),
    /// Allocating or registering the UMEM failed.
    #[error("UMEM for {iface} queue {queue}: {call}: {source}")]
    Umem {
        /// Interface name.
        iface: String,
        /// Queue index.
        queue: u32,
        /// The call that failed (`mmap`, `setsockopt(XDP_UMEM_REG)`).
        call: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Creating the socket or its rings failed.
    #[error("AF_XDP socket for {iface} queue {queue}: {call}: {source}")]
    Socket {
        /// Interface name.
        iface: String,
        /// Queue index.
        queue: u32,
        /// The call that failed (`socket(AF_XDP)`, `setsockopt(XDP_RX_RING)`, `mmap`, ...).
        call: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The kernel reported ring offsets (`getsockopt(XDP_MMAP_OFFSETS)`) that do not fit the
    /// ring's mapping: checked before the ring is mapped, since every pointer into it relies
    /// on them.
    #[error(
        "AF_XDP socket for {iface} queue {queue}: getsockopt(XDP_MMAP_OFFSETS): {ring} ring: \
         {reason}"
    )]
    RingLayout {
        /// Interface name.
        iface: String,
        /// Queue index.
        queue: u32,
        /// `fill`, `completion`, `RX` or `TX`.
        ring: &'static str,
        /// What is wrong with it.
        reason: RingLayoutError,
    },
    /// `bind` refused the socket in the requested mode.
    #[error("AF_XDP bind to {iface} queue {queue} in {mode} mode: {source}")]
    Bind {
        /// Interface name.
        iface: String,
        /// Queue index.
        queue: u32,
        /// The mode asked for.
        mode: BindMode,
        /// The OS error (`EOPNOTSUPP`: no zero-copy; `EBUSY`: queue taken; `EINVAL`: no such
        /// queue).
        source: io::Error,
    },
    /// A syscall of the running worker failed in a way that retrying cannot fix.
    #[error("AF_XDP worker on {iface} queue {queue}: {call}: {source}")]
    Io {
        /// Interface name.
        iface: String,
        /// Queue index.
        queue: u32,
        /// The call that failed (`sendto`, `poll`, `recvfrom`, `getsockopt`).
        call: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Reading an interface's MAC or MTU failed.
    #[error("interface {iface}: {call}: {source}")]
    Link {
        /// Interface name.
        iface: String,
        /// The call (`ioctl(SIOCGIFHWADDR)`, `ioctl(SIOCGIFMTU)`).
        call: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// A libbpf call on the steering program or its maps failed.
    #[error("XDP program on {iface}: {call}: {source}")]
    Bpf {
        /// Interface name.
        iface: String,
        /// The libbpf call or map operation.
        call: &'static str,
        /// libbpf's error.
        source: libbpf_rs::Error,
    },
    /// The steering program could not be attached in any allowed mode.
    #[error("XDP program on {iface}: attach failed (native: {native}; generic: {generic})")]
    Attach {
        /// Interface name.
        iface: String,
        /// Why native (driver) mode failed, or "not tried".
        native: String,
        /// Why generic (skb) mode failed, or "not tried".
        generic: String,
    },
}

/// The last OS error, for a libc call that just returned -1.
fn last_error() -> io::Error {
    io::Error::last_os_error()
}

/// The index of interface `iface` in the calling thread's network namespace.
///
/// # Errors
/// [`XskError::NoInterface`] when there is no such interface.
pub fn ifindex(iface: &str) -> Result<u32, XskError> {
    let err = |call, source: rustix::io::Errno| XskError::NoInterface {
        iface: iface.to_owned(),
        call,
        source: source.into(),
    };
    // SIOCGIFINDEX works on any socket of the namespace (netdevice(7)), not on an AF_XDP one;
    // this is what libc's if_nametoindex does.
    let sock = link_socket().map_err(|e| err("socket(AF_INET)", e))?;
    rustix::net::netdevice::name_to_index(&sock, iface).map_err(|e| err("ioctl(SIOCGIFINDEX)", e))
}

/// A socket to ask the calling thread's network namespace about its links.
fn link_socket() -> rustix::io::Result<std::os::fd::OwnedFd> {
    use rustix::net::{socket_with, AddressFamily, SocketFlags, SocketType};
    socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )
}
