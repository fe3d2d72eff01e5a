//! Flow sync with the peer gateways (`[gateway.sync]`): the thread between the workers' sync
//! rings and a UDP socket.
//!
//! ```text
//!   workers' out rings ──► batch (45 IPv4 or 22 IPv6 records a datagram) ──► every peer
//!   every peer ──► check sender, decode ──► owner worker's in ring (nat) / every worker's (DSR)
//!   start: dump request to every peer (repeated until each answers) ──► their workers walk
//!          their tables ──► dump records back to the requesters only, then a dump end
//! ```
//!
//! A starting gateway announces its routes only once every peer's dump has ended, or after
//! [`DUMP_WAIT`] (a peer that is down never answers): the routers send it no flow it has
//! not imported yet, so a restart after a backend change moves no flow to another backend
//! ([`SyncThread::wait_dumps`], called by [`crate::run`] before the VIPs are claimed).
//!
//! The dataplane half (what a record is, when workers emit and how they import) is
//! `strait_dataplane::sync`. This thread never touches a flow table, so it needs no lock
//! with the workers: rings in, rings out.
//!
//! # Wire format
//!
//! One datagram: an 8-byte header, `b"SF"`, version ([`VERSION`]), kind ([`DatagramKind`]), record
//! count (u16, big-endian), form ([`Form`]), a zero byte; then `count` records of that
//! form: 64 bytes (`SyncRecord::to_bytes`), or 32 when client, VIP and backend are all IPv4
//! (the three addresses in 4 bytes each). At most [`MAX_RECORDS`] full or
//! [`MAX_V4_RECORDS`] compact records, so a datagram (at most 1448 bytes) fits an Ethernet
//! MTU over IPv4 or IPv6 without fragments. An IPv4 flow then costs 32 bytes, plus its
//! 1/45th share of the datagram's IP, UDP and sync headers: 33 bytes on the wire. The IPVS
//! sync daemon's default format (version 1, `struct ip_vs_sync_v4` in
//! `include/net/ip_vs.h`) takes 36 bytes for an IPv4 connection before options; its
//! version 0 took 24, without the TCP state's timeout or IPv6. Decoding is defensive: a
//! datagram whose length, magic, version, kind or any record is wrong is dropped whole and
//! counted; datagrams from an address that is not a configured peer are dropped before
//! decoding. There is no authentication beyond the sender's address: put sync on a network
//! only the gateways reach (as with IPVS's sync daemon and loxilb's).
//!
//! # Against the anchors
//!
//! - IPVS's sync daemon (`ip_vs_sync.c`) takes a spinlock on a shared buffer for every
//!   synced packet in softirq context and sends from a kernel thread; it sends on state
//!   changes and every `sync_threshold` packets, and a backup that restarts learns nothing
//!   of the connections already running (no bulk sync). Here the packet path pushes to a
//!   per-core ring (no lock, no atomic read-modify-write), records are sent on creation,
//!   state change and a 17-minute refresh only, and a restarted gateway asks for a dump.
//! - loxilb's conntrack sync copies the eBPF conntrack map to user space periodically and
//!   ships it over gRPC: the walk costs every entry each period, and what changed between two
//!   walks is lost with the node. Here each record leaves within about a millisecond of the
//!   flow's creation ([`POLL`]).
//!
//! What is still lost: records dropped on a full ring or by the network (UDP, no
//! retransmission; a later state change or refresh repairs the copy), the idle time of a
//! flow (an imported entry starts its idle clock at import), and flows created in the last
//! millisecond before a gateway dies.

use std::collections::HashSet;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_client::encoding::DescriptorEncoder;
use strait_config::model::FlowSync;
use strait_dataplane::key::{is_v4, v4_mapped};
use strait_dataplane::pipeline::owner_core;
use strait_dataplane::sync::{flags, RecordKind, SyncRecord, ThreadEnds, RECORD_BYTES};
use tracing::{debug, info, warn};

use crate::cores::CoreSample;
use crate::metrics::counter;

/// Version of the wire format; a datagram of another version is dropped (and counted).
pub const VERSION: u8 = 1;

const MAGIC: [u8; 2] = *b"SF";

/// Header bytes in front of the records.
pub const HEADER: usize = 8;

/// Bytes of a record in the compact IPv4 form: three 4-byte addresses, the rest as in the
/// full form, padded with zeros to 32.
pub const V4_RECORD_BYTES: usize = 32;

/// The UDP payload of a 1500-byte IPv6 packet (IPv4: 1472): no datagram is larger, so none
/// is fragmented.
const PAYLOAD: usize = 1452;

