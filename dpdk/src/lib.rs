//! Strait's DPDK port driver: the second driver of the worker loop
//! ([`strait_dataplane::xsk::run_worker`]), beside AF_XDP.
//!
//! ```text
//!   EAL (once per process: --file-prefix, -m, --no-huge, --vdev / -a per device)
//!     port "veth-gw" = net_af_packet0,iface=dp-gw (or a PCI address)
//!        RX queue q ──► DpdkGroup q (one mempool, one worker) ──► TX queue q
//!                          │ Verdict::Pass: write(2) to the TAP          ▲
//!                          ▼                                             │
//!     TAP "veth-gw" (the kernel's view of the port: its MAC, addresses, ARP/ND, health
//!     checks, BGP, ssh) ── read(2) by the group that serves the port's first queue ──┘
//! ```
//!
//! Decisions:
//!
//! - **A C shim, no bindgen.** DPDK's burst and mbuf calls are `static inline`; shim/shim.c
//!   wraps them and every other call used, with integer and opaque-pointer arguments only,
//!   so [`ffi`] is thirty hand-written lines that do not change with DPDK's struct layouts.
//! - **Frames in place.** A received mbuf's whole data buffer is lent to the pipeline as a
//!   [`Frame`] (DPDK's 128-byte headroom covers [`strait_dataplane::rewrite::HEADROOM`]);
//!   the verdict moves the same mbuf to a TX queue of any port of the group (all share the
//!   group's mempool), so nothing is copied or allocated per packet.
//! - **The kernel keeps its traffic through a TAP named as the interface.** The
//!   configuration's interface name is the TAP's: an operator who hands `eth1` to DPDK keeps
//!   an `eth1` in the kernel, with the port's MAC, where addresses, routes, neighbours, VIPs
//!   on `lo` and every daemon work as before. An existing (persistent) TAP of that name is
//!   attached to, keeping its addresses; otherwise one is created for the process's lifetime.
//!   Frames the pipeline passes are written to it; frames the kernel sends are read from it
//!   and sent on the port. Both cost a syscall per frame, which is why only the exception
//!   traffic takes that way, and why a busy worker reads the TAP only every
//!   [`TAP_POLL_EVERY`] turns.
//! - **Worker threads are the gateway's, not EAL lcores.** EAL is initialised from the
//!   control thread with its CPU affinity restored afterwards, and each worker registers
//!   itself (`rte_thread_register`) for a mempool cache of its own, pinned as AF_XDP workers
//!   are.
//!
//! Safety: `unsafe` is allowed in this crate for the FFI calls (one of the unsafe islands
//! listed in docs/architecture.md, "Unsafe islands"). The recurring invariants:
//! (a) an mbuf pointer in a [`Mbuf`] came from `rte_eth_rx_burst` or `rte_pktmbuf_alloc`
//! and is owned by exactly that `Mbuf` (it is neither `Copy` nor `Clone`, and giving it to
//! DPDK consumes it), so its buffer is ours alone until then; (b) port and queue ids were
//! configured and started by [`Dpdk`], which outlives every group (it closes the ports only
//! after the workers stopped); (c) a queue of a port is used by one group, hence one thread.

#![allow(unsafe_code)]

mod eal;
mod ffi;
mod group;
mod tap;

pub use eal::{device_port_name, eal_args, is_pci, EalOptions};
pub use group::{DpdkGroup, Mbuf, RX_BURST, TAP_POLL_EVERY};

use std::ffi::{CStr, CString};
use std::sync::Arc;

use strait_dataplane::rewrite::Frame;
use tap::Tap;

/// Errors of the DPDK driver's setup, each naming the call and the device.
#[derive(Debug, thiserror::Error)]
pub enum DpdkError {
    /// `rte_eal_init` failed (its reason in DPDK's words; the EAL log above it says more).
    #[error("DPDK EAL init ({args}): {reason}")]
    Eal {
        /// The EAL arguments.
        args: String,
        /// `rte_strerror` of the error.
        reason: String,
    },
    /// EAL was already initialised in this process (it can be only once).
    #[error("DPDK EAL is already initialised in this process")]
    EalTwice,
    /// A call on a port failed.
    #[error("DPDK port {iface} ({device}): {call}: {reason}")]
    Port {
        /// The interface name of the configuration.
        iface: String,
        /// The EAL device.
        device: String,
        /// The call that failed.
        call: &'static str,
        /// Why.
        reason: String,
    },
    /// The exception TAP could not be opened.
    #[error("exception TAP {iface}: {call}: {source}")]
    Tap {
        /// Its name.
        iface: String,
        /// The call that failed.
        call: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A configuration the driver cannot serve.
    #[error("DPDK: {0}")]
    Config(String),
}

/// DPDK's text for error number `err` (positive).
fn strerror(err: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local NUL-terminated
    // string, valid at least until the next call on this thread; it is copied at once.
    unsafe { CStr::from_ptr(ffi::strait_strerror(err.abs())) }
        .to_string_lossy()
        .into_owned()
}

/// The DPDK version the gateway runs with (`DPDK 22.11.x`).
pub fn version() -> String {
    // SAFETY: rte_version returns a pointer to a static NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::strait_version()) }
        .to_string_lossy()
        .into_owned()
}

/// One interface the gateway serves with DPDK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSpec {
    /// The interface name: the exception TAP's name, and the name in logs and metrics.
    pub name: String,
    /// The EAL device: a PCI address or a vdev (`net_af_packet0,iface=eth1`).
    pub device: String,
    /// Its table port (index in the gateway's interfaces).
    pub table_port: u8,
    /// The queues served, one worker each.
    pub queues: Vec<u32>,
    /// MTU for the port and its TAP.
    pub mtu: u16,
}

