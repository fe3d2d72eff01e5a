//! Helpers for namespace testbeds (tests, the `strait` testbed and traffic tools): entering a
//! network namespace, pinning a thread to a CPU, and a raw packet socket to send and capture
//! Ethernet frames.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::{ifindex, last_error, XskError};

/// Moves the calling thread into the network namespace `ns`: a name made by `ip netns add`
/// (looked up in `/var/run/netns`) or a path to a namespace file. Only this thread moves;
/// sockets and interfaces it then opens belong to that namespace.
///
/// # Errors
/// [`XskError::Netns`] when the namespace file cannot be opened or `setns` fails (not root).
pub fn enter_netns(ns: &str) -> Result<(), XskError> {
    let path = if ns.contains('/') {
        ns.to_owned()
    } else {
        format!("/var/run/netns/{ns}")
    };
    let err = |call, source| XskError::Netns {
        path: path.clone(),
        call,
        source,
    };
    let f = File::open(&path).map_err(|e| err("open", e))?;
    // SAFETY: `f` is an open namespace file for the duration of the call; setns only changes
    // the calling thread's namespace and touches no memory of ours.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(err("setns", last_error()));
    }
    Ok(())
}

/// Pins the calling thread to CPU `cpu` (`sched_setaffinity`).
///
/// With [`PacketSocket::bypass_qdisc`], a frame written by a thread pinned to CPU `c` leaves
/// on TX queue `c % queues` of an interface without XPS (veth), and a veth delivers it on the
/// peer's RX queue of the same index: how a test picks the queue a frame arrives on.
///
/// # Errors
/// [`XskError::Io`] (call `sched_setaffinity`) when the CPU does not exist or is not allowed.
pub fn pin_thread(cpu: usize) -> Result<(), XskError> {
    let err = |source| XskError::Io {
        iface: String::new(),
        queue: 0,
        call: "sched_setaffinity",
        source,
    };
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "CPU number beyond CPU_SETSIZE",
        )));
    }
    // SAFETY: cpu_set_t is a plain bit array, for which all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit of `set`, a valid cpu_set_t; `cpu < CPU_SETSIZE` (checked
    // above) keeps the bit inside it.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t that lives across the call and its size is passed;
    // pid 0 is the calling thread. The kernel only reads it.
    if unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) } < 0 {
        return Err(err(last_error()));
    }
    Ok(())
}

/// A raw `AF_PACKET` socket bound to one interface: every frame in or out of the interface
/// can be read ([`Read`]), and whole Ethernet frames written ([`Write`]) go out of it as they
/// are.
#[derive(Debug)]
pub struct PacketSocket {
    file: File,
}

impl PacketSocket {
    /// Opens the socket on `iface` (in the calling thread's namespace); reads wait at most
    /// `timeout` and then fail with `WouldBlock`/`TimedOut`.
    ///
    /// # Errors
    /// [`XskError::NoInterface`], or [`XskError::Socket`] naming the failed call.
    pub fn open(iface: &str, timeout: Duration) -> Result<Self, XskError> {
        let idx = ifindex(iface)?;
        let err = |call, source| XskError::Socket {
            iface: iface.to_owned(),
            queue: 0,
            call,
            source,
        };
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2); checked below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                proto as libc::c_int,
            )
        };
        if raw < 0 {
            return Err(err("socket(AF_PACKET)", last_error()));
        }
        // SAFETY: `raw` is a new, valid descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let sa = libc::sockaddr_ll {
            sll_family: libc::AF_PACKET as u16,
            sll_protocol: proto,
            sll_ifindex: idx as i32,
            sll_hatype: 0,
            sll_pkttype: 0,
            sll_halen: 0,
            sll_addr: [0; 8],
        };
        // SAFETY: `sa` is a valid sockaddr_ll and the length passed is its size; bind only
        // reads it.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(err("bind(AF_PACKET)", last_error()));
        }
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: `tv` is a valid timeval that lives across the call, its size is passed, and
        // the kernel only reads it.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(err("setsockopt(SO_RCVTIMEO)", last_error()));
        }
        Ok(Self {
            file: File::from(fd),
        })
    }
}

impl PacketSocket {
    /// Sends written frames straight to the driver (`PACKET_QDISC_BYPASS`), which also makes
    /// the TX queue the writing CPU's number modulo the queue count (see [`pin_thread`]).
    ///
    /// # Errors
    /// [`XskError::Socket`] if `setsockopt(PACKET_QDISC_BYPASS)` fails.
    pub fn bypass_qdisc(&self) -> Result<(), XskError> {
        let one: libc::c_int = 1;
        // SAFETY: `one` is a valid c_int that lives across the call, its size is passed, and
        // the kernel only reads it.
        let rc = unsafe {
            libc::setsockopt(
                self.file.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_QDISC_BYPASS,
                (&one as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(XskError::Socket {
                iface: String::new(),
                queue: 0,
                call: "setsockopt(PACKET_QDISC_BYPASS)",
                source: last_error(),
            });
        }
        Ok(())
    }
}

impl Read for PacketSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read(buf)
    }
}

impl Write for PacketSocket {
    fn write(&mut self, frame: &[u8]) -> io::Result<usize> {
        self.file.write(frame)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
