//! The harness behind Strait's fuzz targets: the oracles each target checks, kept out of the
//! `fuzz_targets/*.rs` stubs so they read as one document.
//!
//! ```text
//! bytes ──► parse   ──► offsets in range, padding-invariant, never panics
//! bytes ──► decode  ──► (knobs, clock, frames) ──► Pipeline::process, frame by frame
//!                                                  │ counters balanced after each
//!                                                  │ Pass / Handoff: frame unchanged
//!                                                  ▼ Tx: checksums still valid
//!                                             reflect the Tx output (a reply) and
//!                                             run it too, when the knob says so
//! ```
//!
//! The `pipeline` input format, which `tests/tests/checksum_props.rs` (`gen_fuzz_seeds`) also
//! writes, is:
//!
//! | bytes | meaning |
//! |---|---|
//! | 0 | knobs, see [`Knobs::from_byte`] |
//! | 1 | bit 7: ingress port; bits 0..7: clock step before each frame, `v³ × 4 ms` |
//! | 2.. | up to [`MAX_FRAMES`] frames: a big-endian `u16` length, then the bytes |
//!
//! A last frame shorter than its length takes what is left.

#![forbid(unsafe_code)]

use std::sync::OnceLock;

use strait_dataplane::pipeline::{Pipeline, Verdict};
use strait_dataplane::rewrite::{Frame, HEADROOM};
use strait_dataplane::table::ServiceTable;
use strait_dataplane::wire::parse::{parse, Frag, Parsed};

/// The configuration every pipeline run uses: all modes, both families, affinity, source
/// ranges, a backend without a MAC, a service without backends.
pub const ALL_MODES: &str = include_str!("../all_modes.toml");

/// Frames per pipeline input. Eight is enough to open a flow, use it, close it, and let it
/// expire; more only slows each run down.
pub const MAX_FRAMES: usize = 8;

/// Port MTUs a run may pick: the usual, jumbo, the IPv6 minimum and the configurable
/// minimum. Small MTUs send encapsulated packets down the ICMP "too big" path.
pub const MTUS: [u16; 4] = [1500, 9000, 1280, 576];

/// Headroom when the knob asks for too little: less than the smallest encapsulation (20),
/// so the pipeline must refuse rather than write in front of the buffer.
const SHORT_HEADROOM: usize = 16;

/// Tailroom a UMEM frame has behind a packet (2 KiB chunk, as the test driver gives).
const TAILROOM: usize = 2048;

/// One second on the pipeline's clock.
const SEC: u64 = 1_000_000_000;

/// What the first input byte selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// Index into [`MTUS`] (bits 0..2).
    pub mtu: usize,
    /// No room behind the packet (bit 2): ICMP answers must fit in the frame as it is.
    pub no_tailroom: bool,
    /// Too little room in front (bit 3): encapsulation must fail cleanly.
    pub short_headroom: bool,
    /// Four cores, this one core 0 (bit 4): nat flows owned elsewhere are handed off.
    pub four_cores: bool,
    /// After each Tx, also run the output with source and destination swapped (bit 5): a
    /// backend's reply to a nat flow, which must come back translated.
    pub reflect: bool,
    /// A one-bucket flow table (bit 6): inserts fail `Full`.
    pub tiny_table: bool,
    /// One new flow per second (bit 7): inserts fail `RateLimited`.
    pub rate_limited: bool,
}

impl Knobs {
    /// Decodes the knob byte.
    pub fn from_byte(b: u8) -> Self {
        Self {
            mtu: (b & 0b11) as usize,
            no_tailroom: b & 0x04 != 0,
            short_headroom: b & 0x08 != 0,
            four_cores: b & 0x10 != 0,
            reflect: b & 0x20 != 0,
            tiny_table: b & 0x40 != 0,
            rate_limited: b & 0x80 != 0,
        }
    }
}

/// The snapshot for a port MTU, built once per process.
pub fn table(mtu: usize) -> &'static ServiceTable {
    static TABLES: [OnceLock<ServiceTable>; MTUS.len()] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    // The seeds' tags are drawn from every VLAN (checksum_props writes them).
    TABLES[mtu].get_or_init(|| {
        strait_tests::table(&strait_tests::serving_every_vlan(ALL_MODES), MTUS[mtu])
    })
}

