//! Rewrites: each one changes its fields and fixes every checksum it touches in one call, so
//! a half-rewritten frame cannot leave. Checksums are updated incrementally (RFC 1624) except
//! where a new header is written whole.
//!
//! All functions take the frame and the [`Parsed`] summary of it and trust that summary
//! (offsets in range); they are called only by the pipeline right after parsing.

use crate::key::is_v4;
use crate::key::proto;
use crate::wire::checksum::{self, update16, update_bytes};
use crate::wire::parse::{Frag, Parsed};
use crate::wire::{ethernet, icmp, ipv4, ipv6, put16, tcp, udp};

/// A frame in a buffer with headroom: the packet is `buf[head..head + len]`.
///
/// Encapsulation grows the packet at the front by moving `head` back, so the payload is never
/// copied; the AF_XDP driver reserves the headroom in every UMEM frame.
#[derive(Debug)]
pub struct Frame<'a> {
    buf: &'a mut [u8],
    head: usize,
    len: usize,
}

/// Headroom a driver should leave in front of every frame: the largest encapsulation
/// (IPv6 outer header 40 + UDP 8), rounded up to a cache line.
pub const HEADROOM: usize = 64;

impl<'a> Frame<'a> {
    /// A frame whose packet is `buf[head..head + len]`.
    ///
    /// # Panics
    /// If `head + len > buf.len()`.
    pub fn new(buf: &'a mut [u8], head: usize, len: usize) -> Self {
        assert!(
            head + len <= buf.len(),
            "frame {head}+{len} outside a buffer of {}",
            buf.len()
        );
        Self { buf, head, len }
    }

    /// The packet bytes.
    #[inline(always)]
    pub fn data(&self) -> &[u8] {
        &self.buf[self.head..self.head + self.len]
    }

    /// The packet bytes, writable.
    #[inline(always)]
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.head..self.head + self.len]
    }

    /// Offset of the packet in the buffer.
    pub fn head(&self) -> usize {
        self.head
    }

    /// Length of the packet.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Space in front of the packet.
    pub fn headroom(&self) -> usize {
        self.head
    }

    /// Space after the packet.
    pub fn tailroom(&self) -> usize {
        self.buf.len() - self.head - self.len
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn push_front(&mut self, n: usize) {
        self.head -= n;
        self.len += n;
    }
}

/// Source and destination MACs of a frame leaving the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Macs {
    /// The egress port's own MAC.
    pub src: [u8; 6],
    /// The next hop's MAC.
    pub dst: [u8; 6],
}

#[inline(always)]
fn set_macs(data: &mut [u8], m: Macs) {
    data[0..6].copy_from_slice(&m.dst);
    data[6..12].copy_from_slice(&m.src);
}

/// dsr-l2: only the MACs change; the IP packet, VIP included, is untouched and the TTL is
/// kept, because the gateway bridges to the backend rather than routing.
#[inline]
pub fn dsr_l2(frame: &mut Frame<'_>, m: Macs) {
    set_macs(frame.data_mut(), m);
}

/// Offset of the transport checksum for a protocol, if it has one that covers the
/// pseudo-header and the packet carries it.
#[inline(always)]
fn l4_checksum_at(p: &Parsed) -> Option<usize> {
    if p.frag == Frag::Later {
        return None;
    }
    let off = match p.proto {
        proto::TCP => tcp::CHECKSUM_OFFSET,
        proto::UDP => udp::CHECKSUM_OFFSET,
        _ => return None,
    };
    let at = p.l4 + off;
    // A first fragment may be cut before the checksum field; nothing to fix then.
    (at + 2 <= p.l3 + p.ip_len).then_some(at)
}

/// Rewrites one address (`dst` or `src`) and its port, fixing the IPv4 header checksum and
/// the transport checksum, and decrements the TTL / hop limit. The caller checked the TTL.
#[inline]
fn nat(frame: &mut Frame<'_>, p: &Parsed, dst_side: bool, addr: &[u8; 16], port: u16, m: Macs) {
    let d = frame.data_mut();
    set_macs(d, m);
    let csum_at = l4_checksum_at(p);
    let (old_addr, new_addr): (&[u8], &[u8]) = if p.v6 {
        (if dst_side { &p.dst } else { &p.src }, &addr[..])
    } else {
        (
            if dst_side { &p.dst[12..] } else { &p.src[12..] },
            &addr[12..],
        )
    };
    if let Some(at) = csum_at {
        let mut c = u16::from_be_bytes([d[at], d[at + 1]]);
        let udp_v4_none = p.proto == proto::UDP && !p.v6 && c == 0;
        if !udp_v4_none {
            c = update_bytes(c, old_addr, new_addr);
            if p.frag != Frag::Later {
                let port_at = p.l4 + if dst_side { 2 } else { 0 };
                let old_port = u16::from_be_bytes([d[port_at], d[port_at + 1]]);
                c = update16(c, old_port, port);
            }
            if p.proto == proto::UDP {
                c = checksum::udp_nonzero(c);
            }
            put16(d, at, c);
        }
    }
    if p.frag != Frag::Later && matches!(p.proto, proto::TCP | proto::UDP) {
        put16(d, p.l4 + if dst_side { 2 } else { 0 }, port);
    }
    if p.v6 {
        let mut ip = ipv6::Packet::new_unchecked(&mut d[p.l3..]);
        if dst_side {
            ip.set_dst(*addr);
        } else {
            ip.set_src(*addr);
        }
        ip.set_hop_limit(p.ttl - 1);
    } else {
        let mut a = [0u8; 4];
        a.copy_from_slice(&addr[12..]);
        let mut ip = ipv4::Packet::new_unchecked(&mut d[p.l3..]);
        if dst_side {
            ip.set_dst(a);
        } else {
            ip.set_src(a);
        }
        ip.decrement_ttl();
    }
}

