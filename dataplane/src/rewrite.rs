//! Rewrites: each one changes its fields and fixes every checksum it touches in one call, so
//! a half-rewritten frame cannot leave. Checksums are updated incrementally (RFC 1624) except
//! where a new header is written whole.
//!
//! Every rewrite that sends a client's or a backend's TCP/UDP segment on also completes a
//! checksum its sender left to offload ([`Parsed::l4_partial`]): dsr-l2 and the
//! encapsulations in place before anything else (the segment and its addresses do not
//! change), nat after rewriting, over the final addresses and ports, instead of the
//! incremental update (which would carry the pseudo-header sum along as if it were a
//! checksum). So the frame leaves with the checksums a device would have written, whatever
//! the sender's offloads, and the work, one pass over the segment, falls on those frames
//! only.
//!
//! SCTP's CRC32c covers the SCTP packet and no pseudo-header: dsr-l2 and the encapsulations
//! leave it as it is (completing a zero field left to offload), and nat, which changes a
//! port, computes it anew over the whole packet once the port is written (a CRC has no
//! RFC 1624 shortcut). The pipeline checks the CRC before a nat rewrite
//! ([`sctp_intact`]), so a packet damaged on the way is dropped, not given a valid checksum.
//!
//! All functions take the frame and the [`Parsed`] summary of it and trust that summary
//! (offsets in range); they are called only by the pipeline right after parsing. They touch
//! the frame only through the wire views ([`crate::wire`]), made unchecked over the bytes
//! of the layer at the summary's offsets: the parse already checked their lengths, and the
//! views' accessors compile to the loads and stores of the fields.

use crate::key::{is_v4, proto, v4_unmapped, Addr};
use crate::wire::checksum::{self, update16, update_bytes};
use crate::wire::parse::{Frag, Parsed};
use crate::wire::{ethernet, icmp, ipv4, ipv6, ports, sctp, tcp, udp};

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

/// TTL (hop limit) of the IP headers the gateway writes: an encapsulation's outer header and
/// an ICMP error's; Linux's default (`net.ipv4.ip_default_ttl`).
const TTL: u8 = 64;

/// Source and destination MACs of a frame leaving the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Macs {
    /// The egress port's own MAC.
    pub src: ethernet::Address,
    /// The next hop's MAC.
    pub dst: ethernet::Address,
}

#[inline(always)]
fn set_macs(data: &mut [u8], m: Macs) {
    let mut eth = ethernet::Packet::new_unchecked(data);
    eth.set_dst(m.dst);
    eth.set_src(m.src);
}

/// dsr-l2: only the MACs change (and a checksum left to offload is completed); the IP
/// packet, VIP included, is otherwise untouched and the TTL is kept, because the gateway
/// bridges to the backend rather than routing.
#[inline]
pub fn dsr_l2(frame: &mut Frame<'_>, p: &Parsed, m: Macs) {
    let d = frame.data_mut();
    if p.l4_partial {
        complete_l4(d, p);
    }
    set_macs(d, m);
}

/// Completes the TCP/UDP checksum of a frame a local sender left to offload
/// (`CHECKSUM_PARTIAL` on a veth or TAP: the field holds only the pseudo-header sum), if it
/// is one; returns whether it was. For drivers that hand `Verdict::Pass` frames to the kernel
/// as bytes (DPDK's exception TAP), where the kernel would verify, and drop, such a frame;
/// a frame that does not parse is left as it is.
pub fn complete_partial(data: &mut [u8]) -> bool {
    match crate::wire::parse::parse(data) {
        Ok(Some(p)) if p.l4_partial => {
            complete_l4(data, &p);
            true
        }
        _ => false,
    }
}

