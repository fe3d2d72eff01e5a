//! One pass over a frame: Ethernet (+802.1Q) → IPv4/IPv6 (+extensions) → TCP/UDP/SCTP/ICMP.
//!
//! The result is a `Copy` [`Parsed`] summary holding offsets and the fields the pipeline
//! decides on. Anything not IP is `Ok(None)` (the kernel's business: ARP, LLDP, ...);
//! anything IP that cannot be read safely is `Err(DropReason)`. No input panics; the
//! truncation sweep and the fuzz target hold this to account.
//!
//! Two checksums are looked at here, once, on the headers as they arrived. An IPv4 header
//! whose checksum fails is dropped (`ipv4_header_checksum`) before it can make flow state: a
//! router would drop it too, and its fields (addresses, lengths) cannot be trusted. The
//! header an ICMP error quotes is not checked: it is read only to find a flow, and routers
//! may quote it as they altered it. A TCP/UDP checksum left to offload by a local sender
//! (see [`super::checksum`]) is noted in [`Parsed::l4_partial`], for the rewrite to
//! complete; it must be detected before a rewrite changes the pseudo-header. So is an SCTP
//! CRC32c left to offload (a zero field, [`sctp::is_partial`]); an SCTP checksum is not
//! otherwise verified here: only a nat rewrite, which must recompute it, checks it first
//! (the pipeline does), and DSR leaves it to the backend.
//!
//! Two paths give the same result. `parse_generic` walks any frame through the protocol
//! views, each checking its own lengths. Nearly every packet on the path is the same kind
//! of frame, though: untagged or with one 802.1Q tag, IPv4 without options, not a fragment,
//! TCP or UDP. `parse_fast` reads such a frame in a straight line (one length check, then
//! constant offsets, the summary written field by field) and hands anything else, or
//! anything that fails a check, to `parse_generic`, which then decides as if alone. It
//! exists for its instruction count, the packet path's budget; the proptest in
//! `wire/parse_tests.rs` holds it to the generic path's results, field for field.

use super::{checksum, ethernet, icmp, ip_version, ipv4, ipv6, ports, sctp, tcp, udp, Error};
use crate::key::{proto, v4_mapped, Addr, FlowKey, Proto};
use crate::stats::DropReason;

/// Where a packet stands in fragmentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Frag {
    /// Not a fragment.
    #[default]
    None,
    /// The first fragment: carries the transport header.
    First,
    /// A later fragment: no transport header, no ports.
    Later,
}

/// The header an ICMP error embeds: the start of the packet that caused it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Embedded {
    /// Offset of the embedded IP header in the frame.
    pub ip: usize,
    /// Offset of the embedded transport header in the frame.
    pub l4: usize,
    /// Embedded source address (key form).
    pub src: Addr,
    /// Embedded destination address (key form).
    pub dst: Addr,
    /// Embedded protocol.
    pub proto: Proto,
    /// Embedded source port.
    pub src_port: u16,
    /// Embedded destination port.
    pub dst_port: u16,
    /// End of the quote in the frame (the quote may stop anywhere after 8 transport bytes).
    pub end: usize,
}