/// The `parse` target: never panics, and a successful parse describes the frame it was
/// given.
///
/// # Panics
/// When an oracle fails: that is the finding.
pub fn check_parse(data: &[u8]) {
    let r = parse(data);
    let Ok(parsed) = r else { return };
    // Bytes after the frame are link padding (or the next frame in a buffer): an IP packet
    // parses the same with or without them.
    let mut padded = data.to_vec();
    padded.extend_from_slice(&[0xa5; 9]);
    assert_eq!(parse(&padded), r, "trailing bytes changed the parse");
    let Some(p) = parsed else { return };
    check_offsets(&p, data.len());
    let end = p.l3 + p.ip_len;
    assert_eq!(
        parse(&data[..end]),
        r,
        "cutting the link padding changed the parse"
    );
}

/// Every offset in `p` lies inside a frame of `len` bytes, and inside the IP packet.
fn check_offsets(p: &Parsed, len: usize) {
    assert!(
        p.l3 == 14 || p.l3 == 18,
        "l3 {} is not after Ethernet",
        p.l3
    );
    let end = p.l3 + p.ip_len;
    assert!(
        end <= len,
        "ip packet {}+{} past frame {len}",
        p.l3,
        p.ip_len
    );
    let ip_hdr = if p.v6 { 40 } else { 20 };
    assert!(
        p.l3 + ip_hdr <= p.l4 && p.l4 <= end,
        "l4 {} outside {}..={end}",
        p.l4,
        p.l3 + ip_hdr
    );
    let need = match (p.key.proto.0, p.frag) {
        (_, Frag::Later) => 0,
        (6, Frag::None) => 20,
        (6, Frag::First) => 14,
        (17, _) => 8,
        // SCTP's common header (ports, tag, checksum), also in a first fragment.
        (132, _) => 12,
        (1 | 58, Frag::None) => 8,
        _ => 0,
    };
    assert!(p.l4 + need <= end, "l4 header {}+{need} past {end}", p.l4);
    if p.frag == Frag::Later || !matches!(p.key.proto.0, 6 | 17 | 132) {
        assert_eq!(
            (p.key.src_port, p.key.dst_port),
            (0, 0),
            "ports without a header"
        );
    }
    // SCTP's first chunk stands for TCP-like flags (INIT a SYN, ABORT a RST, ...).
    if !matches!(p.key.proto.0, 6 | 132) || p.frag == Frag::Later {
        assert_eq!(p.tcp_flags, 0, "tcp flags outside tcp and sctp");
    }
    if let Some(e) = p.embedded {
        assert!(matches!(p.key.proto.0, 1 | 58) && p.frag == Frag::None);
        assert_eq!(
            e.ip,
            p.l4 + 8,
            "embedded header right after the icmp header"
        );
        assert!(
            e.l4 >= e.ip + 20,
            "embedded l4 {} inside its ip header",
            e.l4
        );
        assert!(
            e.l4 + 8 <= e.end && e.end <= end,
            "embedded l4 {}+8, quote end {}, packet end {end}",
            e.l4,
            e.end
        );
    }
}

/// Splits the frame list of a `pipeline` input.
#[derive(Debug)]
pub struct Frames<'a>(&'a [u8]);

impl<'a> Iterator for Frames<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.0.len() < 2 {
            return None;
        }
        let n = u16::from_be_bytes([self.0[0], self.0[1]]) as usize;
        let rest = &self.0[2..];
        let (f, rest) = rest.split_at(n.min(rest.len()));
        self.0 = rest;
        Some(f)
    }
}

/// The `pipeline` target.
///
/// # Panics
/// When an oracle fails: that is the finding.
pub fn run_pipeline(data: &[u8]) {
    let [knobs, clock, frames @ ..] = data else {
        return;
    };
    let k = Knobs::from_byte(*knobs);
    let ingress = clock >> 7;
    let v = (clock & 0x7f) as u64;
    let step = v * v * v * 4_000_000;
    let t = table(k.mtu);
    let mut pipe = Pipeline::new(
        0,
        if k.four_cores { 4 } else { 1 },
        if k.tiny_table { 8 } else { 1024 },
        t.timeouts,
        if k.rate_limited { 1 } else { 0 },
    );
    let mut now = SEC;
    for frame in Frames(frames).take(MAX_FRAMES) {
        now += step;
        let out = run_one(&mut pipe, t, &k, now, ingress, frame);
        if let (true, Some(out)) = (k.reflect, out) {
            if let Some(reply) = reflect(&out) {
                now += step;
                let _ = run_one(&mut pipe, t, &k, now, ingress ^ 1, &reply);
            }
        }
    }
}

