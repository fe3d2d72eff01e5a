//! Frames for the parse and checksum tests, built with etherparse (an independent encoder,
//! so that a test's frame does not come from the code under test).

use etherparse::TcpHeader;

/// Sets `h`'s flags from `flags`, the TCP header's byte 13 as the dataplane reads it
/// (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10, URG 0x20, ECE 0x40, CWR 0x80).
pub fn set_tcp_flags(h: &mut TcpHeader, flags: u8) {
    h.fin = flags & 0x01 != 0;
    h.syn = flags & 0x02 != 0;
    h.rst = flags & 0x04 != 0;
    h.psh = flags & 0x08 != 0;
    h.ack = flags & 0x10 != 0;
    h.urg = flags & 0x20 != 0;
    h.ece = flags & 0x40 != 0;
    h.cwr = flags & 0x80 != 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_bit_lands_in_its_field() {
        for bit in 0..8 {
            let mut h = TcpHeader::new(1, 2, 3, 4);
            set_tcp_flags(&mut h, 1 << bit);
            let set = [h.fin, h.syn, h.rst, h.psh, h.ack, h.urg, h.ece, h.cwr];
            for (i, f) in set.iter().enumerate() {
                assert_eq!(*f, i == bit, "bit {bit}, field {i}");
            }
        }
    }
}
