//! IPv6 headers (RFC 8200) and the walk over extension headers to the upper layer.

use super::{be16, get16, get32, ip_version, put16, set32, Error};

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = 40;
/// Length of the fragment extension header.
pub const FRAG_HEADER_LEN: usize = 8;
/// Most extension headers walked before giving up. RFC 8200 recommends each appear at most
/// once (twice for Destination Options), so eight covers every legal chain; a longer chain is
/// an attack on parsers and is dropped.
pub const MAX_EXTENSIONS: usize = 8;

/// Next-header numbers of the extension headers this module walks.
pub mod next_header {
    /// Hop-by-Hop Options.
    pub const HOP_BY_HOP: u8 = 0;
    /// Routing.
    pub const ROUTING: u8 = 43;
    /// Fragment.
    pub const FRAGMENT: u8 = 44;
    /// Authentication Header (RFC 4302): length in 4-byte units.
    pub const AUTH: u8 = 51;
    /// Destination Options.
    pub const DEST_OPTS: u8 = 60;
    /// No Next Header.
    pub const NONE: u8 = 59;
}

mod field {
    use core::ops::Range;
    /// Version (4 bits), traffic class (8) and flow label (20).
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: Range<usize> = 8..24;
    pub const DST: Range<usize> = 24..40;
}

/// Where the fields of an extension header lie (RFC 8200 sections 4.3 to 4.5, RFC 4302
/// section 2), from its start.
mod ext_field {
    use crate::wire::Field;
    /// Next header: the same place in every extension header.
    pub const NEXT_HEADER: usize = 0;
    /// Length of the header, in units and less a count that depend on its kind; the
    /// fragment header has none (it is 8 bytes long), its second byte is reserved.
    pub const LEN: usize = 1;
    /// Fragment offset (in 8-byte units, the high 13 bits) and the M flag (the low bit).
    pub const FRAG_OFFSET_FLAGS: Field = 2..4;
    /// Fragment identification.
    pub const FRAG_IDENT: Field = 4..8;
}

/// Where the upper-layer header starts, and the fragment header if one was crossed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Upper {
    /// Protocol of the upper layer (TCP, UDP, ICMPv6, ...), or of the payload of a
    /// non-first fragment.
    pub protocol: u8,
    /// Offset of the upper-layer header from the start of the IPv6 header.
    pub offset: usize,
    /// The fragment header, if present.
    pub fragment: Option<Fragment>,
}

/// The fields of an IPv6 fragment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// Offset of this fragment's data in bytes.
    pub offset: usize,
    /// Whether more fragments follow.
    pub more: bool,
    /// Identification.
    pub ident: u32,
}

