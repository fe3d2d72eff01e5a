//! Passive health: failed connection attempts per backend, as one core saw them in nat mode.
//!
//! In nat mode every reply comes back through the gateway, so the pipeline sees a backend
//! refuse a new connection (it answers the SYN with a RST, or an SCTP INIT with an ABORT) or
//! leave it unanswered (the client sends its SYN again while the backend has sent nothing on
//! the connection). Each is counted here, per backend id and per [`Failure`], in this core's
//! own memory: a plain add on a cold branch, no lock, no atomic, no allocation. The worker
//! publishes the counts with its sample; the control side sums them over the cores and
//! decides (`strait_control::passive`).
//!
//! DSR modes send replies straight from the backend to the client: the gateway sees no
//! answer and counts nothing; their backends have active checks only.

use crate::key::BackendId;

/// Why a connection attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The backend answered the client's SYN (SCTP INIT) with a RST (ABORT): nothing listens.
    Refused = 0,
    /// The client sent its SYN again while the backend had sent nothing on the connection.
    Unanswered = 1,
}

impl Failure {
    /// Both, in index order.
    pub const ALL: [Failure; 2] = [Failure::Refused, Failure::Unanswered];

    /// The cause's name in `strait status` and `/metrics`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Failure::Refused => "refused",
            Failure::Unanswered => "unanswered",
        }
    }
}

/// Backend ids with counters of their own; larger ids share slots (as many as for new
/// flows, `pipeline::NEW_FLOW_SLOTS`). The zeroed allocation is touched only for ids in
/// use, so an idle slot costs address space, not memory.
pub const SLOTS: usize = 1 << 16;

/// Least time between a SYN and the client's next SYN on the same entry for the second one
/// to count as a retransmission of an unanswered SYN: 200 ms, Linux's `TCP_RTO_MIN`. No
/// client retransmits sooner (Linux waits 1 s the first time, RFC 6298's initial RTO), so a
/// repeat within it is a duplicate, not a timeout.
pub const SYN_RETRANSMIT_MIN_MS: u64 = 200;

/// One core's failed connection attempts per backend id.
#[derive(Debug)]
pub struct Passive {
    /// `[refused, unanswered]` per backend id slot; counts only grow.
    counts: Box<[[u64; 2]]>,
    /// The sum of every count: a change says there is something to publish.
    total: u64,
}

impl Default for Passive {
    fn default() -> Self {
        Self {
            counts: vec![[0; 2]; SLOTS].into_boxed_slice(),
            total: 0,
        }
    }
}

impl Passive {
    /// Counts one failed attempt on backend `id`. Called from the pipeline's cold branches
    /// only.
    #[cold]
    #[inline(never)]
    pub fn count(&mut self, id: BackendId, why: Failure) {
        self.counts[id.0 as usize % SLOTS][why as usize] += 1;
        self.total += 1;
    }

    /// Every failure counted so far: the worker publishes when it changed.
    #[inline(always)]
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The counts of backend `id`: `[refused, unanswered]`.
    pub fn of(&self, id: BackendId) -> [u64; 2] {
        self.counts[id.0 as usize % SLOTS]
    }

    /// Copies the counts of the first `backends` ids into `out` (cleared first). After the
    /// first copy `out` has its size and nothing allocates unless the table grows.
    pub fn export(&self, backends: usize, out: &mut Vec<[u64; 2]>) {
        out.clear();
        out.extend_from_slice(&self.counts[..backends.min(self.counts.len())]);
    }
}