/// Full-form records per datagram: (1452 - 8) / 64 = 22.
pub const MAX_RECORDS: usize = (PAYLOAD - HEADER) / RECORD_BYTES;

/// Compact IPv4 records per datagram: (1452 - 8) / 32 = 45.
pub const MAX_V4_RECORDS: usize = (PAYLOAD - HEADER) / V4_RECORD_BYTES;

/// Largest datagram this thread sends.
pub const MAX_DATAGRAM: usize = HEADER + MAX_V4_RECORDS * V4_RECORD_BYTES;

/// How a datagram's records are written (header byte 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Form {
    /// 64 bytes a record, 16-byte addresses: any record.
    Full = 0,
    /// 32 bytes a record, 4-byte addresses: records whose client, VIP and backend are all
    /// IPv4, which halves the bytes per flow of an IPv4 deployment.
    V4 = 4,
}

impl Form {
    /// The form `r` can travel in, the compact one when it can.
    pub fn of(r: &SyncRecord) -> Form {
        if is_v4(&r.key.src) && is_v4(&r.key.dst) && is_v4(&r.backend) {
            Form::V4
        } else {
            Form::Full
        }
    }

    /// Bytes of one record.
    pub const fn record_bytes(self) -> usize {
        match self {
            Form::Full => RECORD_BYTES,
            Form::V4 => V4_RECORD_BYTES,
        }
    }

    /// Records of a full datagram.
    pub const fn max_records(self) -> usize {
        match self {
            Form::Full => MAX_RECORDS,
            Form::V4 => MAX_V4_RECORDS,
        }
    }
}

/// The compact form of a full record `b` (`SyncRecord::to_bytes`) whose addresses are
/// IPv4-mapped: the last 4 bytes of each address, then bytes 48..64 unchanged.
fn compact(b: &[u8; RECORD_BYTES], out: &mut [u8]) {
    out[0..4].copy_from_slice(&b[12..16]);
    out[4..8].copy_from_slice(&b[28..32]);
    out[8..12].copy_from_slice(&b[44..48]);
    out[12..28].copy_from_slice(&b[48..64]);
    out[28..32].fill(0);
}

/// The full form of compact record `c`; `None` if its padding is not zero.
fn expand(c: &[u8]) -> Option<[u8; RECORD_BYTES]> {
    if c[28..32] != [0; 4] {
        return None;
    }
    let mut b = [0u8; RECORD_BYTES];
    for (i, at) in [0usize, 16, 32].into_iter().enumerate() {
        b[at..at + 16].copy_from_slice(v4_mapped([0; 4]).octets());
        b[at + 12..at + 16].copy_from_slice(&c[i * 4..i * 4 + 4]);
    }
    b[48..64].copy_from_slice(&c[12..28]);
    Some(b)
}

/// How long the thread sleeps when a turn found nothing to do: a record waits at most this
/// long in its ring (plus a turn), and an idle thread wakes 1000 times a second, a few
/// microseconds of CPU each.
pub const POLL: Duration = Duration::from_millis(1);

/// Interval between dump requests to a peer whose answer has not begun to arrive.
pub const DUMP_RETRY: Duration = Duration::from_secs(1);

/// How long a starting gateway waits for its peers' dumps before it announces its routes
/// anyway: two dump requests to a peer that does not answer (down, or not yet started).
pub const DUMP_WAIT: Duration = Duration::from_secs(2);

/// Dump requests sent to a silent peer before giving up (it may simply not be running yet;
/// then it asks us when it starts, and we learn its new flows as they come).
pub const DUMP_TRIES: u32 = 10;

/// What a datagram carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum DatagramKind {
    /// Records (news or dump answers).
    Records = 1,
    /// "Send me every flow you know": sent by a starting gateway. No records.
    DumpRequest = 2,
    /// "That was my whole table": sent to the requesters after the last record of a dump
    /// (also of an empty one). No records.
    DumpEnd = 3,
}

/// Why a datagram was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than a header, or not `count` records long.
    Length,
    /// Not `b"SF"`.
    Magic,
    /// Another version of the format.
    Version(u8),
    /// An unknown kind.
    Kind(u8),
    /// Record `index` does not decode.
    Record(usize),
    /// Header byte 6 names no [`Form`], or byte 7 is not zero.
    Form(u8),
}

