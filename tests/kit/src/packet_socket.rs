//! A raw packet socket (AF_PACKET) bound to one interface: the privileged tests send and
//! capture Ethernet frames with it; the product has no raw packet socket. One of the unsafe
//! islands (docs/architecture.md, "Unsafe islands"): the socket calls.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// The last OS error, naming the call that failed and on which interface.
fn failed(iface: &str, call: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{call} on {iface}: {e}"))
}

/// The interface index of `iface` in the calling thread's namespace.
fn ifindex(iface: &str) -> io::Result<u32> {
    let name = std::ffi::CString::new(iface)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name with a NUL"))?;
    // SAFETY: `name` is a valid NUL-terminated string that lives across the call, which only
    // reads it.
    match unsafe { libc::if_nametoindex(name.as_ptr()) } {
        0 => Err(failed(iface, "if_nametoindex")),
        i => Ok(i),
    }
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
    /// The failed call, with the interface's name.
    pub fn open(iface: &str, timeout: Duration) -> io::Result<Self> {
        let idx = ifindex(iface)?;
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
            return Err(failed(iface, "socket(AF_PACKET)"));
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
            return Err(failed(iface, "bind(AF_PACKET)"));
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
            return Err(failed(iface, "setsockopt(SO_RCVTIMEO)"));
        }
        Ok(Self {
            file: File::from(fd),
        })
    }
}

impl PacketSocket {
    /// Sends written frames straight to the driver (`PACKET_QDISC_BYPASS`), which also makes
    /// the TX queue the writing CPU's number modulo the queue count (see `harness::pin_thread`).
    ///
    /// # Errors
    /// If `setsockopt(PACKET_QDISC_BYPASS)` fails.
    pub fn bypass_qdisc(&self) -> io::Result<()> {
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
            return Err(failed("the socket", "setsockopt(PACKET_QDISC_BYPASS)"));
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