/// A view of an IPv6 packet.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buf` after checking the version and that the payload length fits.
    ///
    /// # Errors
    /// [`Error::Truncated`] when bytes are missing; [`Error::Malformed`] for a version other
    /// than 6. A payload length of zero (jumbogram, RFC 2675) is refused as malformed: no
    /// Ethernet path here carries one.
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if ip_version(b[field::VER_TC_FLOW.start]) != 6 {
            return Err(Error::Malformed);
        }
        let p = Self { buf };
        if p.payload_len() == 0 && p.next_header() != next_header::NONE {
            return Err(Error::Malformed);
        }
        if p.buf.as_ref().len() < HEADER_LEN + p.payload_len() as usize {
            return Err(Error::Truncated);
        }
        Ok(p)
    }

    /// Wraps bytes the caller vouches for: accessors panic past the end of `buf`. For frames
    /// validated by [`Packet::new_checked`] (the pipeline re-wraps a frame it parsed to
    /// rewrite it), the fixed header an ICMP error quotes (whose stated length runs past the
    /// quote), and a header about to be written.
    #[inline(always)]
    pub(crate) fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }

    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        ((get32(self.buf.as_ref(), field::VER_TC_FLOW) >> 20) & 0xff) as u8
    }

    /// Flow label.
    pub fn flow_label(&self) -> u32 {
        get32(self.buf.as_ref(), field::VER_TC_FLOW) & 0x000f_ffff
    }

    /// Payload length (everything after the fixed header).
    pub fn payload_len(&self) -> u16 {
        be16(self.buf.as_ref(), field::PAYLOAD_LEN)
    }

    /// Next header of the fixed header.
    pub fn next_header(&self) -> u8 {
        self.buf.as_ref()[field::NEXT_HEADER]
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buf.as_ref()[field::HOP_LIMIT]
    }

    /// Source address.
    pub fn src(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buf.as_ref()[field::SRC]);
        a
    }

    /// Destination address.
    pub fn dst(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buf.as_ref()[field::DST]);
        a
    }

    /// Total length of the packet (fixed header plus payload).
    pub fn total_len(&self) -> usize {
        HEADER_LEN + self.payload_len() as usize
    }

    /// Walks the extension headers to the upper layer, at most [`MAX_EXTENSIONS`] of them.
    ///
    /// # Errors
    /// [`Error::Truncated`] when a header runs past the payload; [`Error::Malformed`] for a
    /// chain longer than [`MAX_EXTENSIONS`] or Hop-by-Hop anywhere but first.
    pub fn upper(&self) -> Result<Upper, Error> {
        let b = &self.buf.as_ref()[..self.total_len()];
        let mut nh = self.next_header();
        let mut off = HEADER_LEN;
        let mut fragment = None;
        for i in 0..=MAX_EXTENSIONS {
            let len = match nh {
                next_header::HOP_BY_HOP if i > 0 => return Err(Error::Malformed),
                next_header::HOP_BY_HOP | next_header::ROUTING | next_header::DEST_OPTS => {
                    if b.len() < off + ext_field::LEN + 1 {
                        return Err(Error::Truncated);
                    }
                    (b[off + ext_field::LEN] as usize + 1) * 8
                }
                next_header::AUTH => {
                    if b.len() < off + ext_field::LEN + 1 {
                        return Err(Error::Truncated);
                    }
                    (b[off + ext_field::LEN] as usize + 2) * 4
                }
                next_header::FRAGMENT => {
                    if b.len() < off + FRAG_HEADER_LEN {
                        return Err(Error::Truncated);
                    }
                    let h = &b[off..off + FRAG_HEADER_LEN];
                    let w = get16(h, ext_field::FRAG_OFFSET_FLAGS);
                    fragment = Some(Fragment {
                        offset: (w & 0xfff8) as usize,
                        more: w & 1 != 0,
                        ident: get32(h, ext_field::FRAG_IDENT),
                    });
                    FRAG_HEADER_LEN
                }
                protocol => {
                    return Ok(Upper {
                        protocol,
                        offset: off,
                        fragment,
                    })
                }
            };
            if b.len() < off + len {
                return Err(Error::Truncated);
            }
            nh = b[off + ext_field::NEXT_HEADER];
            off += len;
            if matches!(fragment, Some(f) if f.offset != 0) {
                // A non-first fragment's payload is opaque: no further header to walk.
                return Ok(Upper {
                    protocol: nh,
                    offset: off,
                    fragment,
                });
            }
        }
        Err(Error::Malformed)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source address (IPv6 has no header checksum; the caller fixes the upper
    /// layer's).
    pub fn set_src(&mut self, a: [u8; 16]) {
        self.buf.as_mut()[field::SRC].copy_from_slice(&a);
    }

    /// Sets the destination address.
    pub fn set_dst(&mut self, a: [u8; 16]) {
        self.buf.as_mut()[field::DST].copy_from_slice(&a);
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, h: u8) {
        self.buf.as_mut()[field::HOP_LIMIT] = h;
    }
}

/// An IPv6 header without extension headers, as the gateway writes it (the outer header of
/// an encapsulation, the header of an ICMPv6 error it answers with): [`Repr::emit`] writes
/// it whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// Protocol of the payload.
    pub next_header: u8,
    /// Length of the payload (everything after the 40-byte header).
    pub payload_len: u16,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// Flow label; only its low 20 bits are written.
    pub flow_label: u32,
}