/// A DPDK port, configured (not started until [`Dpdk::start`]).
#[derive(Debug)]
struct Port {
    spec: PortSpec,
    id: u16,
    mac: [u8; 6],
    tap: Arc<Tap>,
}

/// Basic counters and link state of a port, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received (`ipackets`).
    pub rx_packets: u64,
    /// Frames sent (`opackets`).
    pub tx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Frames the port dropped for lack of RX descriptors (`imissed`).
    pub rx_missed: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Send errors.
    pub tx_errors: u64,
    /// Receive failures for lack of mbufs.
    pub rx_nombuf: u64,
    /// Link up.
    pub link_up: bool,
    /// Link speed in Mbit/s (0 unknown).
    pub link_speed_mbps: u32,
}

/// EAL and the DPDK ports of a gateway. Dropping it closes the ports and cleans EAL up;
/// drop it only after every [`DpdkGroup`] made from it is gone.
#[derive(Debug)]
pub struct Dpdk {
    ports: Vec<Port>,
    /// False once the ports are closed; [`StatsReader`]s read only under it.
    alive: Arc<std::sync::Mutex<bool>>,
    started: bool,
    file_prefix: String,
    groups: u32,
}

impl Dpdk {
    /// Initialises EAL with `opts` and the devices of `ports`, finds each port, configures
    /// it (as many queues as its highest queue index + 1) and opens its exception TAP with
    /// the port's MAC.
    ///
    /// # Errors
    /// [`DpdkError`] naming the device and call: EAL refused the options (no hugepages, a
    /// running process with the same `--file-prefix`, a device it cannot probe), no port of
    /// that name, the port refused its configuration, or the TAP could not be opened.
    pub fn open(opts: &EalOptions, ports: &[PortSpec]) -> Result<Self, DpdkError> {
        let devices: Vec<&str> = ports.iter().map(|p| p.device.as_str()).collect();
        let args = eal_args(opts, &devices);
        // A failed init leaves the runtime directory it made; one that was there before (a
        // process running with the same prefix) is not this call's to remove.
        let dir = eal::runtime_dir(&opts.file_prefix);
        let existed = dir.as_ref().is_some_and(|d| d.exists());
        if let Err(e) = eal::init(&args) {
            if let (Some(dir), false) = (dir, existed) {
                let _ = std::fs::remove_dir_all(dir);
            }
            return Err(e);
        }
        let mut out = Self {
            ports: Vec::new(),
            alive: Arc::new(std::sync::Mutex::new(true)),
            started: false,
            file_prefix: opts.file_prefix.clone(),
            groups: 0,
        };
        for spec in ports {
            let err = |call, reason: String| DpdkError::Port {
                iface: spec.name.clone(),
                device: spec.device.clone(),
                call,
                reason,
            };
            let name = CString::new(device_port_name(&spec.device))
                .map_err(|_| err("device name", "contains a NUL byte".into()))?;
            let mut id = 0u16;
            // SAFETY: `name` is a NUL-terminated string that lives across the call; `id` is a
            // valid u16 to write.
            let r = unsafe { ffi::strait_port_by_name(name.as_ptr(), &mut id) };
            if r != 0 {
                return Err(err(
                    "rte_eth_dev_get_port_by_name",
                    format!(
                        "no port {:?} after EAL probed the devices ({})",
                        name,
                        strerror(r)
                    ),
                ));
            }
            let queues = spec.queues.iter().copied().max().unwrap_or(0) + 1;
            let queues = u16::try_from(queues)
                .map_err(|_| err("rte_eth_dev_configure", format!("{queues} queues")))?;
            // SAFETY: `id` names a probed port; configuration takes plain integers.
            let r = unsafe { ffi::strait_port_configure(id, queues, spec.mtu) };
            if r < 0 {
                return Err(err("rte_eth_dev_configure", strerror(r)));
            }
            let mut mac = [0u8; 6];
            // SAFETY: `mac` has the 6 bytes the shim writes.
            let r = unsafe { ffi::strait_port_mac(id, mac.as_mut_ptr()) };
            if r < 0 {
                return Err(err("rte_eth_macaddr_get", strerror(r)));
            }
            let tap = Tap::open(&spec.name, mac, spec.mtu)?;
            out.ports.push(Port {
                spec: spec.clone(),
                id,
                mac,
                tap: Arc::new(tap),
            });
        }
        Ok(out)
    }