/// What the pipeline needs to know about an IP packet.
///
/// `repr(C)`, its fields in an order chosen for the fast path's stores: the bytes it writes
/// as constants for a TCP or a UDP packet (`v6`, `frag`, `icmp_type`, and `tcp_flags` for
/// UDP) lie together, and are written as one word.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Offset of the IP header in the frame.
    pub l3: usize,
    /// Offset of the upper-layer header in the frame.
    pub l4: usize,
    /// IP total length (header, extensions and payload); bytes past it are link padding.
    pub ip_len: usize,
    /// The 5-tuple in the packet's own direction: addresses in key form (IPv4-mapped for
    /// IPv4), the upper-layer protocol, and the transport ports (0 when none). Kept as the
    /// flow key itself so that hashing and looking up a packet's flow read it in place.
    pub key: FlowKey,
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// Fragment position.
    pub frag: Frag,
    /// ICMP type (ICMP and ICMPv6 only).
    pub icmp_type: u8,
    /// TCP flags; for SCTP, the flags its first chunk stands for ([`sctp::flow_flags`]: INIT
    /// as SYN, ABORT as RST, the shutdowns as FIN, others as ACK), so that the flow table
    /// follows an association as it follows a connection; 0 for other protocols.
    pub tcp_flags: u8,
    /// TTL or hop limit.
    pub ttl: u8,
    /// TOS or traffic class.
    pub tos: u8,
    /// IPv4 DF bit (always true for IPv6, which routers never fragment).
    pub df: bool,
    /// The TCP/UDP checksum field holds only the pseudo-header sum, as a sender that left the
    /// checksum to its device's offload wrote it (for SCTP: the CRC32c field holds zero):
    /// whoever sends the packet on completes it. Only for unfragmented TCP, UDP and SCTP (a
    /// fragment's segment is not all here, and Linux completes checksums before it
    /// fragments).
    pub l4_partial: bool,
    /// For ICMP errors: the embedded packet.
    pub embedded: Option<Embedded>,
}

impl Embedded {
    /// The 5-tuple of the flow the embedded packet belongs to, in the embedded packet's
    /// direction.
    #[inline(always)]
    pub fn key(&self) -> FlowKey {
        FlowKey {
            src: self.src,
            dst: self.dst,
            src_port: self.src_port,
            dst_port: self.dst_port,
            proto: self.proto,
        }
    }

    /// The same flow seen from the other side (swap source and destination).
    #[inline(always)]
    pub fn reversed_key(&self) -> FlowKey {
        FlowKey {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
            proto: self.proto,
        }
    }
}

/// Parses a frame.
///
/// # Errors
/// The [`DropReason`] for an IP packet that cannot be parsed safely.
#[inline]
pub fn parse(frame: &[u8]) -> Result<Option<Parsed>, DropReason> {
    let mut p = Parsed::default();
    Ok(parse_into(frame, &mut p)?.then_some(p))
}

/// What an IP frame's headers claim, read without [`parse`]'s checks: source and
/// destination addresses (key form) and, when the transport header follows the IP header
/// directly (IPv4 options allowed, no IPv6 extension headers, not a later fragment) and has
/// four bytes, its first two 16-bit fields (the ports of TCP, UDP and SCTP). For looking
/// at frames off the packet path: a dropped frame's addresses (a bad header checksum, a
/// truncated transport header), a sent frame's destination. `None` without a readable IP
/// header.
pub fn claimed(frame: &[u8]) -> Option<Claimed> {
    let eth = ethernet::Packet::new_checked(frame).ok()?;
    let l3 = frame.get(eth.header_len()..)?;
    let (src, dst, l4) = match eth.payload_ethertype() {
        ethernet::ETHERTYPE_IPV4 => {
            let ip = ipv4::Packet::new_checked(l3).ok()?;
            let first = !ip.is_fragment() || ip.frag_offset() == 0;
            let l4 = first.then(|| l3.get(ip.header_len()..)).flatten();
            (v4_mapped(ip.src()), v4_mapped(ip.dst()), l4)
        }
        ethernet::ETHERTYPE_IPV6 => {
            let ip = ipv6::Packet::new_checked(l3).ok()?;
            let direct = matches!(
                Proto(ip.next_header()),
                proto::TCP | proto::UDP | proto::SCTP
            );
            let l4 = direct.then(|| l3.get(ipv6::HEADER_LEN..)).flatten();
            (Addr(ip.src()), Addr(ip.dst()), l4)
        }
        _ => return None,
    };
    let ports = l4
        .and_then(|l4| ports::Packet::new_checked(l4).ok())
        .map(|l4| (l4.src_port(), l4.dst_port()));
    Some(Claimed { src, dst, ports })
}

/// What [`claimed`] reads of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claimed {
    /// Source address (key form).
    pub src: Addr,
    /// Destination address (key form).
    pub dst: Addr,
    /// Source and destination ports, when the transport header could be read.
    pub ports: Option<(u16, u16)>,
}