impl Repr {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `packet`.
    ///
    /// # Panics
    /// If `packet` holds fewer than [`HEADER_LEN`] bytes.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        let b = &mut packet.buf.as_mut()[..HEADER_LEN];
        let w = (6u32 << 28) | (self.traffic_class as u32) << 20 | (self.flow_label & 0x000f_ffff);
        set32(b, field::VER_TC_FLOW, w);
        put16(b, field::PAYLOAD_LEN, self.payload_len);
        b[field::NEXT_HEADER] = self.next_header;
        b[field::HOP_LIMIT] = self.hop_limit;
        b[field::SRC].copy_from_slice(&self.src);
        b[field::DST].copy_from_slice(&self.dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(next: u8, ext: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        let src = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let mut dst = src;
        dst[15] = 0x10;
        Repr {
            src,
            dst,
            next_header: next,
            payload_len: (ext.len() + payload.len()) as u16,
            hop_limit: 64,
            traffic_class: 0x28,
            flow_label: 0xf12345,
        }
        .emit(&mut Packet::new_unchecked(&mut b[..]));
        b.extend_from_slice(ext);
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn deconstruct() {
        let b = packet(17, &[], &[0; 8]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.traffic_class(), 0x28);
        assert_eq!(p.flow_label(), 0x12345);
        assert_eq!(p.payload_len(), 8);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.src()[15], 1);
        assert_eq!(p.dst()[15], 0x10);
        assert_eq!(
            p.upper().unwrap(),
            Upper {
                protocol: 17,
                offset: 40,
                fragment: None
            }
        );
    }

    #[test]
    fn walks_extensions_and_fragment() {
        // Hop-by-hop (8 bytes) -> Destination options (16 bytes) -> Fragment -> UDP.
        let mut ext = vec![60, 0, 1, 4, 0, 0, 0, 0];
        ext.extend_from_slice(&[44, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        ext.extend_from_slice(&[17, 0, 0x00, 0x01, 0xde, 0xad, 0xbe, 0xef]);
        let b = packet(0, &ext, &[0; 8]);
        let u = Packet::new_checked(&b[..]).unwrap().upper().unwrap();
        assert_eq!(u.protocol, 17);
        assert_eq!(u.offset, 40 + 32);
        assert_eq!(
            u.fragment,
            Some(Fragment {
                offset: 0,
                more: true,
                ident: 0xdeadbeef
            })
        );
    }

    #[test]
    fn non_first_fragment_stops() {
        let ext = [6, 0, 0x05, 0x00, 0, 0, 0, 7];
        let b = packet(44, &ext, &[0; 16]);
        let u = Packet::new_checked(&b[..]).unwrap().upper().unwrap();
        assert_eq!(
            u.fragment,
            Some(Fragment {
                offset: 0x500,
                more: false,
                ident: 7
            })
        );
        assert_eq!(u.protocol, 6);
    }

    #[test]
    fn errors() {
        let b = packet(17, &[], &[0; 8]);
        assert_eq!(Packet::new_checked(&b[..47]).unwrap_err(), Error::Truncated);
        let mut bad = b.clone();
        bad[0] = 0x40;
        assert_eq!(Packet::new_checked(&bad[..]).unwrap_err(), Error::Malformed);
        // Hop-by-hop not first.
        let b = packet(60, &[0, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0, 0], &[]);
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap().upper().unwrap_err(),
            Error::Malformed
        );
        // Extension running past the payload.
        let b = packet(60, &[17, 4, 0, 0, 0, 0, 0, 0], &[]);
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap().upper().unwrap_err(),
            Error::Truncated
        );
        // Too many extensions.
        let mut ext = Vec::new();
        for _ in 0..10 {
            ext.extend_from_slice(&[60, 0, 0, 0, 0, 0, 0, 0]);
        }
        let b = packet(60, &ext, &[]);
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap().upper().unwrap_err(),
            Error::Malformed
        );
    }
}