    /// The MAC of the port named `name` (the TAP has the same).
    pub fn mac(&self, name: &str) -> Option<[u8; 6]> {
        self.ports
            .iter()
            .find(|p| p.spec.name == name)
            .map(|p| p.mac)
    }

    /// Sets up queue `queue` of every port of `members` (table ports) with a mempool of its
    /// own, for one worker. The group of a port's first queue reads its TAP.
    ///
    /// # Errors
    /// A member that is not a DPDK port of this gateway, a mempool EAL cannot allocate
    /// (raise the memory, `-m`), or a queue the port refuses.
    pub fn group(&mut self, queue: u32, members: &[u8]) -> Result<DpdkGroup, DpdkError> {
        if self.started {
            return Err(DpdkError::Config(
                "queues must be set up before the ports start".into(),
            ));
        }
        if members.is_empty() || members.len() > group::MAX_PORTS {
            return Err(DpdkError::Config(format!(
                "a group has 1 to {} ports, not {}",
                group::MAX_PORTS,
                members.len()
            )));
        }
        let q = u16::try_from(queue)
            .map_err(|_| DpdkError::Config(format!("queue {queue} out of range")))?;
        let mut gp = Vec::new();
        for &tp in members {
            let port = self
                .ports
                .iter()
                .find(|p| p.spec.table_port == tp)
                .ok_or_else(|| DpdkError::Config(format!("table port {tp} is not a DPDK port")))?;
            gp.push(port);
        }
        // Sized for what can be in flight: the RX and TX descriptors of every member, the
        // worker's batch and per-port TX staging, and the per-lcore caches.
        let n = gp.len() as u32 * (group::RX_DESC + group::TX_DESC) as u32 + 2048;
        let name = CString::new(format!("strait-g{}", self.groups))
            .map_err(|_| DpdkError::Config("pool name".into()))?;
        self.groups += 1;
        // SAFETY: `gp[0].id` is a probed port.
        let socket = unsafe { ffi::strait_port_socket(gp[0].id) };
        // SAFETY: `name` is NUL-terminated and lives across the call.
        let pool = unsafe { ffi::strait_pool_create(name.as_ptr(), n, group::POOL_CACHE, socket) };
        if pool.is_null() {
            return Err(DpdkError::Port {
                iface: gp[0].spec.name.clone(),
                device: gp[0].spec.device.clone(),
                call: "rte_pktmbuf_pool_create",
                reason: format!(
                    "{n} mbufs: not enough DPDK memory (raise [gateway.dpdk] memory_mb)"
                ),
            });
        }
        let mut ports = Vec::new();
        for p in gp {
            // SAFETY: a configured port, a queue below its configured count (queues = max
            // + 1 and `queue` is one of the port's), and a live mempool.
            let r =
                unsafe { ffi::strait_port_queue(p.id, q, group::RX_DESC, group::TX_DESC, pool) };
            if r < 0 {
                return Err(DpdkError::Port {
                    iface: p.spec.name.clone(),
                    device: p.spec.device.clone(),
                    call: "rte_eth_rx/tx_queue_setup",
                    reason: strerror(r),
                });
            }
            let first = p.spec.queues.first() == Some(&queue);
            ports.push(group::GroupPort::new(
                p.spec.name.clone(),
                p.id,
                q,
                p.spec.table_port,
                Arc::clone(&p.tap),
                first,
            ));
        }
        Ok(DpdkGroup::new(ports, pool, queue))
    }

    /// Starts every port (after every group was made).
    ///
    /// # Errors
    /// A port that does not start.
    pub fn start(&mut self) -> Result<(), DpdkError> {
        for p in &self.ports {
            // SAFETY: a configured port whose queues were set up.
            let r = unsafe { ffi::strait_port_start(p.id) };
            if r < 0 {
                return Err(DpdkError::Port {
                    iface: p.spec.name.clone(),
                    device: p.spec.device.clone(),
                    call: "rte_eth_dev_start",
                    reason: strerror(r),
                });
            }
        }
        self.started = true;
        Ok(())
    }

