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
    /// Opens (or creates) TAP `name`, sets its MAC and MTU and brings it up.
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