/// Writes a datagram of `kind` with `records` in `form` (at most `form.max_records()`, each
/// of that form, see [`Form::of`]) into `buf` (at least [`MAX_DATAGRAM`] bytes); returns its
/// length.
///
/// # Panics
/// If `records` or `buf` exceed those bounds, or a record does not fit `form` (a caller's
/// bug).
pub fn encode(kind: DatagramKind, form: Form, records: &[SyncRecord], buf: &mut [u8]) -> usize {
    assert!(
        records.len() <= form.max_records(),
        "at most {} records",
        form.max_records()
    );
    let size = form.record_bytes();
    let len = HEADER + records.len() * size;
    buf[..2].copy_from_slice(&MAGIC);
    buf[2] = VERSION;
    buf[3] = kind as u8;
    buf[4..6].copy_from_slice(&(records.len() as u16).to_be_bytes());
    buf[6] = form as u8;
    buf[7] = 0;
    for (r, out) in records.iter().zip(buf[HEADER..len].chunks_exact_mut(size)) {
        match form {
            Form::Full => out.copy_from_slice(&r.to_bytes()),
            Form::V4 => {
                assert_eq!(
                    Form::of(r),
                    Form::V4,
                    "an IPv6 record in a compact datagram"
                );
                compact(&r.to_bytes(), out);
            }
        }
    }
    len
}

/// Reads a datagram: its kind, and its records into `out` (cleared first; with a capacity of
/// [`MAX_V4_RECORDS`] this never allocates). Never panics, whatever the bytes.
///
/// # Errors
/// [`DecodeError`]: the datagram is dropped whole (`out` may hold part of it).
pub fn decode(buf: &[u8], out: &mut Vec<SyncRecord>) -> Result<DatagramKind, DecodeError> {
    out.clear();
    let h = buf.get(..HEADER).ok_or(DecodeError::Length)?;
    if h[..2] != MAGIC {
        return Err(DecodeError::Magic);
    }
    if h[2] != VERSION {
        return Err(DecodeError::Version(h[2]));
    }
    let form = match h[6] {
        0 => Form::Full,
        4 => Form::V4,
        f => return Err(DecodeError::Form(f)),
    };
    if h[7] != 0 {
        return Err(DecodeError::Form(h[7]));
    }
    let count = u16::from_be_bytes([h[4], h[5]]) as usize;
    let size = form.record_bytes();
    if count > form.max_records() || buf.len() != HEADER + count * size {
        return Err(DecodeError::Length);
    }
    match h[3] {
        1 => {
            for (i, c) in buf[HEADER..].chunks_exact(size).enumerate() {
                let b = match form {
                    Form::Full => {
                        let mut b = [0u8; RECORD_BYTES];
                        b.copy_from_slice(c);
                        b
                    }
                    Form::V4 => expand(c).ok_or(DecodeError::Record(i))?,
                };
                out.push(SyncRecord::from_bytes(&b).map_err(|_| DecodeError::Record(i))?);
            }
            Ok(DatagramKind::Records)
        }
        2 if count == 0 => Ok(DatagramKind::DumpRequest),
        3 if count == 0 => Ok(DatagramKind::DumpEnd),
        2 | 3 => Err(DecodeError::Length),
        k => Err(DecodeError::Kind(k)),
    }
}

/// The sync thread's counters, read by the admin API.
#[derive(Debug, Default)]
pub struct SyncStats {
    /// Datagrams sent (each to one peer).
    pub datagrams_sent: AtomicU64,
    /// Records sent, counted once per peer.
    pub records_sent: AtomicU64,
    /// Datagrams received from peers.
    pub datagrams_received: AtomicU64,
    /// Records received from peers.
    pub records_received: AtomicU64,
    /// Received records dropped because a worker's in ring was full.
    pub dropped_inbound_full: AtomicU64,
    /// Datagrams dropped: not a configured peer.
    pub dropped_unknown_peer: AtomicU64,
    /// Datagrams dropped: did not decode.
    pub dropped_malformed: AtomicU64,
    /// `sendto` failures (peer unreachable, buffer full): the datagram is lost.
    pub send_errors: AtomicU64,
    /// Dump requests sent.
    pub dump_requests_sent: AtomicU64,
    /// Dump requests received.
    pub dump_requests_received: AtomicU64,
    /// Peers whose dump has ended since this gateway started, and whose records the workers
    /// have all taken from their rings (each peer counted once).
    pub dumps_complete: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The running sync thread.
#[derive(Debug)]
pub struct SyncThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    /// Its counters.
    pub stats: Arc<SyncStats>,
    /// The address it is bound to (useful when `listen` had port 0, as in tests).
    pub local: SocketAddr,
    /// How many peers it has.
    peers: usize,
}