/// nat, client to backend: destination VIP:port becomes backend:port.
#[inline]
pub fn nat_forward(frame: &mut Frame<'_>, p: &Parsed, addr: &[u8; 16], port: u16, m: Macs) {
    nat(frame, p, true, addr, port, m);
}

/// nat, backend to client: source backend:port becomes VIP:port.
#[inline]
pub fn nat_reply(frame: &mut Frame<'_>, p: &Parsed, addr: &[u8; 16], port: u16, m: Macs) {
    nat(frame, p, false, addr, port, m);
}

/// Outer header of an encapsulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encap {
    /// IP-in-IP (RFC 2003, RFC 2473).
    Ipip,
    /// GUE variant 1, direct IP-in-UDP (draft-ietf-intarea-gue section 4): the UDP payload is
    /// the inner IP packet itself, its version nibble telling IPv4 from IPv6. Chosen over
    /// variant 0 because it is what Katran emits and what the Linux `fou` module's
    /// `encap gue` decapsulates with `ipproto` omitted; it saves the 4-byte GUE header.
    Gue {
        /// UDP destination port.
        port: u16,
    },
}

/// Why an encapsulation was not done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncapError {
    /// The outer packet would exceed this MTU.
    TooBig {
        /// The MTU the inner packet must fit to pass, i.e. egress MTU minus overhead.
        inner_mtu: u16,
    },
    /// The frame lacks the headroom for the outer header.
    NoHeadroom,
}

/// Where and how to encapsulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outer {
    /// IPIP or GUE.
    pub how: Encap,
    /// Outer source (key form); its low bits are replaced by flow entropy.
    pub src: [u8; 16],
    /// Outer destination (key form): the backend node.
    pub dst: [u8; 16],
    /// The flow hash.
    pub entropy: u64,
    /// Egress MTU.
    pub mtu: u16,
}