/// [`parse`] into a caller's [`Parsed`], which is overwritten: `Ok(true)` for an IP packet,
/// whose summary `p` then holds, `Ok(false)` for anything not IP (`p` is then meaningless).
///
/// For the packet path, which keeps a batch's results in place: a [`Parsed`] is about 150
/// bytes, and building it on the stack to move it afterwards costs a fast packet a visible
/// share of its time.
///
/// # Errors
/// As [`parse`]; `p` is then meaningless.
#[inline]
pub fn parse_into(frame: &[u8], p: &mut Parsed) -> Result<bool, DropReason> {
    if parse_fast(frame, p) {
        return Ok(true);
    }
    parse_generic(frame, p)
}

/// The bytes [`parse_fast`] reads: an Ethernet header, an IPv4 header without options and
/// a TCP header without options (a UDP header is shorter).
const FAST_LEN: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN + tcp::HEADER_LEN;

/// The common frame in a straight line: untagged or with one 802.1Q tag, IPv4 without
/// options, not a fragment, TCP or UDP whose header fits, a header checksum that verifies.
/// `true` when the frame is such and `p` holds what [`parse_generic`] would have written;
/// `false` otherwise (`p` is then meaningless, and [`parse_generic`] decides). Every read is
/// at a constant offset of one array of [`FAST_LEN`] bytes, so it needs one length check
/// (a shorter frame, a UDP datagram of fewer than 12 payload bytes without link padding,
/// goes the generic way), and `p` is written field by field rather than reset whole: its
/// ICMP quote alone is larger than what is written.
#[inline(always)]
pub(crate) fn parse_fast(frame: &[u8], p: &mut Parsed) -> bool {
    const TAGGED: usize = ethernet::HEADER_LEN + ethernet::VLAN_TAG_LEN;
    let Some(h) = frame.first_chunk::<FAST_LEN>() else {
        return false;
    };
    let eth = ethernet::Packet::new_unchecked(&h[..]);
    if eth.ethertype_is(ethernet::ETHERTYPE_IPV4) {
        return fast_ipv4(h, frame.len(), ethernet::HEADER_LEN, p);
    }
    unlikely();
    if !eth.ethertype_is(ethernet::ETHERTYPE_VLAN) {
        return false;
    }
    // From the tag on, the bytes lie as in an untagged frame: the inner EtherType where an
    // untagged frame has its own, then the IP header.
    let at = ethernet::VLAN_TAG_LEN;
    match frame[at..].first_chunk::<FAST_LEN>() {
        Some(h)
            if ethernet::Packet::new_unchecked(&h[..]).ethertype_is(ethernet::ETHERTYPE_IPV4) =>
        {
            fast_ipv4(h, frame.len() - at, TAGGED, p)
        }
        _ => false,
    }
}

/// Marks the path that calls it as the rare one, for the compiler's layout and the order of
/// its tests (the `cold_path` of hashbrown's `util.rs`; `core::hint::cold_path` is newer
/// than the crate's minimum Rust).
#[inline(always)]
#[cold]
fn unlikely() {}