impl SyncThread {
    /// Binds `cfg.listen` and starts the thread over the workers' `ends` (element `c` for the
    /// pipeline of core `c` of `ends.len()`).
    ///
    /// # Errors
    /// When the socket cannot be bound or configured.
    pub fn spawn(
        cfg: &FlowSync,
        ends: Vec<ThreadEnds>,
        stats: Arc<SyncStats>,
    ) -> io::Result<SyncThread> {
        let sock = UdpSocket::bind(cfg.listen)?;
        sock.set_nonblocking(true)?;
        let local = sock.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut state = Sync {
            sock,
            peers: cfg.peers.clone(),
            ends,
            stats: Arc::clone(&stats),
            pending: std::array::from_fn(|_| Vec::with_capacity(MAX_V4_RECORDS)),
            dump_to: HashSet::new(),
            dump_gen: 0,
            heard: vec![false; cfg.peers.len()],
            ended: vec![false; cfg.peers.len()],
            unsettled: 0,
            buf: vec![0; MAX_DATAGRAM],
            rbuf: vec![0; 65536],
            received: Vec::with_capacity(MAX_V4_RECORDS),
        };
        let s = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("flow sync".into())
            .spawn(move || state.run(&s))?;
        info!(%local, peers = ?cfg.peers, "flow sync started");
        Ok(SyncThread {
            stop,
            handle: Some(handle),
            stats,
            local,
            peers: cfg.peers.len(),
        })
    }

    /// Waits until every peer's dump has ended and the workers have taken its records, at
    /// most `timeout`; returns how many peers' dumps are complete.
    pub fn wait_dumps(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.stats.dumps_complete.load(Ordering::Acquire) as usize;
            if n >= self.peers || Instant::now() >= deadline {
                return n.min(self.peers);
            }
            std::thread::sleep(POLL);
        }
    }

    /// How many peers it has.
    pub fn peers(&self) -> usize {
        self.peers
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.stop_in_place();
    }

    fn stop_in_place(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            if h.join().is_err() {
                warn!("the flow sync thread panicked");
            }
        }
    }
}

impl Drop for SyncThread {
    fn drop(&mut self) {
        self.stop_in_place();
    }
}

struct Sync {
    sock: UdpSocket,
    peers: Vec<SocketAddr>,
    ends: Vec<ThreadEnds>,
    stats: Arc<SyncStats>,
    /// Records waiting for a datagram, by [`Sync::batch`]: news (to every peer) and dump
    /// answers (to `dump_to` only), each in full and compact form.
    pending: [Vec<SyncRecord>; 4],
    /// Peers (indices) waiting for the dump being walked.
    dump_to: HashSet<usize>,
    /// Generation of the latest dump asked of the workers.
    dump_gen: u64,
    /// Peers whose dump answer has begun to arrive (so stop asking them). News or a dump
    /// request of theirs does not count: a peer that restarts with us has nothing, one that
    /// sends news may not have seen our request. A peer with an empty table is asked
    /// [`DUMP_TRIES`] times, each an empty walk.
    heard: Vec<bool>,
    /// Peers whose dump has ended (a [`DatagramKind::DumpEnd`] came).
    ended: Vec<bool>,
    /// Of those, how many are not yet in `dumps_complete`: their records may still wait in
    /// the workers' rings.
    unsettled: u64,
    buf: Vec<u8>,
    rbuf: Vec<u8>,
    /// The records of the datagram being delivered.
    received: Vec<SyncRecord>,
}