/// Completes the TCP/UDP checksum of a packet whose sender left it to offload
/// (`p.l4_partial`): the full sum over the segment as it stands in `d`, with the
/// pseudo-header of the addresses now in `d`'s IP header, so that after a rewrite it covers
/// the final addresses and ports. The segment is the whole IP payload, as the sender's
/// device would have summed it (link padding excluded). Cold and out of line: frames from
/// senders whose checksums are complete (every frame from a NIC) never call it. For SCTP,
/// the CRC32c over the packet ([`sctp_checksum`]).
#[cold]
#[inline(never)]
fn complete_l4(d: &mut [u8], p: &Parsed) {
    debug_assert!(p.l4_partial && p.frag == Frag::None);
    if p.key.proto == proto::SCTP {
        return sctp_checksum(d, p);
    }
    let end = p.l3 + p.ip_len;
    let len = (end - p.l4) as u32;
    let pseudo = if p.v6 {
        let ip = ipv6::Packet::new_unchecked(&d[p.l3..]);
        checksum::pseudo_header(&ip.src(), &ip.dst(), p.key.proto.0, len)
    } else {
        let ip = ipv4::Packet::new_unchecked(&d[p.l3..]);
        checksum::pseudo_header(&ip.src(), &ip.dst(), p.key.proto.0, len)
    };
    let segment = &mut d[p.l4..end];
    if p.key.proto == proto::TCP {
        tcp::Packet::new_unchecked(segment).fill_checksum(pseudo);
    } else {
        udp::Packet::new_unchecked(segment).fill_checksum(pseudo);
    }
}

/// Writes the CRC32c of an unfragmented SCTP packet into its checksum field: one pass over
/// the packet (link padding excluded).
#[inline]
fn sctp_checksum(d: &mut [u8], p: &Parsed) {
    debug_assert!(p.key.proto == proto::SCTP && p.frag == Frag::None);
    sctp::fill_checksum(&mut d[p.l4..p.l3 + p.ip_len]);
}

/// Whether the CRC32c of an unfragmented SCTP packet verifies, or was left to offload (a
/// zero field, completed by the rewrite): what the pipeline asks before a nat rewrite, which
/// recomputes the CRC and would otherwise make a damaged packet look whole. One pass over
/// the packet.
#[inline]
pub fn sctp_intact(d: &[u8], p: &Parsed) -> bool {
    debug_assert!(p.key.proto == proto::SCTP && p.frag == Frag::None);
    p.l4_partial || sctp::verify(&d[p.l4..p.l3 + p.ip_len])
}

/// Rewrites one address (`dst` or `src`) and its port, fixing the IPv4 header checksum and
/// the transport checksum (updated, or completed when left to offload; SCTP's computed
/// anew), and decrements the TTL / hop limit. The caller checked the TTL, and for SCTP that
/// the packet is not a fragment and its CRC32c verifies ([`sctp_intact`]).
#[inline]
fn nat(frame: &mut Frame<'_>, p: &Parsed, dst_side: bool, addr: &Addr, port: u16, m: Macs) {
    let d = frame.data_mut();
    set_macs(d, m);
    let old_addr = if dst_side { &p.key.dst } else { &p.key.src };
    // The address's share of every checksum that covers it, summed once (at the address's
    // size, so without a loop).
    let addr_change = if p.v6 {
        checksum::change(old_addr.octets(), addr.octets())
    } else {
        checksum::change(&v4_unmapped(old_addr), &v4_unmapped(addr))
    };
    // A later fragment has no transport header: its addresses change, nothing else. The
    // parse checked that any other TCP/UDP packet, a first fragment too, holds the fixed
    // header, checksum included.
    if p.frag != Frag::Later && matches!(p.key.proto, proto::TCP | proto::UDP | proto::SCTP) {
        let seg = &mut d[p.l4..];
        let mut l4 = ports::Packet::new_unchecked(&mut *seg);
        let old_port = if dst_side {
            l4.dst_port()
        } else {
            l4.src_port()
        };
        if dst_side {
            l4.set_dst_port(port);
        } else {
            l4.set_src_port(port);
        }
        // A partial checksum is not a checksum: updating it would carry the old
        // pseudo-header sum along. It is completed once the addresses and ports are final.
        let update = |c: u16| checksum::apply(c, addr_change + checksum::change16(old_port, port));
        match p.key.proto {
            proto::TCP if !p.l4_partial => {
                let mut t = tcp::Packet::new_unchecked(seg);
                t.set_checksum(update(t.checksum()));
            }
            proto::UDP if !p.l4_partial => {
                let mut u = udp::Packet::new_unchecked(seg);
                let c = u.checksum();
                // Zero over IPv4 means "no checksum" and stays.
                if p.v6 || c != 0 {
                    u.set_checksum(checksum::udp_nonzero(update(c)));
                }
            }
            _ => {}
        }
    }
    if p.v6 {
        let mut ip = ipv6::Packet::new_unchecked(&mut d[p.l3..]);
        if dst_side {
            ip.set_dst(addr.0);
        } else {
            ip.set_src(addr.0);
        }
        ip.set_hop_limit(p.ttl - 1);
    } else {
        ipv4::Packet::new_unchecked(&mut d[p.l3..]).translate(dst_side, v4_unmapped(addr));
    }
    if p.key.proto == proto::SCTP {
        sctp_checksum(d, p);
    } else if p.l4_partial {
        complete_l4(d, p);
    }
}