/// [`parse_fast`] after the EtherType: `h` is the frame from `l3 - 14` on, `len` the bytes
/// from there to the frame's end, `l3` the IP header's offset in the frame.
#[inline(always)]
fn fast_ipv4(h: &[u8; FAST_LEN], len: usize, l3: usize, p: &mut Parsed) -> bool {
    const L3: usize = ethernet::HEADER_LEN;
    const L4: usize = L3 + ipv4::HEADER_LEN;
    let ip = ipv4::Packet::new_unchecked(&h[L3..L4]);
    if ip.version() != 4
        || ip.header_len() != ipv4::HEADER_LEN
        || !ip.verify_checksum()
        || ip.is_fragment()
    {
        return false;
    }
    let total = ip.total_len();
    if len < L3 + total as usize {
        return false;
    }
    // `p` is written as the fields are read, which keeps few of them in registers at once:
    // if a later check fails, `parse_generic` writes `p` whole.
    let (src, dst) = (ip.src(), ip.dst());
    p.l3 = l3;
    p.l4 = l3 + ipv4::HEADER_LEN;
    p.ip_len = total as usize;
    p.key.src = v4_mapped(src);
    p.key.dst = v4_mapped(dst);
    p.v6 = false;
    p.frag = Frag::None;
    p.icmp_type = 0;
    p.ttl = ip.ttl();
    p.tos = ip.tos();
    p.df = ip.dont_fragment();
    p.embedded = None;
    // What follows the IP header within its total length; negative for a total length
    // shorter than the header, which then holds no transport header either.
    let room = total as isize - ipv4::HEADER_LEN as isize;
    match Proto(ip.protocol()) {
        proto::UDP => {
            let u = udp::Packet::new_unchecked(&h[L4..L4 + udp::HEADER_LEN]);
            let ul = u.len() as usize;
            if ul < udp::HEADER_LEN || ul as isize > room {
                return false;
            }
            p.key.proto = proto::UDP;
            (p.key.src_port, p.key.dst_port) = u.ports().pair();
            p.tcp_flags = 0;
            p.l4_partial = partial_v4(src, dst, proto::UDP, total, u.checksum());
            true
        }
        proto::TCP => {
            let t = tcp::Packet::new_unchecked(&h[L4..L4 + tcp::HEADER_LEN]);
            let hl = t.header_len();
            if hl < tcp::HEADER_LEN || hl as isize > room {
                return false;
            }
            p.key.proto = proto::TCP;
            (p.key.src_port, p.key.dst_port) = t.ports().pair();
            p.tcp_flags = t.flags();
            p.l4_partial = partial_v4(src, dst, proto::TCP, total, t.checksum());
            true
        }
        _ => false,
    }
}

/// [`partial`] for an unfragmented IPv4 segment whose IP header has no options (`total` is
/// its IP total length), summed in the machine's byte order as the header checksum is
/// ([`ipv4::Packet::verify_checksum`]): a 16-bit word read in the machine's order is
/// congruent to `k` times the word read big-endian, modulo 0xffff (`k` = 256 on a
/// little-endian machine, 1 on a big-endian one: swapping a word's bytes multiplies it by
/// 2^8, since 2^16 is 1 modulo 0xffff), and so is any sum of such words. `k` is invertible
/// modulo 0xffff, which is odd, so the field is congruent to its pseudo-header sum exactly
/// when both, in the machine's order, are; and a field is zero in either order alike. The
/// addresses are then summed as they are loaded, and `total` and the field without a swap.
#[inline(always)]
fn partial_v4(src: [u8; 4], dst: [u8; 4], proto: Proto, total: u16, csum: u16) -> bool {
    // `x.to_be()` of a big-endian value is the value read in the machine's order.
    let ne = |w: u16| w.to_be() as u64;
    // The segment is `total - 20` bytes long: k * -20 is added as 0xffff - k * 20.
    let pseudo = u32::from_ne_bytes(src) as u64
        + u32::from_ne_bytes(dst) as u64
        + ne(proto.0 as u16)
        + ne(total)
        + (0xffff - ne(ipv4::HEADER_LEN as u16));
    checksum::is_partial(ne(csum) as u16, pseudo)
}