impl Sync {
    fn run(&mut self, stop: &AtomicBool) {
        let mut asked = 0u32;
        let mut next_ask = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if asked < DUMP_TRIES && Instant::now() >= next_ask && self.heard.contains(&false) {
                asked += 1;
                next_ask = Instant::now() + DUMP_RETRY;
                let n = encode(DatagramKind::DumpRequest, Form::Full, &[], &mut self.buf);
                for (i, &p) in self.peers.iter().enumerate() {
                    if !self.heard[i] {
                        self.send_to(p, n, 0);
                        bump(&self.stats.dump_requests_sent, 1);
                    }
                }
            }
            let received = self.receive();
            let sent = self.drain_workers();
            // A dump counts as complete once the workers took every record delivered so
            // far (the end came after the dump's last record).
            if self.unsettled > 0 && self.ends.iter_mut().all(|e| e.to_worker.is_drained()) {
                self.stats
                    .dumps_complete
                    .fetch_add(self.unsettled, Ordering::Release);
                self.unsettled = 0;
            }
            if received == 0 && sent == 0 {
                std::thread::sleep(POLL);
            }
        }
    }

    fn send_to(&self, to: SocketAddr, len: usize, records: usize) {
        match self.sock.send_to(&self.buf[..len], to) {
            Ok(_) => {
                bump(&self.stats.datagrams_sent, 1);
                bump(&self.stats.records_sent, records as u64);
            }
            Err(e) => {
                bump(&self.stats.send_errors, 1);
                debug!(%to, error = %e, "flow sync datagram not sent");
            }
        }
    }

    /// The batch of `pending` for a record: news or dump answer, in which form.
    fn batch(dump: bool, form: Form) -> usize {
        usize::from(dump) * 2 + usize::from(form == Form::V4)
    }

    /// Sends batch `b` of `pending`: news to every peer, dump answers to the requesters.
    fn flush(&mut self, b: usize) {
        let (dump, form) = (b >= 2, if b % 2 == 1 { Form::V4 } else { Form::Full });
        let records = &self.pending[b];
        if records.is_empty() {
            return;
        }
        let n = encode(DatagramKind::Records, form, records, &mut self.buf);
        let count = records.len();
        for (i, &p) in self.peers.iter().enumerate() {
            if !dump || self.dump_to.contains(&i) {
                self.send_to(p, n, count);
            }
        }
        self.pending[b].clear();
    }

    /// Moves the workers' records into datagrams; returns how many records.
    fn drain_workers(&mut self) -> usize {
        // Seen before draining: a worker's `done` is stored after its last dump record was
        // pushed, so every record of a finished dump is in the rings drained below.
        let dump_over = !self.dump_to.is_empty()
            && self
                .ends
                .iter()
                .all(|e| e.dump.done.load(Ordering::Acquire) >= self.dump_gen);
        let mut n = 0;
        for w in 0..self.ends.len() {
            while let Some(r) = self.ends[w].from_worker.pop() {
                let Ok(r) = r else { continue };
                n += 1;
                let form = Form::of(&r);
                let b = Self::batch(r.flags & flags::DUMP != 0, form);
                self.pending[b].push(r);
                if self.pending[b].len() == form.max_records() {
                    self.flush(b);
                }
            }
        }
        for b in 0..self.pending.len() {
            self.flush(b);
        }
        if dump_over {
            let n = encode(DatagramKind::DumpEnd, Form::Full, &[], &mut self.buf);
            let mut to: Vec<usize> = self.dump_to.drain().collect();
            to.sort_unstable();
            for &i in &to {
                self.send_to(self.peers[i], n, 0);
            }
            info!(peers = ?to.iter().map(|&i| self.peers[i]).collect::<Vec<_>>(), "flow dump sent");
        }
        n
    }

    /// Reads every waiting datagram; returns how many.
    fn receive(&mut self) -> usize {
        let mut n = 0;
        loop {
            let (len, from) = match self.sock.recv_from(&mut self.rbuf) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return n,
                Err(e) => {
                    // ICMP port unreachable from a peer that is down shows up here on Linux.
                    debug!(error = %e, "flow sync receive");
                    return n;
                }
            };
            n += 1;
            // Address and port: an IPv6 sender's flow label or scope id (which the
            // configuration cannot name) does not make it a stranger.
            let Some(peer) = self
                .peers
                .iter()
                .position(|p| p.ip() == from.ip() && p.port() == from.port())
            else {
                bump(&self.stats.dropped_unknown_peer, 1);
                continue;
            };
            match decode(&self.rbuf[..len], &mut self.received) {
                Err(e) => {
                    bump(&self.stats.dropped_malformed, 1);
                    debug!(%from, ?e, "malformed flow sync datagram dropped");
                }
                Ok(DatagramKind::DumpRequest) => {
                    bump(&self.stats.datagrams_received, 1);
                    bump(&self.stats.dump_requests_received, 1);
                    // A request during a walk restarts it, so this requester gets everything.
                    self.dump_gen += 1;
                    self.dump_to.insert(peer);
                    for e in &self.ends {
                        e.dump.requested.store(self.dump_gen, Ordering::Release);
                    }
                    info!(%from, "flow dump requested");
                }
                Ok(DatagramKind::DumpEnd) => {
                    bump(&self.stats.datagrams_received, 1);
                    self.heard[peer] = true;
                    if !self.ended[peer] {
                        self.ended[peer] = true;
                        self.unsettled += 1;
                        info!(%from, "flow dump received");
                    }
                }
                Ok(DatagramKind::Records) => {
                    if self.received.iter().any(|r| r.flags & flags::DUMP != 0) {
                        self.heard[peer] = true;
                    }
                    bump(&self.stats.datagrams_received, 1);
                    bump(&self.stats.records_received, self.received.len() as u64);
                    self.deliver();
                }
            }
        }
    }

    /// Hands records to the workers that import them.
    fn deliver(&mut self) {
        let cores = self.ends.len() as u16;
        let mut full = 0;
        for r in &self.received {
            if r.everywhere() || r.kind == RecordKind::Affinity {
                for e in &mut self.ends {
                    full += u64::from(!e.to_worker.push(r));
                }
            } else {
                let owner = owner_core(&r.key.src, r.key.src_port, cores) as usize;
                if let Some(e) = self.ends.get_mut(owner) {
                    full += u64::from(!e.to_worker.push(r));
                }
            }
        }
        if full > 0 {
            bump(&self.stats.dropped_inbound_full, full);
        }
    }
}