/// Runs one frame and checks the oracles; returns the output of a Tx.
fn run_one(
    pipe: &mut Pipeline,
    t: &ServiceTable,
    k: &Knobs,
    now: u64,
    ingress: u8,
    frame: &[u8],
) -> Option<Vec<u8>> {
    let head = if k.short_headroom {
        SHORT_HEADROOM
    } else {
        HEADROOM
    };
    let tail = if k.no_tailroom { 0 } else { TAILROOM };
    let mut buf = vec![0u8; head + frame.len() + tail];
    buf[head..head + frame.len()].copy_from_slice(frame);
    let rx = pipe.counters.rx;
    let mut f = Frame::new(&mut buf, head, frame.len());
    let v = pipe.process(t, now, ingress, &mut f);
    assert_eq!(pipe.counters.rx, rx + 1);
    assert!(
        pipe.counters.balanced(),
        "counters unbalanced after {v:?}: {:?}",
        pipe.counters
    );
    match v {
        Verdict::Pass | Verdict::Handoff { .. } => {
            assert_eq!(f.data(), frame, "{v:?} changed the frame");
            if let Verdict::Handoff { core } = v {
                assert!(k.four_cores && (1..4).contains(&core), "handoff to {core}");
            }
            None
        }
        Verdict::Drop(_) => None,
        Verdict::Tx { port } => {
            assert!((port as usize) < t.ports.len(), "tx to port {port}");
            if strait_tests::verify(frame).is_ok() {
                if let Err(e) = strait_tests::verify(f.data()) {
                    panic!(
                        "{e} after {v:?} (knobs {k:?})\n  in:  {}\n  out: {}",
                        hex(frame),
                        hex(f.data())
                    );
                }
            }
            Some(f.data().to_vec())
        }
    }
}

/// The frame as its receiver would answer it: MACs, addresses and ports swapped. Swapping
/// keeps every checksum valid (the Internet checksum is a sum, and the pseudo-header holds
/// both addresses), so a valid output gives a valid reply.
pub fn reflect(frame: &[u8]) -> Option<Vec<u8>> {
    let p = parse(frame).ok()??;
    let mut r = frame.to_vec();
    swap(&mut r, 0, 6, 6);
    let (a, n) = if p.v6 { (p.l3 + 8, 16) } else { (p.l3 + 12, 4) };
    swap(&mut r, a, a + n, n);
    if matches!(p.key.proto.0, 6 | 17) && p.frag != Frag::Later {
        swap(&mut r, p.l4, p.l4 + 2, 2);
    }
    Some(r)
}

fn swap(b: &mut [u8], x: usize, y: usize, n: usize) {
    for i in 0..n {
        b.swap(x + i, y + i);
    }
}

/// Lower-case hex, for failure messages that can be pasted into a test.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Arbitrary text as a configuration file (the operator's input): parsing and validation
/// must not panic; a refusal lists at least one problem, and each names its field by TOML
/// path, or, for a syntax error the parser could not place in a table, its line; a
/// configuration that passes can be summarised (what `strait check` prints).
///
/// # Panics
/// When an oracle fails: that is the finding.
pub fn check_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match strait_config::parse(text) {
        Ok(cfg) => {
            let summary = strait_config::summary(&cfg);
            assert!(!summary.is_empty(), "a valid configuration with no summary");
        }
        Err(e) => {
            let problems = e.problems();
            assert!(!problems.is_empty(), "refused without a problem: {e}");
            for p in problems {
                assert!(!p.message.is_empty(), "a problem without a message: {p:?}");
                assert!(
                    !p.path.is_empty() || p.message.contains("(line "),
                    "a problem that names neither a field nor a line: {p:?}"
                );
            }
        }
    }
}