/// [`parse_into`] for every frame: the definition [`parse_fast`] is held to. Out of line,
/// so that where [`parse_into`] is inlined (the pipeline's staging loop) the fast path
/// keeps the registers. For a frame of at least [`FAST_LEN`] bytes it writes `p` whole
/// before it returns, which lets [`parse_fast`] write `p` before its last checks.
#[inline(never)]
pub(crate) fn parse_generic(frame: &[u8], p: &mut Parsed) -> Result<bool, DropReason> {
    let eth = ethernet::Packet::new_checked(frame).map_err(|_| DropReason::EthTruncated)?;
    let l3 = eth.header_len();
    *p = Parsed {
        l3,
        ..Parsed::default()
    };
    match eth.payload_ethertype() {
        ethernet::ETHERTYPE_IPV4 => {
            let ip = ipv4::Packet::new_checked(&frame[l3..]).map_err(ip_reason)?;
            if !ip.verify_checksum() {
                return Err(DropReason::Ipv4HeaderChecksum);
            }
            p.ip_len = ip.total_len() as usize;
            p.key.src = v4_mapped(ip.src());
            p.key.dst = v4_mapped(ip.dst());
            p.key.proto = Proto(ip.protocol());
            p.l4 = l3 + ip.header_len();
            p.ttl = ip.ttl();
            p.tos = ip.tos();
            p.df = ip.dont_fragment();
            p.frag = match (ip.is_fragment(), ip.frag_offset()) {
                (false, _) => Frag::None,
                (true, 0) => Frag::First,
                (true, _) => Frag::Later,
            };
        }
        ethernet::ETHERTYPE_IPV6 => {
            let ip = ipv6::Packet::new_checked(&frame[l3..]).map_err(ip_reason)?;
            let up = ip.upper().map_err(|_| DropReason::Ipv6ExtensionHeaders)?;
            p.v6 = true;
            p.ip_len = ip.total_len();
            p.key.src = Addr(ip.src());
            p.key.dst = Addr(ip.dst());
            p.key.proto = Proto(up.protocol);
            p.l4 = l3 + up.offset;
            p.ttl = ip.hop_limit();
            p.tos = ip.traffic_class();
            p.df = true;
            p.frag = match up.fragment {
                None => Frag::None,
                Some(f) if f.offset == 0 => Frag::First,
                Some(_) => Frag::Later,
            };
        }
        _ => return Ok(false),
    }
    if p.frag == Frag::Later {
        return Ok(true);
    }
    let l4 = &frame[p.l4..p.l3 + p.ip_len];
    match p.key.proto {
        proto::TCP => {
            // A first fragment must hold the fixed TCP header (ports, flags, checksum); its
            // options may continue in the next fragment. Tinier first fragments are the
            // overlapping-fragment attack of RFC 1858 and could not be nat-ed correctly.
            let t = if p.frag == Frag::First {
                if l4.len() < tcp::HEADER_LEN {
                    return Err(DropReason::L4Truncated);
                }
                let h = tcp::Packet::new_unchecked(l4);
                (h.src_port(), h.dst_port(), h.flags())
            } else {
                let h = tcp::Packet::new_checked(l4).map_err(|_| DropReason::L4Truncated)?;
                p.l4_partial = partial(p, l4.len(), h.checksum());
                (h.src_port(), h.dst_port(), h.flags())
            };
            (p.key.src_port, p.key.dst_port, p.tcp_flags) = t;
        }
        proto::UDP => {
            if p.frag == Frag::First {
                if l4.len() < udp::HEADER_LEN {
                    return Err(DropReason::L4Truncated);
                }
                let h = udp::Packet::new_unchecked(l4);
                (p.key.src_port, p.key.dst_port) = (h.src_port(), h.dst_port());
            } else {
                let h = udp::Packet::new_checked(l4).map_err(|_| DropReason::L4Truncated)?;
                p.l4_partial = partial(p, l4.len(), h.checksum());
                (p.key.src_port, p.key.dst_port) = (h.src_port(), h.dst_port());
            }
        }
        proto::SCTP => {
            // The common header, also in a first fragment: ports, tag and checksum.
            let h = sctp::Packet::new_checked(l4).map_err(|_| DropReason::L4Truncated)?;
            (p.key.src_port, p.key.dst_port) = (h.src_port(), h.dst_port());
            p.tcp_flags = sctp::flow_flags(h.first_chunk());
            p.l4_partial = p.frag == Frag::None && sctp::is_partial(l4);
        }
        proto::ICMP | proto::ICMPV6 if p.frag == Frag::None => {
            let h = icmp::Packet::new_checked(l4).map_err(|_| DropReason::L4Truncated)?;
            p.icmp_type = h.msg_type();
            let is_error = if p.v6 {
                icmp::is_error_v6(p.icmp_type)
            } else {
                icmp::is_error_v4(p.icmp_type)
            };
            if is_error && (p.key.proto == proto::ICMPV6) == p.v6 {
                p.embedded = embedded(frame, p.l4 + icmp::HEADER_LEN, p.l3 + p.ip_len)?;
            }
        }
        _ => {}
    }
    Ok(true)
}