/// Writes the flow sync families: each worker's records by outcome, and the thread's
/// datagrams and records sent, received and dropped by reason. Nothing when sync is off.
pub(crate) fn metrics(
    enc: &mut DescriptorEncoder<'_>,
    samples: &[(String, CoreSample)],
    stats: &Mutex<Option<Arc<SyncStats>>>,
) -> std::fmt::Result {
    let Some(st) = stats.lock().unwrap_or_else(PoisonError::into_inner).clone() else {
        return Ok(());
    };
    let per_worker: Vec<_> = samples
        .iter()
        .flat_map(|(n, s)| {
            let c = &s.sync;
            [
                ("exported", c.exported),
                ("dumped", c.dumped),
                ("export_ring_full", c.export_full),
                ("imported", c.imported),
                ("refreshed", c.refreshed),
                ("conflict", c.conflict),
                ("unknown_service", c.unknown_service),
                ("unknown_backend", c.unknown_backend),
                ("table_full", c.table_full),
                ("malformed", c.malformed),
            ]
            .map(|(o, v)| (vec![("core", n.clone()), ("outcome", o.to_string())], v))
        })
        .collect();
    counter(
        enc,
        "flow_sync_worker_records",
        "Flow sync records per worker and outcome: exported (new flow, state change, refresh), \
         dumped (answering a peer's dump), export_ring_full (dropped), imported, refreshed (key \
         held with the same backend), and dropped on import: conflict (held with another \
         backend), unknown_service, unknown_backend, table_full, malformed.",
        &per_worker,
    )?;
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    counter(
        enc,
        "flow_sync_sent",
        "Flow sync datagrams and records sent (records once per peer), and dump requests.",
        &[
            (
                vec![("what", "datagrams".to_string())],
                get(&st.datagrams_sent),
            ),
            (vec![("what", "records".to_string())], get(&st.records_sent)),
            (
                vec![("what", "dump_requests".to_string())],
                get(&st.dump_requests_sent),
            ),
        ],
    )?;
    counter(
        enc,
        "flow_sync_received",
        "Flow sync datagrams and records received from configured peers, dump requests, and \
         peers whose whole table arrived (dumps_complete).",
        &[
            (
                vec![("what", "datagrams".to_string())],
                get(&st.datagrams_received),
            ),
            (
                vec![("what", "records".to_string())],
                get(&st.records_received),
            ),
            (
                vec![("what", "dump_requests".to_string())],
                get(&st.dump_requests_received),
            ),
            (
                vec![("what", "dumps_complete".to_string())],
                get(&st.dumps_complete),
            ),
        ],
    )?;
    counter(
        enc,
        "flow_sync_dropped",
        "Flow sync losses in the sync thread by reason: inbound_ring_full (records), \
         unknown_peer and malformed (datagrams), send_error (datagrams not sent).",
        &[
            (
                vec![("reason", "inbound_ring_full".to_string())],
                get(&st.dropped_inbound_full),
            ),
            (
                vec![("reason", "unknown_peer".to_string())],
                get(&st.dropped_unknown_peer),
            ),
            (
                vec![("reason", "malformed".to_string())],
                get(&st.dropped_malformed),
            ),
            (
                vec![("reason", "send_error".to_string())],
                get(&st.send_errors),
            ),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use strait_dataplane::sync::{mesh, SYNC_SLOTS};

    #[test]
    fn datagrams_round_trip() {
        let mut buf = vec![0; MAX_DATAGRAM];
        let recs: Vec<_> = (0..MAX_V4_RECORDS as u16).map(SyncRecord::sample).collect();
        let n = encode(DatagramKind::Records, Form::V4, &recs, &mut buf);
        assert_eq!(n, MAX_DATAGRAM);
        assert!(n <= 1452, "fits an IPv6 packet in a 1500-byte MTU");
        let mut out = Vec::with_capacity(MAX_V4_RECORDS);
        assert_eq!(decode(&buf[..n], &mut out), Ok(DatagramKind::Records));
        assert_eq!(out, recs, "the compact form carries every field");
        // The full form, for any record; an IPv6 record needs it.
        let mut v6 = SyncRecord::sample(7);
        v6.key.src = strait_dataplane::key::Addr(
            "2001:db8::7"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        assert_eq!(Form::of(&v6), Form::Full);
        let full: Vec<_> = (0..MAX_RECORDS as u16)
            .map(SyncRecord::sample)
            .chain([v6])
            .skip(1)
            .collect();
        let n = encode(DatagramKind::Records, Form::Full, &full, &mut buf);
        assert!(n <= 1452);
        assert_eq!(decode(&buf[..n], &mut out), Ok(DatagramKind::Records));
        assert_eq!(out, full);
        let n = encode(DatagramKind::DumpRequest, Form::Full, &[], &mut buf);
        assert_eq!(decode(&buf[..n], &mut out), Ok(DatagramKind::DumpRequest));
        assert!(out.is_empty());
    }

    #[test]
    fn malformed_datagrams_are_refused_never_a_panic() {
        let mut buf = vec![0; MAX_DATAGRAM];
        let n = encode(
            DatagramKind::Records,
            Form::V4,
            &[SyncRecord::sample(1), SyncRecord::sample(2)],
            &mut buf,
        );
        let good = buf[..n].to_vec();
        let mut out = Vec::new();
        assert_eq!(decode(&good[..5], &mut out), Err(DecodeError::Length));
        assert_eq!(decode(&good[..n - 1], &mut out), Err(DecodeError::Length));
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(decode(&b, &mut out), Err(DecodeError::Magic));
        let mut b = good.clone();
        b[2] = 9;
        assert_eq!(decode(&b, &mut out), Err(DecodeError::Version(9)));
        let mut b = good.clone();
        b[3] = 7;
        assert_eq!(decode(&b, &mut out), Err(DecodeError::Kind(7)));
        // Record 1's state byte (compact form: byte 19), then its padding.
        let mut b = good.clone();
        b[HEADER + V4_RECORD_BYTES + 19] = 0;
        assert_eq!(decode(&b, &mut out), Err(DecodeError::Record(1)));
        let mut b = good.clone();
        b[HEADER + V4_RECORD_BYTES + 30] = 1;
        assert_eq!(decode(&b, &mut out), Err(DecodeError::Record(1)));
        let mut b = good.clone();
        b[6] = 6;
        assert_eq!(decode(&b, &mut out), Err(DecodeError::Form(6)));
        let mut b = good.clone();
        b[6] = Form::Full as u8;
        assert_eq!(
            decode(&b, &mut out),
            Err(DecodeError::Length),
            "2 x 32 is not 2 x 64"
        );
        let mut b = good.clone();
        b[4..6].copy_from_slice(&u16::MAX.to_be_bytes());
        assert_eq!(decode(&b, &mut out), Err(DecodeError::Length));
        // Every truncation and every single-byte corruption: an answer, never a panic.
        for len in 0..good.len() {
            let _ = decode(&good[..len], &mut out);
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..good.len() {
            let mut b = good.clone();
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            b[i] = seed as u8;
            let _ = decode(&b, &mut out);
        }
    }

    fn wait(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn a_sync_thread_asks_its_peers_for_a_dump_and_refuses_strangers() {
        asks_for_a_dump_and_refuses_strangers("127.0.0.1").0.stop();
    }

    /// The same between IPv6 peers, and an IPv6 flow's record (the full form) arrives.
    #[test]
    fn a_sync_thread_speaks_to_ipv6_peers() {
        if UdpSocket::bind("[::1]:0").is_err() {
            eprintln!("skipped: no IPv6 loopback address (::1) here");
            return;
        }
        let me = asks_for_a_dump_and_refuses_strangers("::1");
        let peer = me.1;
        let mut v6 = SyncRecord::sample(9);
        v6.key.src = strait_dataplane::key::Addr(
            "2001:db8:c::2"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        v6.key.dst = strait_dataplane::key::Addr(
            "2001:db8::10"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        v6.backend = strait_dataplane::key::Addr(
            "2001:db8:b::11"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        let mut out = vec![0; MAX_DATAGRAM];
        let n = encode(DatagramKind::Records, Form::of(&v6), &[v6], &mut out);
        peer.send_to(&out[..n], me.0.local).unwrap();
        wait("the IPv6 record", || {
            me.0.stats.records_received.load(Ordering::Relaxed) == 1
        });
        me.0.stop();
    }

    /// A sync thread on `lo` (an IPv4 or IPv6 loopback address) with one peer: it asks the peer
    /// for a dump, counts the peer's dump end once, refuses a stranger and garbage. Returns
    /// the thread, still running, the peer's socket and the workers' ends.
    fn asks_for_a_dump_and_refuses_strangers(
        lo: &str,
    ) -> (
        SyncThread,
        UdpSocket,
        Vec<strait_dataplane::sync::WorkerSync>,
    ) {
        let any = |port: u16| SocketAddr::new(lo.parse().unwrap(), port);
        let peer = UdpSocket::bind(any(0)).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (workers, ends) = mesh(2, SYNC_SLOTS);
        let me = SyncThread::spawn(
            &FlowSync {
                listen: any(0),
                peers: vec![peer.local_addr().unwrap()],
            },
            ends,
            Arc::default(),
        )
        .unwrap();
        let mut buf = vec![0; 2048];
        let (n, from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!(from, me.local);
        assert_eq!(
            decode(&buf[..n], &mut Vec::new()),
            Ok(DatagramKind::DumpRequest)
        );
        assert_eq!(me.peers(), 1);
        assert_eq!(me.wait_dumps(Duration::ZERO), 0, "no dump has ended yet");
        // The peer's (empty) dump ends: the wait is over, once however often it is said.
        let mut end = vec![0; MAX_DATAGRAM];
        let n = encode(DatagramKind::DumpEnd, Form::Full, &[], &mut end);
        assert_eq!(
            decode(&end[..n], &mut Vec::new()),
            Ok(DatagramKind::DumpEnd)
        );
        peer.send_to(&end[..n], me.local).unwrap();
        peer.send_to(&end[..n], me.local).unwrap();
        assert_eq!(me.wait_dumps(Duration::from_secs(5)), 1);
        wait("both ends", || {
            me.stats.datagrams_received.load(Ordering::Relaxed) == 2
        });
        assert_eq!(me.stats.dumps_complete.load(Ordering::Relaxed), 1);
        // A stranger is refused; garbage from the peer is counted, not fatal.
        let stranger = UdpSocket::bind(any(0)).unwrap();
        let mut out = vec![0; MAX_DATAGRAM];
        let n = encode(
            DatagramKind::Records,
            Form::V4,
            &[SyncRecord::sample(1)],
            &mut out,
        );
        stranger.send_to(&out[..n], me.local).unwrap();
        peer.send_to(b"not a datagram of ours", me.local).unwrap();
        wait("both dropped", || {
            me.stats.dropped_unknown_peer.load(Ordering::Relaxed) == 1
                && me.stats.dropped_malformed.load(Ordering::Relaxed) == 1
        });
        assert_eq!(me.stats.records_received.load(Ordering::Relaxed), 0);
        (me, peer, workers)
    }

    /// What the admin API hands [`metrics`]: the workers' samples and the sync thread's
    /// numbers, while it runs.
    #[derive(Debug, Default)]
    struct View {
        samples: Vec<(String, CoreSample)>,
        sync: Mutex<Option<Arc<SyncStats>>>,
    }

    #[derive(Debug)]
    struct Families(Arc<View>);

    impl prometheus_client::collector::Collector for Families {
        fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
            metrics(&mut enc, &self.0.samples, &self.0.sync)
        }
    }

    #[test]
    fn metrics_name_every_outcome_and_reason_and_are_absent_when_sync_is_off() {
        let mut sample = CoreSample::default();
        sample.sync.imported = 7;
        let shared = Arc::new(View {
            samples: vec![("veth-gw/0".into(), sample)],
            ..Default::default()
        });
        let text = |shared: &Arc<View>| {
            let mut r = prometheus_client::registry::Registry::with_prefix("strait");
            r.register_collector(Box::new(Families(Arc::clone(shared))));
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
            out
        };
        assert!(!text(&shared).contains("flow_sync"), "off: no families");
        let stats = Arc::new(SyncStats::default());
        stats.dropped_malformed.store(3, Ordering::Relaxed);
        *shared.sync.lock().unwrap() = Some(stats);
        let m = text(&shared);
        for line in [
            "strait_flow_sync_worker_records_total{core=\"veth-gw/0\",outcome=\"imported\"} 7",
            "strait_flow_sync_worker_records_total{core=\"veth-gw/0\",outcome=\"export_ring_full\"} 0",
            "strait_flow_sync_sent_total{what=\"records\"} 0",
            "strait_flow_sync_received_total{what=\"dump_requests\"} 0",
            "strait_flow_sync_dropped_total{reason=\"malformed\"} 3",
            "strait_flow_sync_dropped_total{reason=\"inbound_ring_full\"} 0",
        ] {
            assert!(m.contains(line), "{line} missing from\n{m}");
        }
    }
}
