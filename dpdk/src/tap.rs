//! The exception interface of a DPDK port: a Linux TAP with the port's name and MAC, where
//! the kernel keeps the traffic that is not the gateway's (ARP and ND, health checks, BGP,
//! ssh). Non-blocking: a full TAP drops rather than stalls the worker.

use std::ffi::{c_char, CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::{ffi, DpdkError};

/// An open TAP. Writes and reads from any thread are whole frames (the TAP is a datagram
/// device), so workers share it.
#[derive(Debug)]
pub(crate) struct Tap {
    name: String,
    fd: OwnedFd,
}

impl Tap {
    /// Opens (or creates) TAP `name`, sets its MAC and MTU where they differ (so that an
    /// existing TAP keeps its neighbour entries) and brings it up.
    pub(crate) fn open(name: &str, mac: [u8; 6], mtu: u16) -> Result<Self, DpdkError> {
        let err = |call: String, source| DpdkError::Tap {
            iface: name.to_owned(),
            call,
            source,
        };
        let c = CString::new(name)
            .map_err(|_| err("name".into(), io::Error::from(io::ErrorKind::InvalidInput)))?;
        let mut step: *const c_char = std::ptr::null();
        // SAFETY: `c` is NUL-terminated, `mac` has 6 bytes, `step` is a valid pointer to
        // write; all live across the call.
        let fd = unsafe { ffi::strait_tap_open(c.as_ptr(), mac.as_ptr(), mtu, &mut step) };
        if fd < 0 {
            let call = if step.is_null() {
                "open".to_owned()
            } else {
                // SAFETY: the shim sets `step` to a static string literal on failure.
                unsafe { CStr::from_ptr(step) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(err(call, io::Error::from_raw_os_error(-fd)));
        }
        // SAFETY: the shim returned a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self {
            name: name.to_owned(),
            fd,
        })
    }

    /// Its name.
    #[allow(dead_code)]
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Writes one frame to the kernel; false when the TAP is full or down.
    #[inline]
    pub(crate) fn write(&self, frame: &[u8]) -> bool {
        // SAFETY: `frame` is a valid slice for the call; the fd is open while `self` lives.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        n == frame.len() as isize
    }

    /// Reads one frame the kernel sent into `buf`; `None` when there is none.
    #[inline]
    pub(crate) fn read(&self, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: `buf` is a valid writable slice for the call; the fd is open.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        (n > 0).then_some(n as usize)
    }
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strait_testkit::harness::{sh, Netns};
    use strait_testkit::privileged as gate;

    /// Attaching to a persistent TAP that already has the port's MAC and MTU leaves its
    /// neighbour entries alone (a permanent one among them: re-setting even the same MAC
    /// would flush it); a TAP with another MAC gets the port's.
    #[test]
    fn attaching_to_a_persistent_tap_keeps_its_neighbours() {
        if !gate::privileged("DPDK exception TAP", &[gate::IP]) {
            return;
        }
        let ns = Netns::add(&format!("sdt{}", std::process::id() % 100_000));
        let n = ns.name();
        sh(&["ip", "-n", n, "tuntap", "add", "dev", "tp0", "mode", "tap"]);
        sh(&[
            "ip",
            "-n",
            n,
            "link",
            "set",
            "tp0",
            "address",
            "02:00:00:00:0a:fe",
            "mtu",
            "1500",
            "up",
        ]);
        sh(&["ip", "-n", n, "addr", "add", "192.0.2.254/24", "dev", "tp0"]);
        sh(&[
            "ip",
            "-n",
            n,
            "neigh",
            "replace",
            "192.0.2.1",
            "lladdr",
            "02:00:00:00:0a:01",
            "dev",
            "tp0",
            "nud",
            "permanent",
        ]);
        let entry = "192.0.2.1 lladdr 02:00:00:00:0a:01 PERMANENT";
        let neigh = || sh(&["ip", "-n", n, "neigh", "show", "dev", "tp0"]);
        assert!(neigh().contains(entry), "{}", neigh());

        ns.run_in(|| {
            let tap = Tap::open("tp0", [2, 0, 0, 0, 0x0a, 0xfe], 1500).expect("attach");
            assert_eq!(tap.name(), "tp0");
        });
        assert!(
            neigh().contains(entry),
            "attaching flushed the TAP's neighbours: {}",
            neigh()
        );

        ns.run_in(|| Tap::open("tp0", [2, 0, 0, 0, 0x0a, 0xff], 1400).expect("attach"));
        let link = sh(&["ip", "-n", n, "link", "show", "tp0"]);
        assert!(
            link.contains("02:00:00:00:0a:ff") && link.contains("mtu 1400"),
            "{link}"
        );
    }
}
