//! One pass over a frame: Ethernet (+802.1Q) → IPv4/IPv6 (+extensions) → TCP/UDP/ICMP.
//!
//! The result is a `Copy` [`Parsed`] summary holding offsets and the fields the pipeline
//! decides on. Anything not IP is `Ok(None)` (the kernel's business: ARP, LLDP, ...);
//! anything IP that cannot be read safely is `Err(DropReason)`. No input panics; the
//! truncation sweep and the fuzz target hold this to account.

use super::{be16, ethernet, icmp, ipv4, ipv6, tcp, udp, Error};
use crate::key::{proto, v4_mapped, FlowKey};
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
    pub src: [u8; 16],
    /// Embedded destination address (key form).
    pub dst: [u8; 16],
    /// Embedded protocol.
    pub proto: u8,
    /// Embedded source port.
    pub src_port: u16,
    /// Embedded destination port.
    pub dst_port: u16,
    /// End of the quote in the frame (the quote may stop anywhere after 8 transport bytes).
    pub end: usize,
}

/// What the pipeline needs to know about an IP packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Offset of the IP header in the frame.
    pub l3: usize,
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// IP total length (header, extensions and payload); bytes past it are link padding.
    pub ip_len: usize,
    /// Source address (key form: IPv4-mapped for IPv4).
    pub src: [u8; 16],
    /// Destination address (key form).
    pub dst: [u8; 16],
    /// Upper-layer protocol.
    pub proto: u8,
    /// Offset of the upper-layer header in the frame.
    pub l4: usize,
    /// TTL or hop limit.
    pub ttl: u8,
    /// TOS or traffic class.
    pub tos: u8,
    /// IPv4 DF bit (always true for IPv6, which routers never fragment).
    pub df: bool,
    /// Fragment position.
    pub frag: Frag,
    /// Transport source port (0 when none).
    pub src_port: u16,
    /// Transport destination port (0 when none).
    pub dst_port: u16,
    /// TCP flags (0 for other protocols).
    pub tcp_flags: u8,
    /// ICMP type (ICMP and ICMPv6 only).
    pub icmp_type: u8,
    /// For ICMP errors: the embedded packet.
    pub embedded: Option<Embedded>,
}

impl Parsed {
    /// The 5-tuple in the packet's own direction.
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
    let eth = ethernet::Packet::new_checked(frame).map_err(|_| DropReason::EthTruncated)?;
    let l3 = eth.header_len();
    *p = Parsed {
        l3,
        ..Parsed::default()
    };
    match eth.payload_ethertype() {
        ethernet::ETHERTYPE_IPV4 => {
            let ip = ipv4::Packet::new_checked(&frame[l3..]).map_err(ip_reason)?;
            p.ip_len = ip.total_len() as usize;
            p.src = v4_mapped(ip.src());
            p.dst = v4_mapped(ip.dst());
            p.proto = ip.protocol();
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
            p.src = ip.src();
            p.dst = ip.dst();
            p.proto = up.protocol;
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
    match p.proto {
        proto::TCP => {
            // A first fragment must hold the fixed TCP header (ports, flags, checksum); its
            // options may continue in the next fragment. Tinier first fragments are the
            // overlapping-fragment attack of RFC 1858 and could not be nat-ed correctly.
            let t = if p.frag == Frag::First {
                if l4.len() < tcp::HEADER_LEN {
                    return Err(DropReason::L4Truncated);
                }
                (be16(l4, 0), be16(l4, 2), l4[13])
            } else {
                let h = tcp::Packet::new_checked(l4).map_err(|_| DropReason::L4Truncated)?;
                (h.src_port(), h.dst_port(), h.flags())
            };
            (p.src_port, p.dst_port, p.tcp_flags) = t;
        }
        proto::UDP => {
            if p.frag == Frag::First {
                if l4.len() < udp::HEADER_LEN {
                    return Err(DropReason::L4Truncated);
                }
                (p.src_port, p.dst_port) = (be16(l4, 0), be16(l4, 2));
            } else {
                let h = udp::Packet::new_checked(l4).map_err(|_| DropReason::L4Truncated)?;
                (p.src_port, p.dst_port) = (h.src_port(), h.dst_port());
            }
        }
        proto::ICMP | proto::ICMPV6 if p.frag == Frag::None => {
            let h = icmp::Packet::new_checked(l4).map_err(|_| DropReason::L4Truncated)?;
            p.icmp_type = h.msg_type();
            let is_error = if p.v6 {
                icmp::is_error_v6(p.icmp_type)
            } else {
                icmp::is_error_v4(p.icmp_type)
            };
            if is_error && (p.proto == proto::ICMPV6) == p.v6 {
                p.embedded = embedded(frame, p.l4 + icmp::HEADER_LEN, p.l3 + p.ip_len)?;
            }
        }
        _ => {}
    }
    Ok(true)
}

/// Reads the packet an ICMP error embeds, starting at `at` and ending at `end`. It must hold
/// the IP header and the first 8 bytes of its transport header (RFC 792 guarantees that much;
/// RFC 1812 and RFC 4443 include more). `Ok(None)` for an embedded protocol other than TCP
/// or UDP: no service flow can be behind it (errors about the box's own pings, say), so it is
/// the kernel's.
fn embedded(frame: &[u8], at: usize, end: usize) -> Result<Option<Embedded>, DropReason> {
    let b = &frame[at..end];
    let mut e = Embedded {
        ip: at,
        ..Embedded::default()
    };
    let hl = match b.first().map(|v| v >> 4) {
        Some(4) if b.len() >= ipv4::HEADER_LEN => {
            let hl = ((b[0] & 0x0f) as usize) * 4;
            if hl < ipv4::HEADER_LEN {
                return Err(DropReason::IcmpEmbeddedTruncated);
            }
            let mut a = [0; 4];
            a.copy_from_slice(&b[12..16]);
            e.src = v4_mapped(a);
            a.copy_from_slice(&b[16..20]);
            e.dst = v4_mapped(a);
            e.proto = b[9];
            hl
        }
        Some(6) if b.len() >= ipv6::HEADER_LEN => {
            e.src.copy_from_slice(&b[8..24]);
            e.dst.copy_from_slice(&b[24..40]);
            e.proto = b[6];
            ipv6::HEADER_LEN
        }
        _ => return Err(DropReason::IcmpEmbeddedTruncated),
    };
    if !matches!(e.proto, proto::TCP | proto::UDP) {
        return Ok(None);
    }
    if b.len() < hl + 8 {
        return Err(DropReason::IcmpEmbeddedTruncated);
    }
    e.l4 = at + hl;
    e.end = end;
    e.src_port = be16(b, hl);
    e.dst_port = be16(b, hl + 2);
    Ok(Some(e))
}

fn ip_reason(e: Error) -> DropReason {
    match e {
        Error::Truncated => DropReason::IpTruncated,
        Error::Malformed => DropReason::IpMalformed,
    }
}
