//! The DNS query a `dns` health check sends and the header of the answer it reads (RFC
//! 1035 section 4.1): a dozen header bytes and one question are all a check needs, so they
//! are written here rather than pulled in with a resolver crate.
//!
//! An answer is well-formed when it is a response (QR set) to a standard query, carries the
//! query's id and echoes its one question. Its rcode then decides: NOERROR and NXDOMAIN are
//! answers the server stands behind (up); SERVFAIL, REFUSED and the rest say the server
//! cannot answer (down).

use std::fmt;

use strait_config::model::DnsType;

/// Header length (RFC 1035 section 4.1.1).
const HEADER: usize = 12;
/// QR: the message is a response.
const QR: u16 = 0x8000;
/// RD: recursion desired, as a stub resolver asks.
const RD: u16 = 0x0100;
/// The opcode bits (a standard query is 0).
const OPCODE: u16 = 0x7800;
/// The rcode bits.
const RCODE: u16 = 0x000f;
/// Class IN.
const CLASS_IN: u16 = 1;

/// The query for `name` (labels already checked by the configuration) and `qtype`, with
/// id `id`: a header asking for recursion and one question.
pub fn query(id: u16, name: &str, qtype: DnsType) -> Vec<u8> {
    let mut q = Vec::with_capacity(HEADER + name.len() + 6);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&RD.to_be_bytes());
    // QDCOUNT 1, ANCOUNT, NSCOUNT, ARCOUNT 0.
    q.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        // Labels are at most 63 bytes: the configuration refuses longer ones.
        q.push(u8::try_from(label.len()).unwrap_or(63));
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.code().to_be_bytes());
    q.extend_from_slice(&CLASS_IN.to_be_bytes());
    q
}

/// What an answer to a query says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A well-formed answer whose rcode says the server serves: up.
    Answered(Rcode),
    /// A well-formed answer whose rcode says it cannot: down.
    Failed(Rcode),
    /// Not an answer to this query (too short, another id, not a response, another
    /// question): ignored, as a resolver ignores it.
    Foreign,
}

/// A response code (RFC 1035 section 4.1.1, RFC 6895 section 2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rcode(pub u8);

impl fmt::Display for Rcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            0 => "NOERROR",
            1 => "FORMERR",
            2 => "SERVFAIL",
            3 => "NXDOMAIN",
            4 => "NOTIMP",
            5 => "REFUSED",
            _ => "other",
        };
        write!(f, "rcode {} ({name})", self.0)
    }
}

/// Reads `reply` as the answer to `query` (as [`query`] built it).
pub fn verdict(query: &[u8], reply: &[u8]) -> Verdict {
    if reply.len() < HEADER || query.len() < HEADER || reply[..2] != query[..2] {
        return Verdict::Foreign;
    }
    let flags = u16::from_be_bytes([reply[2], reply[3]]);
    if flags & QR == 0 || flags & OPCODE != 0 {
        return Verdict::Foreign;
    }
    let rcode = Rcode((flags & RCODE) as u8);
    // A server echoes the question (RFC 1035 section 4.1.2); one that answers
    // SERVFAIL or REFUSED may leave it out (QDCOUNT 0).
    let qdcount = u16::from_be_bytes([reply[4], reply[5]]);
    let question = &query[HEADER..];
    let echoed = match qdcount {
        0 => rcode.0 != 0 && rcode.0 != 3,
        1 => reply
            .get(HEADER..HEADER + question.len())
            .is_some_and(|q| q.eq_ignore_ascii_case(question)),
        _ => false,
    };
    if !echoed {
        return Verdict::Foreign;
    }
    match rcode.0 {
        0 | 3 => Verdict::Answered(rcode),
        _ => Verdict::Failed(rcode),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dig +noedns health.example.org A` as sent, id 0x1234.
    const QUERY: [u8; 36] = [
        0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 6, b'h', b'e',
        b'a', b'l', b't', b'h', 7, b'e', b'x', b'a', b'm', b'p', b'l', b'e', 3, b'o', b'r', b'g',
        0, 0x00, 0x01, 0x00, 0x01,
    ];

    /// An answer to `q` with `flags` and `qdcount`, the question echoed when 1, and one A
    /// record (compressed name pointer to offset 12) when NOERROR.
    fn answer(q: &[u8], flags: u16, qdcount: u16) -> Vec<u8> {
        let mut a = q[..2].to_vec();
        a.extend_from_slice(&flags.to_be_bytes());
        a.extend_from_slice(&qdcount.to_be_bytes());
        let an: u16 = u16::from(flags & RCODE == 0);
        a.extend_from_slice(&an.to_be_bytes());
        a.extend_from_slice(&[0, 0, 0, 0]);
        if qdcount == 1 {
            a.extend_from_slice(&q[HEADER..]);
        }
        if an == 1 {
            a.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 53]);
        }
        a
    }

    #[test]
    fn query_is_the_wire_form() {
        assert_eq!(query(0x1234, "health.example.org", DnsType::A), QUERY);
        let aaaa = query(7, "a.b", DnsType::Aaaa);
        assert_eq!(&aaaa[HEADER..], &[1, b'a', 1, b'b', 0, 0, 28, 0, 1]);
    }

    #[test]
    fn rcodes_decide() {
        let ok = answer(&QUERY, 0x8180, 1);
        assert_eq!(verdict(&QUERY, &ok), Verdict::Answered(Rcode(0)));
        let nx = answer(&QUERY, 0x8183, 1);
        assert_eq!(verdict(&QUERY, &nx), Verdict::Answered(Rcode(3)));
        let servfail = answer(&QUERY, 0x8182, 1);
        assert_eq!(verdict(&QUERY, &servfail), Verdict::Failed(Rcode(2)));
        let refused = answer(&QUERY, 0x8185, 0);
        assert_eq!(verdict(&QUERY, &refused), Verdict::Failed(Rcode(5)));
        assert_eq!(Rcode(5).to_string(), "rcode 5 (REFUSED)");
    }

    #[test]
    fn foreign_messages_are_ignored() {
        let ok = answer(&QUERY, 0x8180, 1);
        let mut other_id = ok.clone();
        other_id[1] ^= 1;
        assert_eq!(verdict(&QUERY, &other_id), Verdict::Foreign);
        // A query (QR clear) is no answer, nor is a NOTIFY (opcode 4).
        assert_eq!(
            verdict(&QUERY, &answer(&QUERY, 0x0100, 1)),
            Verdict::Foreign
        );
        assert_eq!(
            verdict(&QUERY, &answer(&QUERY, 0xa180, 1)),
            Verdict::Foreign
        );
        // Another question, a NOERROR without one, a truncated header.
        let mut other_q = ok.clone();
        other_q[HEADER + 1] = b'x';
        assert_eq!(verdict(&QUERY, &other_q), Verdict::Foreign);
        assert_eq!(
            verdict(&QUERY, &answer(&QUERY, 0x8180, 0)),
            Verdict::Foreign
        );
        assert_eq!(verdict(&QUERY, &ok[..11]), Verdict::Foreign);
        assert_eq!(verdict(&QUERY, &ok[..HEADER + 5]), Verdict::Foreign);
        // Case of the echoed name does not matter (0x20 randomisation).
        let mut upper = ok;
        upper[HEADER + 1] = b'H';
        assert_eq!(verdict(&QUERY, &upper), Verdict::Answered(Rcode(0)));
    }
}