/// nat, client to backend: destination VIP:port becomes backend:port.
#[inline]
pub fn nat_forward(frame: &mut Frame<'_>, p: &Parsed, addr: &Addr, port: u16, m: Macs) {
    nat(frame, p, true, addr, port, m);
}

/// nat, backend to client: source backend:port becomes VIP:port.
#[inline]
pub fn nat_reply(frame: &mut Frame<'_>, p: &Parsed, addr: &Addr, port: u16, m: Macs) {
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
    pub src: Addr,
    /// Outer destination (key form): the backend node.
    pub dst: Addr,
    /// The flow hash.
    pub entropy: u64,
    /// Egress MTU.
    pub mtu: u16,
}

impl Outer {
    /// The outer source address the packet carries: [`Outer::src`] with its low byte (IPv4)
    /// or low 16 bits (IPv6) replaced by the flow's entropy.
    #[inline(always)]
    pub fn source(&self) -> Addr {
        let mut s = self.src;
        if is_v4(&self.dst) {
            s.0[15] = self.entropy as u8;
        } else {
            let e = (self.entropy as u16).to_be_bytes();
            s.0[14] = e[0];
            s.0[15] = e[1];
        }
        s
    }

    /// The outer UDP source port of a GUE packet: the ephemeral range 49152..=65535 (RFC
    /// 6335) from the flow hash, as RFC 8086 asks of GRE-in-UDP, so the outer 5-tuple
    /// carries the flow's entropy.
    #[inline(always)]
    pub fn gue_source_port(&self) -> u16 {
        0xc000 | (self.entropy as u16 & 0x3fff)
    }
}