/// Reads the packet an ICMP error embeds, starting at `at` and ending at `end`. It must hold
/// the IP header and the first 8 bytes of its transport header (RFC 792 guarantees that much;
/// RFC 1812 and RFC 4443 include more; for SCTP, ports and verification tag). `Ok(None)` for
/// an embedded protocol other than TCP, UDP or SCTP: no service flow can be behind it (errors about the box's own pings, say), so it is
/// the kernel's.
fn embedded(frame: &[u8], at: usize, end: usize) -> Result<Option<Embedded>, DropReason> {
    let b = &frame[at..end];
    let mut e = Embedded {
        ip: at,
        ..Embedded::default()
    };
    // The quote is cut anywhere, so its header gets an unchecked view once its fixed part
    // is known to be there: the total length it states runs past the quote.
    let hl = match b.first().map(|&v| ip_version(v)) {
        Some(4) if b.len() >= ipv4::HEADER_LEN => {
            let ip = ipv4::Packet::new_unchecked(b);
            let hl = ip.header_len();
            if hl < ipv4::HEADER_LEN {
                return Err(DropReason::IcmpEmbeddedTruncated);
            }
            e.src = v4_mapped(ip.src());
            e.dst = v4_mapped(ip.dst());
            e.proto = Proto(ip.protocol());
            hl
        }
        Some(6) if b.len() >= ipv6::HEADER_LEN => {
            let ip = ipv6::Packet::new_unchecked(b);
            e.src = Addr(ip.src());
            e.dst = Addr(ip.dst());
            e.proto = Proto(ip.next_header());
            ipv6::HEADER_LEN
        }
        _ => return Err(DropReason::IcmpEmbeddedTruncated),
    };
    if !matches!(e.proto, proto::TCP | proto::UDP | proto::SCTP) {
        return Ok(None);
    }
    if b.len() < hl + 8 {
        return Err(DropReason::IcmpEmbeddedTruncated);
    }
    e.l4 = at + hl;
    e.end = end;
    let l4 = ports::Packet::new_unchecked(&b[hl..]);
    e.src_port = l4.src_port();
    e.dst_port = l4.dst_port();
    Ok(Some(e))
}

/// Whether `csum`, the checksum field of an unfragmented segment of `len` bytes (the whole
/// IP payload, as the sender's device would sum it), holds only its pseudo-header sum. The
/// addresses are `p`'s, as they arrived.
#[inline(always)]
fn partial(p: &Parsed, len: usize, csum: u16) -> bool {
    let len = len as u32;
    // One call per family, so that each sums addresses of a size known here.
    let pseudo = if p.v6 {
        checksum::pseudo_header(p.key.src.octets(), p.key.dst.octets(), p.key.proto.0, len)
    } else {
        checksum::pseudo_header(&p.key.src.0[12..], &p.key.dst.0[12..], p.key.proto.0, len)
    };
    checksum::is_partial(csum, pseudo)
}