    /// A reader of the ports' counters for another thread (the admin API); it reads
    /// nothing once the ports are closed.
    pub fn stats_reader(&self) -> StatsReader {
        StatsReader {
            ports: self
                .ports
                .iter()
                .map(|p| (p.spec.name.clone(), p.id))
                .collect(),
            alive: Arc::clone(&self.alive),
        }
    }
}

/// Reads the counters and link state of a gateway's DPDK ports from any thread, while they
/// are open.
#[derive(Clone, Debug)]
pub struct StatsReader {
    ports: Vec<(String, u16)>,
    alive: Arc<std::sync::Mutex<bool>>,
}

impl StatsReader {
    /// Counters and link state of every port, by interface name; empty once the ports are
    /// closed.
    pub fn read(&self) -> Vec<(String, PortStats)> {
        let alive = self
            .alive
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !*alive {
            return Vec::new();
        }
        self.ports
            .iter()
            .map(|(name, id)| {
                let p = Probe { id: *id };
                let mut s = [0u64; 8];
                let mut speed = 0u32;
                // SAFETY: `s` has the 8 counters the shim writes; `p.id` is an open port
                // (`alive` is held, and `Dpdk` closes its ports only under it); ethdev's
                // stats and link reads may run beside the worker's bursts.
                let _ = unsafe { ffi::strait_port_stats(p.id, s.as_mut_ptr()) };
                // SAFETY: as above; `speed` is a valid u32 to write.
                let link = unsafe { ffi::strait_port_link(p.id, &mut speed) };
                (
                    name.clone(),
                    PortStats {
                        rx_packets: s[0],
                        tx_packets: s[1],
                        rx_bytes: s[2],
                        tx_bytes: s[3],
                        rx_missed: s[4],
                        rx_errors: s[5],
                        tx_errors: s[6],
                        rx_nombuf: s[7],
                        link_up: link == 1,
                        link_speed_mbps: speed,
                    },
                )
            })
            .collect()
    }
}

/// A port id to read.
struct Probe {
    id: u16,
}

impl Drop for Dpdk {
    fn drop(&mut self) {
        let mut alive = self
            .alive
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *alive = false;
        for p in &self.ports {
            // SAFETY: no group uses the port any more (the owner drops `Dpdk` after its
            // workers, see the type's docs); stop and close are idempotent on a port.
            unsafe { ffi::strait_port_close(p.id) };
        }
        self.ports.clear();
        eal::cleanup(&self.file_prefix);
    }
}

/// The worker thread's registration with EAL (an lcore id, hence a mempool cache of its
/// own); unregistered on drop. Make one at the start of a worker thread.
#[derive(Debug)]
pub struct ThreadRegistration {
    registered: bool,
    // Not Send: it belongs to the thread that made it.
    _thread: std::marker::PhantomData<*const ()>,
}

impl ThreadRegistration {
    /// Registers the calling thread. Without a free lcore id the thread still works, with
    /// no mempool cache (slower), and `registered()` says so.
    pub fn new() -> Self {
        // SAFETY: EAL is initialised (a `DpdkGroup` exists only after `Dpdk::open`).
        let registered = unsafe { ffi::strait_thread_register() } == 0;
        Self {
            registered,
            _thread: std::marker::PhantomData,
        }
    }

    /// Whether the thread got an lcore id.
    pub fn registered(&self) -> bool {
        self.registered
    }
}

impl Default for ThreadRegistration {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ThreadRegistration {
    fn drop(&mut self) {
        if self.registered {
            // SAFETY: this thread registered itself in `new`.
            unsafe { ffi::strait_thread_unregister() };
        }
    }
}

/// A frame lent to the pipeline: the whole data buffer of `m`.
///
/// # Safety
/// `m` is a single-segment mbuf owned by the caller for `'a`, and no other `Frame` over it
/// lives at the same time.
unsafe fn frame_of<'a>(m: *mut ffi::RteMbuf) -> Frame<'a> {
    let (mut buf, mut buf_len, mut off, mut len) = (std::ptr::null_mut(), 0u16, 0u16, 0u16);
    // SAFETY: `m` is a live mbuf (caller); the shim writes the four outputs.
    unsafe { ffi::strait_mbuf_view(m, &mut buf, &mut buf_len, &mut off, &mut len) };
    // SAFETY: an mbuf's data buffer is `buf_len` bytes from `buf_addr`, owned with the mbuf
    // by the caller, and not aliased (caller).
    let chunk = unsafe { std::slice::from_raw_parts_mut(buf, buf_len as usize) };
    Frame::new(chunk, off as usize, len as usize)
}