/// Encapsulates the IP packet of `frame` to `o.dst` from `o.src`, keeping the Ethernet
/// header (and VLAN tag) in front. The outer TOS/traffic class is copied from the inner
/// packet, and for IPv4-in-IPv4 the DF bit too (RFC 2003 section 3.1); the outer TTL is 64.
/// `o.entropy` (the flow hash) varies the outer source's low bits and the GUE source port,
/// so receivers spread flows over their queues by RSS as they would the clients' packets.
///
/// # Errors
/// [`EncapError`] without touching the frame.
#[inline(always)]
pub fn encapsulate(
    frame: &mut Frame<'_>,
    p: &Parsed,
    o: &Outer,
    m: Macs,
) -> Result<(), EncapError> {
    let Outer {
        how,
        dst,
        entropy,
        mtu,
        ..
    } = *o;
    let dst = &dst;
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
    if p.l4_partial {
        // The backend decapsulates the inner packet and checks its checksum: it must be the
        // one the client's device would have written.
        complete_l4(frame.data_mut(), p);
    }
    frame.truncate(p.l3 + p.ip_len); // drop link padding
    let l2 = p.l3;
    frame.push_front(overhead);
    let d = frame.data_mut();
    // The outer frame keeps the inner one's VLAN tag, between the MACs and the EtherType;
    // those are written afresh, so an untagged frame moves nothing. The EtherType is written
    // at its offset, not through a header view: before it is written, the bytes of the
    // headroom it lands in are whatever an earlier use of the buffer left there.
    if l2 > ethernet::HEADER_LEN {
        d.copy_within(overhead + 12..overhead + l2 - 2, 12);
    }
    set_macs(d, m);
    let ethertype = if outer_v6 {
        ethernet::ETHERTYPE_IPV6
    } else {
        ethernet::ETHERTYPE_IPV4
    };
    d[l2 - 2..l2].copy_from_slice(&ethertype.to_be_bytes());
    let inner_proto = if p.v6 { proto::IPV6 } else { proto::IPIP };
    let (next, payload_len) = match how {
        Encap::Ipip => (inner_proto, p.ip_len),
        Encap::Gue { .. } => (proto::UDP, p.ip_len + udp::HEADER_LEN),
    };
    let s = o.source();
    if outer_v6 {
        ipv6::Repr {
            src: s.0,
            dst: dst.0,
            next_header: next.0,
            payload_len: payload_len as u16,
            hop_limit: TTL,
            traffic_class: p.tos,
            flow_label: (entropy >> 16) as u32,
        }
        .emit(&mut ipv6::Packet::new_unchecked(&mut d[l2..]));
    } else {
        let df = p.df && !p.v6;
        ipv4::Repr {
            src: v4_unmapped(&s),
            dst: v4_unmapped(dst),
            protocol: next.0,
            payload_len: payload_len as u16,
            tos: p.tos,
            ident: if df { 0 } else { (entropy >> 24) as u16 },
            dont_fragment: df,
            ttl: TTL,
        }
        .emit(&mut ipv4::Packet::new_unchecked(&mut d[l2..]));
    }
    if let Encap::Gue { port } = how {
        let u = l2 + ip_hdr;
        let mut gue = udp::Packet::new_unchecked(&mut d[u..u + payload_len]);
        udp::Repr {
            src_port: o.gue_source_port(),
            dst_port: port,
            payload_len: p.ip_len as u16,
        }
        .emit(&mut gue);
        if outer_v6 {
            // RFC 6935/6936 allow a zero UDP checksum for tunnels over IPv6 only where both ends
            // opt in; compute it so any receiver accepts the packet.
            let ps =
                checksum::pseudo_header(s.octets(), dst.octets(), proto::UDP.0, payload_len as u32);
            gue.fill_checksum(ps);
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
/// from. A checksum the client left to offload is completed first, so the quote shows the
/// packet as it went on the wire.
#[inline]
pub fn icmp_too_big(
    frame: &mut Frame<'_>,
    p: &Parsed,
    inner_mtu: u16,
    port_mac: ethernet::Address,
) {
    if p.l4_partial {
        complete_l4(frame.data_mut(), p);
    }
    let l2 = p.l3;
    let room = frame.len() + frame.tailroom();
    let d = &mut frame.buf[frame.head..frame.head + room];
    // Back to where it came from, from this port's own MAC (never the frame's destination
    // MAC, which may be broadcast or another host's).
    let mut eth = ethernet::Packet::new_unchecked(&mut *d);
    let client = eth.src();
    eth.set_dst(client);
    eth.set_src(port_mac);
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
    let mut msg = icmp::Packet::new_unchecked(&mut d[ic..ic + icmp_len]);
    if p.v6 {
        let pseudo = checksum::pseudo_header(
            p.key.dst.octets(),
            p.key.src.octets(),
            proto::ICMPV6.0,
            icmp_len as u32,
        );
        icmp::Repr::packet_too_big(inner_mtu as u32).emit(&mut msg, pseudo);
        ipv6::Repr {
            src: p.key.dst.0,
            dst: p.key.src.0,
            next_header: proto::ICMPV6.0,
            payload_len: icmp_len as u16,
            hop_limit: TTL,
            traffic_class: 0,
            flow_label: 0,
        }
        .emit(&mut ipv6::Packet::new_unchecked(&mut d[l2..]));
    } else {
        icmp::Repr::frag_needed(inner_mtu).emit(&mut msg, 0);
        ipv4::Repr {
            src: v4_unmapped(&p.key.dst),
            dst: v4_unmapped(&p.key.src),
            protocol: proto::ICMP.0,
            payload_len: icmp_len as u16,
            tos: 0,
            ident: 0,
            dont_fragment: true,
            ttl: TTL,
        }
        .emit(&mut ipv4::Packet::new_unchecked(&mut d[l2..]));
    }
    frame.len = l2 + ip_hdr + icmp_len;
}

/// nat for an ICMP error about a nat flow, arriving from the client side: the outer
/// destination (the VIP) becomes the backend, and the embedded packet (which left the gateway
/// as VIP:port to client) gets its source back to backend:port, so the backend's stack
/// matches it to its socket. Fixes the embedded IPv4 header checksum, the embedded transport
/// checksum when the quote holds it (as Linux's nf_nat_icmp_reply_translation does), the ICMP
/// checksum and the outer header. An embedded SCTP checksum is left: it covers the whole
/// packet, of which the quote holds a part, and receivers match an SCTP error by its ports
/// and verification tag.
pub fn nat_icmp_error(frame: &mut Frame<'_>, p: &Parsed, addr: &Addr, port: u16, m: Macs) {
    let Some(e) = p.embedded else { return };
    let d = frame.data_mut();
    set_macs(d, m);
    let mut c = icmp::Packet::new_unchecked(&d[p.l4..]).checksum();
    let (old_a, new_a): (&[u8], &[u8]) = if p.v6 {
        (&e.src.0, &addr.0[..])
    } else {
        (&e.src.0[12..], &addr.0[12..])
    };
    // The quoted transport header: at least its first 8 bytes (the parse checked).
    let quote = &mut d[e.l4..e.end];
    // Embedded transport checksum, when quoted: it covers the embedded source address (in
    // its pseudo-header) and port. A zero UDP checksum over IPv4 means none and stays.
    let old_port = ports::Packet::new_unchecked(&*quote).src_port();
    let update = |l4c: u16| update16(update_bytes(l4c, old_a, new_a), old_port, port);
    match e.proto {
        proto::TCP => {
            let mut t = tcp::Packet::new_unchecked(&mut *quote);
            if t.has_checksum() {
                let old = t.checksum();
                let new = update(old);
                c = update16(c, old, new);
                t.set_checksum(new);
            }
        }
        proto::UDP => {
            let mut u = udp::Packet::new_unchecked(&mut *quote);
            let old = u.checksum();
            if p.v6 || old != 0 {
                let new = checksum::udp_nonzero(update(old));
                c = update16(c, old, new);
                u.set_checksum(new);
            }
        }
        _ => {}
    }
    // Embedded source port.
    c = update16(c, old_port, port);
    ports::Packet::new_unchecked(quote).set_src_port(port);
    // Embedded source address (and the embedded IPv4 header checksum, which the ICMP
    // checksum covers too).
    c = update_bytes(c, old_a, new_a);
    if p.v6 {
        ipv6::Packet::new_unchecked(&mut d[e.ip..e.l4]).set_src(addr.0);
    } else {
        let mut ip = ipv4::Packet::new_unchecked(&mut d[e.ip..e.l4]);
        let old_ec = ip.checksum();
        ip.set_src(v4_unmapped(addr));
        c = update16(c, old_ec, ip.checksum());
    }
    if p.v6 {
        // ICMPv6's checksum covers the pseudo-header, so the outer destination change too.
        c = update_bytes(c, p.key.dst.octets(), addr.octets());
        icmp::Packet::new_unchecked(&mut d[p.l4..]).set_checksum(c);
        let mut ip = ipv6::Packet::new_unchecked(&mut d[p.l3..]);
        ip.set_dst(addr.0);
        ip.set_hop_limit(p.ttl - 1);
    } else {
        icmp::Packet::new_unchecked(&mut d[p.l4..]).set_checksum(c);
        let mut ip = ipv4::Packet::new_unchecked(&mut d[p.l3..]);
        ip.set_dst(v4_unmapped(addr));
        ip.decrement_ttl();
    }
}

#[cfg(test)]
mod tests {
    //! Checksums left to offload: every rewrite of a partial frame gives, byte for byte, what
    //! it gives for the same frame with its checksum computed, and that output passes a full
    //! recomputation written here.

    use super::*;
    use crate::key::v4_mapped;
    use crate::wire::parse::parse;
    use etherparse::PacketBuilder;

    const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xc1];
    const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const M: Macs = Macs {
        src: ethernet::Address(GW_MAC),
        dst: ethernet::Address([2, 0, 0, 0, 1, 0x21]),
    };

    /// RFC 1071 one word at a time, folded.
    fn reference(data: &[u8], mut acc: u32) -> u16 {
        for c in data.chunks(2) {
            acc += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    }

    /// The folded pseudo-header sum of an untagged frame's IP packet and the offset of its
    /// TCP/UDP checksum field.
    fn pseudo_and_field(f: &[u8]) -> (u16, usize) {
        let ip = &f[14..];
        let (addrs, proto, hl, len) = if ip[0] >> 4 == 4 {
            let hl = (ip[0] & 0x0f) as usize * 4;
            let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
            (&ip[12..20], ip[9], hl, total - hl)
        } else {
            (
                &ip[8..40],
                ip[6],
                40,
                u16::from_be_bytes([ip[4], ip[5]]) as usize,
            )
        };
        let mut ps = addrs.to_vec();
        ps.extend_from_slice(&[0, proto]);
        ps.extend_from_slice(&(len as u16).to_be_bytes());
        let field = 14 + hl + if proto == 6 { 16 } else { 6 };
        (reference(&ps, 0), field)
    }

    /// The frame as a Linux sender with checksum offload hands it over: the TCP/UDP checksum
    /// field holds the pseudo-header sum, folded, not complemented.
    fn offloaded(f: &[u8]) -> Vec<u8> {
        let (ps, field) = pseudo_and_field(f);
        let mut o = f.to_vec();
        o[field..field + 2].copy_from_slice(&ps.to_be_bytes());
        o
    }

    /// The folded sum of the TCP/UDP segment of the IP packet at `l3` and its pseudo-header:
    /// 0xffff when the checksum verifies, and otherwise how far it is off.
    fn l4_sum(f: &[u8], l3: usize) -> u16 {
        let ip = &f[l3..];
        let (addrs, proto, seg) = if ip[0] >> 4 == 4 {
            let hl = (ip[0] & 0x0f) as usize * 4;
            let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
            (&ip[12..20], ip[9], &ip[hl..total])
        } else {
            let end = 40 + u16::from_be_bytes([ip[4], ip[5]]) as usize;
            (&ip[8..40], ip[6], &ip[40..end])
        };
        let mut ps = addrs.to_vec();
        ps.extend_from_slice(&[0, proto]);
        ps.extend_from_slice(&(seg.len() as u16).to_be_bytes());
        reference(seg, reference(&ps, 0) as u32)
    }

    fn l4_verifies(f: &[u8], l3: usize) -> bool {
        l4_sum(f, l3) == 0xffff
    }

    /// A client frame (TCP SYN with `payload`, or a UDP datagram) to a VIP.
    fn client_frame(v6: bool, udp: bool, payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC);
        let b = if v6 {
            // 2001:db8:2::7 to 2001:db8::10.
            let client = [0x20, 0x01, 0x0d, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
            let vip = [
                0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
            ];
            b.ipv6(client, vip, 64)
        } else {
            b.ipv4([192, 0, 2, 7], [203, 0, 113, 13], 64)
        };
        let mut out = Vec::new();
        if udp {
            b.udp(5000, 53).write(&mut out, payload).unwrap();
        } else {
            b.tcp(40000, 80, 1000, 64240)
                .syn()
                .write(&mut out, payload)
                .unwrap();
        }
        out
    }

    fn backend(v6: bool) -> Addr {
        if v6 {
            Addr([
                0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x21,
            ])
        } else {
            v4_mapped([198, 51, 100, 21])
        }
    }

    /// Runs `rewrite` on a copy of `f` in a buffer with headroom; returns the frame after.
    fn rewritten(f: &[u8], rewrite: &dyn Fn(&mut Frame<'_>, &Parsed)) -> (Parsed, Vec<u8>) {
        let p = parse(f).unwrap().unwrap();
        let mut buf = vec![0u8; HEADROOM + f.len() + 64];
        buf[HEADROOM..HEADROOM + f.len()].copy_from_slice(f);
        let mut frame = Frame::new(&mut buf, HEADROOM, f.len());
        rewrite(&mut frame, &p);
        (p, frame.data().to_vec())
    }

    type Rewrite = Box<dyn Fn(&mut Frame<'_>, &Parsed)>;

    /// Every rewrite that sends a client's segment on, by name, with the offset of the
    /// (inner) IP packet in its output.
    fn rewrites() -> Vec<(&'static str, usize, Rewrite)> {
        let outer = |how, v6: bool| Outer {
            how,
            src: if v6 {
                Addr([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
            } else {
                v4_mapped([192, 0, 2, 1])
            },
            dst: backend(v6),
            entropy: 0x1234_5678_9abc,
            mtu: 1500,
        };
        let encap = |how, v6| -> Rewrite {
            Box::new(move |f: &mut Frame<'_>, p: &Parsed| {
                encapsulate(f, p, &outer(how, v6), M).unwrap();
            })
        };
        vec![
            (
                "dsr_l2",
                14,
                Box::new(|f: &mut Frame<'_>, p: &Parsed| dsr_l2(f, p, M)),
            ),
            (
                "nat_forward",
                14,
                Box::new(|f: &mut Frame<'_>, p: &Parsed| {
                    nat_forward(f, p, &backend(p.v6), 8080, M)
                }),
            ),
            (
                "nat_reply",
                14,
                Box::new(|f: &mut Frame<'_>, p: &Parsed| nat_reply(f, p, &backend(p.v6), 8443, M)),
            ),
            ("ipip_v4", 34, encap(Encap::Ipip, false)),
            ("ipip_v6", 54, encap(Encap::Ipip, true)),
            ("gue_v4", 42, encap(Encap::Gue { port: 6080 }, false)),
            ("gue_v6", 62, encap(Encap::Gue { port: 6080 }, true)),
        ]
    }

    #[test]
    fn every_rewrite_completes_a_checksum_left_to_offload() {
        for v6 in [false, true] {
            for udp in [false, true] {
                for payload in [&b""[..], b"x", b"hello", &[0xa5; 333]] {
                    let valid = client_frame(v6, udp, payload);
                    let partial = offloaded(&valid);
                    assert_ne!(partial, valid, "the builder left a partial checksum");
                    for (name, l3, rewrite) in rewrites() {
                        let ctx = format!("{name} v6={v6} udp={udp} {} bytes", payload.len());
                        let (pv, want) = rewritten(&valid, &*rewrite);
                        let (pp, got) = rewritten(&partial, &*rewrite);
                        assert!(!pv.l4_partial && pp.l4_partial, "{ctx}: detection");
                        assert!(l4_verifies(&want, l3), "{ctx}: valid input, bad output");
                        assert_eq!(got, want, "{ctx}: partial input not completed");
                    }
                }
            }
        }
    }

    #[test]
    fn an_encapsulation_does_not_depend_on_what_the_headroom_held() {
        // UMEM frames are reused: the headroom an outer header lands in holds an earlier
        // frame's bytes, here a VLAN TPID (0x8100) at every even offset.
        for v6 in [false, true] {
            let f = client_frame(v6, false, b"data");
            for (name, _, rewrite) in rewrites().into_iter().skip(3) {
                let (_, clean) = rewritten(&f, &*rewrite);
                let p = parse(&f).unwrap().unwrap();
                let mut buf: Vec<u8> = (0..HEADROOM + f.len() + 64)
                    .map(|i| if i % 2 == 0 { 0x81 } else { 0 })
                    .collect();
                buf[HEADROOM..HEADROOM + f.len()].copy_from_slice(&f);
                let mut frame = Frame::new(&mut buf, HEADROOM, f.len());
                rewrite(&mut frame, &p);
                assert_eq!(frame.data(), &clean[..], "{name} v6={v6}");
            }
        }
    }

    #[test]
    fn the_too_big_answer_quotes_the_completed_packet() {
        for v6 in [false, true] {
            let valid = client_frame(v6, false, &[0x61; 1400]);
            let partial = offloaded(&valid);
            let answer = |f: &mut Frame<'_>, p: &Parsed| icmp_too_big(f, p, 1280, GW_MAC.into());
            let (_, want) = rewritten(&valid, &answer);
            let (_, got) = rewritten(&partial, &answer);
            assert_eq!(got, want, "v6={v6}");
        }
    }

    #[test]
    fn a_checksum_that_is_not_partial_is_updated_not_recomputed() {
        // A TCP checksum that is wrong (and not partial) keeps exactly its error through nat:
        // only a checksum left to offload is computed anew, and nothing else is repaired.
        for v6 in [false, true] {
            let mut f = client_frame(v6, false, b"data");
            let (_, field) = pseudo_and_field(&f);
            f[field] ^= 0x5a;
            let off = l4_sum(&f, 14);
            let (p, out) = rewritten(&f, &|f: &mut Frame<'_>, p: &Parsed| {
                nat_forward(f, p, &backend(p.v6), 8080, M)
            });
            assert!(!p.l4_partial);
            assert_ne!(off, 0xffff);
            assert_eq!(l4_sum(&out, 14), off, "v6={v6}");
        }
    }
}