fn ip_reason(e: Error) -> DropReason {
    match e {
        Error::Truncated => DropReason::IpTruncated,
        Error::Malformed => DropReason::IpMalformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    const MACS: ([u8; 6], [u8; 6]) = ([2, 0, 0, 0, 0, 0xc1], [2, 0, 0, 0, 0, 1]);
    const C6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
    const VIP6: [u8; 16] = [
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
    ];

    fn frame(v6: bool, udp: bool) -> Vec<u8> {
        let b = PacketBuilder::ethernet2(MACS.0, MACS.1);
        let b = if v6 {
            b.ipv6(C6, VIP6, 64)
        } else {
            b.ipv4([192, 0, 2, 7], [203, 0, 113, 10], 64)
        };
        let mut out = Vec::new();
        if udp {
            b.udp(5000, 53).write(&mut out, b"query").unwrap();
        } else {
            b.tcp(40000, 80, 1, 64240)
                .syn()
                .write(&mut out, b"")
                .unwrap();
        }
        out
    }

    /// Offset of the TCP/UDP checksum in an untagged frame, and the folded pseudo-header
    /// sum, computed here by hand.
    fn field_and_pseudo(f: &[u8], v6: bool, udp: bool) -> (usize, u16) {
        let (l4, addrs) = if v6 {
            (54, &f[22..54])
        } else {
            (34, &f[26..34])
        };
        let len = f.len() - l4;
        let mut acc: u32 = if udp { 17 } else { 6 };
        acc += len as u32;
        for c in addrs.chunks(2) {
            acc += u16::from_be_bytes([c[0], c[1]]) as u32;
        }
        while acc >> 16 != 0 {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        (l4 + if udp { 6 } else { 16 }, acc as u16)
    }

    #[test]
    fn a_bad_ipv4_header_checksum_is_dropped() {
        let mut f = frame(false, false);
        assert!(parse(&f).unwrap().is_some());
        f[24] ^= 0x01;
        assert_eq!(parse(&f), Err(DropReason::Ipv4HeaderChecksum));
        // A header that does not fit is still reported as such, not as a checksum.
        assert_eq!(parse(&f[..30]), Err(DropReason::IpTruncated));
    }

    #[test]
    fn an_icmp_errors_quoted_header_is_not_checked() {
        let mut quoted = frame(false, false)[14..42].to_vec();
        quoted[10] ^= 0xff; // the quoted header's checksum
        let mut f = Vec::new();
        PacketBuilder::ethernet2(MACS.0, MACS.1)
            .ipv4([192, 0, 2, 254], [192, 0, 2, 7], 64)
            .icmpv4_raw(3, 4, [0, 0, 5, 0])
            .write(&mut f, &quoted)
            .unwrap();
        let p = parse(&f).unwrap().unwrap();
        let e = p.embedded.expect("the quote is read");
        assert_eq!((e.src_port, e.dst_port), (40000, 80));
    }

    #[test]
    fn a_checksum_left_to_offload_is_detected() {
        for v6 in [false, true] {
            for udp in [false, true] {
                let mut f = frame(v6, udp);
                let p = parse(&f).unwrap().unwrap();
                assert!(!p.l4_partial, "v6={v6} udp={udp}: a valid checksum");
                let (at, ps) = field_and_pseudo(&f, v6, udp);
                f[at..at + 2].copy_from_slice(&ps.to_be_bytes());
                let p = parse(&f).unwrap().unwrap();
                assert!(p.l4_partial, "v6={v6} udp={udp}: the pseudo-header sum");
                f[at + 1] ^= 1;
                let p = parse(&f).unwrap().unwrap();
                assert!(
                    !p.l4_partial,
                    "v6={v6} udp={udp}: some other wrong checksum"
                );
            }
        }
    }

    #[test]
    fn no_checksum_and_fragments_are_never_partial() {
        let mut f = frame(false, true);
        f[40..42].copy_from_slice(&[0, 0]);
        assert!(!parse(&f).unwrap().unwrap().l4_partial);
        // A first fragment whose field would read as partial for the bytes it holds.
        let mut f = frame(false, false);
        let (at, ps) = field_and_pseudo(&f, false, false);
        f[at..at + 2].copy_from_slice(&ps.to_be_bytes());
        f[20] |= 0x20; // MF
        f[24..26].copy_from_slice(&[0, 0]);
        let c = checksum::checksum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        let p = parse(&f).unwrap().unwrap();
        assert_eq!(p.frag, Frag::First);
        assert!(!p.l4_partial);
    }
}
