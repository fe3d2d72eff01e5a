//! The transport ports TCP, UDP and SCTP share: their headers all begin with the source and
//! destination port, two bytes each.
//!
//! Where a step needs the ports and nothing else of whichever of the three a packet carries
//! (a nat rewrite writes one port before it fixes the protocol's own checksum, an ICMP error
//! quotes at least these bytes of the packet that caused it, RFC 792), it reads them through
//! this view instead of choosing among three views that agree on these four bytes.

use super::{get16, get32, set16, Error, Field};

/// Length of the two ports.
pub const LEN: usize = field::DST_PORT.end;

mod field {
    use super::Field;
    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
}

/// A view of the first four bytes of a TCP, UDP or SCTP header.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buf` after checking that the two ports fit. No accessor panics afterwards.
    ///
    /// # Errors
    /// [`Error::Truncated`] when fewer than [`LEN`] bytes are there.
    #[inline(always)]
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        if buf.as_ref().len() < LEN {
            return Err(Error::Truncated);
        }
        Ok(Self { buf })
    }

    /// Wraps bytes whose length the caller checked (at least [`LEN`]); accessors panic on
    /// shorter ones.
    #[inline(always)]
    pub(crate) fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }

    /// Source port.
    #[inline(always)]
    pub fn src_port(&self) -> u16 {
        get16(self.buf.as_ref(), field::SRC_PORT)
    }

    /// Destination port.
    #[inline(always)]
    pub fn dst_port(&self) -> u16 {
        get16(self.buf.as_ref(), field::DST_PORT)
    }

    /// Source and destination port, read as one 32-bit word: one load and one byte swap
    /// for both.
    #[inline(always)]
    pub fn pair(&self) -> (u16, u16) {
        let w = get32(
            self.buf.as_ref(),
            field::SRC_PORT.start..field::DST_PORT.end,
        );
        ((w >> 16) as u16, w as u16)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port (the protocol's checksum is the caller's).
    #[inline(always)]
    pub fn set_src_port(&mut self, port: u16) {
        set16(self.buf.as_mut(), field::SRC_PORT, port);
    }

    /// Sets the destination port (the protocol's checksum is the caller's).
    #[inline(always)]
    pub fn set_dst_port(&mut self, port: u16) {
        set16(self.buf.as_mut(), field::DST_PORT, port);
    }
}

/// The port accessors of the TCP, UDP and SCTP views, defined once: `read` inside a view's
/// `impl<T: AsRef<[u8]>>` block, `write` inside its `impl<T: AsRef<[u8]> + AsMut<[u8]>>`
/// block (each view is a `Packet<T>` with its bytes in `buf`). Each accessor goes through
/// this module's [`Packet`]; inlined, it is the same load or store as a field of the view.
macro_rules! accessors {
    (read) => {
        /// The two ports, through the view TCP, UDP and SCTP share.
        #[inline(always)]
        pub fn ports(&self) -> $crate::wire::ports::Packet<&[u8]> {
            $crate::wire::ports::Packet::new_unchecked(self.buf.as_ref())
        }

        /// Source port.
        #[inline(always)]
        pub fn src_port(&self) -> u16 {
            self.ports().src_port()
        }

        /// Destination port.
        #[inline(always)]
        pub fn dst_port(&self) -> u16 {
            self.ports().dst_port()
        }
    };
    (write, $checksum:literal) => {
        /// The two ports, writable, through the view TCP, UDP and SCTP share.
        #[inline(always)]
        pub fn ports_mut(&mut self) -> $crate::wire::ports::Packet<&mut [u8]> {
            $crate::wire::ports::Packet::new_unchecked(self.buf.as_mut())
        }

        #[doc = concat!("Sets the source port (", $checksum, ").")]
        #[inline(always)]
        pub fn set_src_port(&mut self, port: u16) {
            self.ports_mut().set_src_port(port);
        }

        #[doc = concat!("Sets the destination port (", $checksum, ").")]
        #[inline(always)]
        pub fn set_dst_port(&mut self, port: u16) {
            self.ports_mut().set_dst_port(port);
        }
    };
}
pub(crate) use accessors;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let mut b = [0xc0, 0x01, 0x00, 0x50, 0xff];
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port()), (49153, 80));
        assert_eq!(p.pair(), (49153, 80));
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_src_port(8443);
        p.set_dst_port(53);
        assert_eq!(b, [0x20, 0xfb, 0x00, 0x35, 0xff]);
        assert_eq!(Packet::new_checked(&b[..3]).unwrap_err(), Error::Truncated);
    }
}