/// Encapsulates the IP packet of `frame` to `o.dst` from `o.src`, keeping the Ethernet
/// header (and VLAN tag) in front. The outer TOS/traffic class is copied from the inner
/// packet, and for IPv4-in-IPv4 the DF bit too (RFC 2003 section 3.1); the outer TTL is 64.
/// `o.entropy` (the flow hash) varies the outer source's low bits and the GUE source port,
/// so receivers spread flows over their queues by RSS as they would the clients' packets.
///
/// # Errors
/// [`EncapError`] without touching the frame.
#[inline]
pub fn encapsulate(
    frame: &mut Frame<'_>,
    p: &Parsed,
    o: &Outer,
    m: Macs,
) -> Result<(), EncapError> {
    let Outer {
        how,
        src,
        dst,
        entropy,
        mtu,
    } = *o;
    let (src, dst) = (&src, &dst);
    let outer_v6 = !is_v4(dst);
    let ip_hdr = if outer_v6 {
        ipv6::HEADER_LEN
    } else {
        ipv4::HEADER_LEN
    };
    let udp_hdr = if matches!(how, Encap::Gue { .. }) {
        udp::HEADER_LEN
    } else {
        0
    };
    let overhead = ip_hdr + udp_hdr;
    if p.ip_len + overhead > mtu as usize {
        return Err(EncapError::TooBig {
            inner_mtu: mtu.saturating_sub(overhead as u16),
        });
    }
    if frame.headroom() < overhead {
        return Err(EncapError::NoHeadroom);
    }
    frame.truncate(p.l3 + p.ip_len); // drop link padding
    let l2 = p.l3;
    frame.push_front(overhead);
    let d = frame.data_mut();
    d.copy_within(overhead..overhead + l2, 0);
    set_macs(d, m);
    put16(
        d,
        l2 - 2,
        if outer_v6 {
            ethernet::ETHERTYPE_IPV6
        } else {
            ethernet::ETHERTYPE_IPV4
        },
    );
    let inner_proto = if p.v6 { proto::IPV6 } else { proto::IPIP };
    let (next, payload_len) = match how {
        Encap::Ipip => (inner_proto, p.ip_len),
        Encap::Gue { .. } => (proto::UDP, p.ip_len + udp::HEADER_LEN),
    };
    let mut s = *src;
    if outer_v6 {
        let e = (entropy as u16).to_be_bytes();
        s[14] = e[0];
        s[15] = e[1];
        ipv6::emit(
            &mut d[l2..],
            p.tos,
            (entropy >> 16) as u32,
            payload_len as u16,
            next,
            64,
            s,
            *dst,
        );
    } else {
        s[15] = entropy as u8;
        let (mut s4, mut d4) = ([0u8; 4], [0u8; 4]);
        s4.copy_from_slice(&s[12..]);
        d4.copy_from_slice(&dst[12..]);
        let df = p.df && !p.v6;
        let ident = if df { 0 } else { (entropy >> 24) as u16 };
        ipv4::emit(
            &mut d[l2..],
            p.tos,
            (ip_hdr + payload_len) as u16,
            ident,
            df,
            64,
            next,
            s4,
            d4,
        );
    }
    if let Encap::Gue { port } = how {
        let u = l2 + ip_hdr;
        // Ephemeral range 49152..=65535 (RFC 6335) from the flow hash, as RFC 8086 asks of
        // GRE-in-UDP, so the outer 5-tuple carries the flow's entropy.
        let sport = 0xc000 | (entropy as u16 & 0x3fff);
        udp::emit(&mut d[u..], sport, port, payload_len as u16);
        if outer_v6 {
            // RFC 6935/6936 allow a zero UDP checksum for tunnels over IPv6 only where both ends
            // opt in; compute it so any receiver accepts the packet.
            let ps = checksum::pseudo_header(&s, dst, proto::UDP, payload_len as u32);
            let c = !checksum::fold(checksum::sum(ps, &d[u..u + payload_len]));
            put16(d, u + udp::CHECKSUM_OFFSET, checksum::udp_nonzero(c));
        }
        // Over IPv4 the checksum stays zero (RFC 768: "no checksum"), as GUE allows and the
        // kernel's fou sends by default; the inner packet has its own checksums.
    }
    Ok(())
}

/// Turns `frame` (a client packet to a VIP that would not fit after encapsulation) into an
/// ICMP "fragmentation needed" (IPv4, RFC 1191) or "packet too big" (IPv6, RFC 8201) sent
/// back to the client from the VIP, quoting the original header. The answer goes out of the
/// port the packet came in on, from that port's MAC (`port_mac`) to the MAC the packet came
/// from.
#[inline]
pub fn icmp_too_big(frame: &mut Frame<'_>, p: &Parsed, inner_mtu: u16, port_mac: [u8; 6]) {
    let l2 = p.l3;
    let room = frame.len() + frame.tailroom();
    let d = &mut frame.buf[frame.head..frame.head + room];
    // Back to where it came from, from this port's own MAC (never the frame's destination
    // MAC, which may be broadcast or another host's).
    d.copy_within(6..12, 0);
    d[6..12].copy_from_slice(&port_mac);
    let (ip_hdr, quote_max) = if p.v6 {
        // RFC 4443 section 2.4(c): as much of the invoking packet as fits in the minimum MTU.
        (ipv6::HEADER_LEN, 1280 - ipv6::HEADER_LEN - icmp::HEADER_LEN)
    } else {
        // RFC 1812 section 4.3.2.3 allows more, RFC 792 asks for the header and 8 bytes; 548
        // keeps the answer within the 576-byte minimum datagram.
        (ipv4::HEADER_LEN, 576 - ipv4::HEADER_LEN - icmp::HEADER_LEN)
    };
    let start = l2 + ip_hdr + icmp::HEADER_LEN;
    let quote = p.ip_len.min(quote_max).min(room - start);
    // Move the quoted original packet behind the new headers (it starts at l2 today).
    d.copy_within(l2..l2 + quote, start);
    let icmp_len = icmp::HEADER_LEN + quote;
    let ic = l2 + ip_hdr;
    if p.v6 {
        d[ic] = icmp::v6::PACKET_TOO_BIG;
        d[ic + 1] = 0;
        d[ic + 4..ic + 8].copy_from_slice(&(inner_mtu as u32).to_be_bytes());
        ipv6::emit(
            &mut d[l2..],
            0,
            0,
            icmp_len as u16,
            proto::ICMPV6,
            64,
            p.dst,
            p.src,
        );
    } else {
        d[ic] = icmp::v4::DEST_UNREACHABLE;
        d[ic + 1] = icmp::v4::CODE_FRAG_NEEDED;
        d[ic + 4..ic + 6].copy_from_slice(&[0, 0]);
        d[ic + 6..ic + 8].copy_from_slice(&inner_mtu.to_be_bytes());
        let (mut s4, mut d4) = ([0u8; 4], [0u8; 4]);
        s4.copy_from_slice(&p.dst[12..]);
        d4.copy_from_slice(&p.src[12..]);
        ipv4::emit(
            &mut d[l2..],
            0,
            (ip_hdr + icmp_len) as u16,
            0,
            true,
            64,
            proto::ICMP,
            s4,
            d4,
        );
    }
    put16(d, ic + icmp::CHECKSUM_OFFSET, 0);
    let mut acc = checksum::sum(0, &d[ic..ic + icmp_len]);
    if p.v6 {
        acc += checksum::pseudo_header(&p.dst, &p.src, proto::ICMPV6, icmp_len as u32);
    }
    put16(d, ic + icmp::CHECKSUM_OFFSET, !checksum::fold(acc));
    frame.len = l2 + ip_hdr + icmp_len;
}

/// nat for an ICMP error about a nat flow, arriving from the client side: the outer
/// destination (the VIP) becomes the backend, and the embedded packet (which left the gateway
/// as VIP:port to client) gets its source back to backend:port, so the backend's stack
/// matches it to its socket. Fixes the embedded IPv4 header checksum, the embedded transport
/// checksum when the quote holds it (as Linux's nf_nat_icmp_reply_translation does), the ICMP
/// checksum and the outer header.
pub fn nat_icmp_error(frame: &mut Frame<'_>, p: &Parsed, addr: &[u8; 16], port: u16, m: Macs) {
    let Some(e) = p.embedded else { return };
    let d = frame.data_mut();
    set_macs(d, m);
    let ic = p.l4 + icmp::CHECKSUM_OFFSET;
    let mut c = u16::from_be_bytes([d[ic], d[ic + 1]]);
    // Embedded transport checksum, when quoted: it covers the embedded source address (in
    // its pseudo-header) and port. A zero UDP checksum over IPv4 means none and stays.
    let l4c = e.l4
        + if e.proto == proto::TCP {
            tcp::CHECKSUM_OFFSET
        } else {
            udp::CHECKSUM_OFFSET
        };
    if l4c + 2 <= e.end {
        let old_l4c = u16::from_be_bytes([d[l4c], d[l4c + 1]]);
        if !(e.proto == proto::UDP && !p.v6 && old_l4c == 0) {
            let (old_a, new_a): (&[u8], &[u8]) = if p.v6 {
                (&e.src, &addr[..])
            } else {
                (&e.src[12..], &addr[12..])
            };
            let old_port = u16::from_be_bytes([d[e.l4], d[e.l4 + 1]]);
            let mut n = update16(update_bytes(old_l4c, old_a, new_a), old_port, port);
            if e.proto == proto::UDP {
                n = checksum::udp_nonzero(n);
            }
            c = update16(c, old_l4c, n);
            put16(d, l4c, n);
        }
    }
    // Embedded source port.
    let old_port = u16::from_be_bytes([d[e.l4], d[e.l4 + 1]]);
    c = update16(c, old_port, port);
    put16(d, e.l4, port);
    // Embedded source address (and the embedded IPv4 header checksum, which the ICMP
    // checksum covers too).
    if p.v6 {
        c = update_bytes(c, &e.src, addr);
        d[e.ip + 8..e.ip + 24].copy_from_slice(addr);
    } else {
        let ec = e.ip + 10;
        let old_ec = u16::from_be_bytes([d[ec], d[ec + 1]]);
        let new_ec = update_bytes(old_ec, &e.src[12..], &addr[12..]);
        c = update_bytes(c, &e.src[12..], &addr[12..]);
        c = update16(c, old_ec, new_ec);
        put16(d, ec, new_ec);
        d[e.ip + 12..e.ip + 16].copy_from_slice(&addr[12..]);
    }
    if p.v6 {
        // ICMPv6's checksum covers the pseudo-header, so the outer destination change too.
        c = update_bytes(c, &p.dst, addr);
        put16(d, ic, c);
        let mut ip = ipv6::Packet::new_unchecked(&mut d[p.l3..]);
        ip.set_dst(*addr);
        ip.set_hop_limit(p.ttl - 1);
    } else {
        put16(d, ic, c);
        let mut a = [0u8; 4];
        a.copy_from_slice(&addr[12..]);
        let mut ip = ipv4::Packet::new_unchecked(&mut d[p.l3..]);
        ip.set_dst(a);
        ip.decrement_ttl();
    }
}
