//! The flow table against a `HashMap` model, under a fake clock, and a check that the table
//! does not allocate after construction (the testkit's counting allocator).

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use strait_dataplane::flow::*;
use strait_dataplane::hash::SEED_FLOW;
use strait_dataplane::key::*;

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// Short timeouts so that random clock steps cross them often.
fn timeouts() -> Timeouts {
    Timeouts {
        tcp_syn: 3 * S,
        tcp_established: 50 * S,
        tcp_closing: S,
        udp: 5 * S,
        other: 8 * S,
    }
}

/// The model's own liveness rule, written from the documented contract rather than the
/// table's code: idle time, in whole milliseconds since the last touch, strictly below the
/// override (seconds, kept by entries in state `Other` only) or the state's timeout.
fn model_live(v: &FlowValue, now: u64) -> bool {
    let to = timeouts();
    let over = if v.state == FlowState::Other {
        v.timeout_override()
    } else {
        0
    };
    let timeout = if over != 0 {
        u64::from(over) * S
    } else {
        match v.state {
            FlowState::TcpSyn => to.tcp_syn,
            FlowState::TcpEstablished => to.tcp_established,
            FlowState::TcpClosing => to.tcp_closing,
            FlowState::Udp => to.udp,
            FlowState::Other => to.other,
        }
    };
    (now / MS).saturating_sub(v.last_seen_ms()) * MS < timeout
}

/// Key `i` of a small key space mixing IPv4 and IPv6, TCP and UDP.
fn key(i: u8) -> FlowKey {
    let (src, dst) = if i.is_multiple_of(2) {
        (v4_mapped([203, 0, 113, i]), v4_mapped([192, 0, 2, 10]))
    } else {
        let mut s = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        s[15] = i;
        let mut d = s;
        d[5] = 1;
        d[15] = 10;
        (Addr(s), Addr(d))
    };
    let proto = if i % 4 < 2 { proto::TCP } else { proto::UDP };
    FlowKey {
        src,
        dst,
        src_port: 30000 + u16::from(i),
        dst_port: 443,
        proto,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Insert {
        k: u8,
        backend: u32,
        state: FlowState,
        timeout_override: u32,
        incarnation: u32,
    },
    Lookup {
        k: u8,
    },
    /// Lookup, then update the entry in place as the pipeline does.
    Touch {
        k: u8,
        flags: u8,
    },
    Remove {
        k: u8,
    },
    Advance {
        dt: u64,
    },
    Sweep {
        buckets: usize,
    },
}

fn state() -> impl Strategy<Value = FlowState> {
    prop_oneof![
        Just(FlowState::TcpSyn),
        Just(FlowState::TcpEstablished),
        Just(FlowState::TcpClosing),
        Just(FlowState::Udp),
        Just(FlowState::Other),
    ]
}

fn op(keys: u8) -> impl Strategy<Value = Op> {
    let k = 0..keys;
    prop_oneof![
        4 => (
            k.clone(),
            0..8u32,
            state(),
            prop_oneof![3 => Just(0u32), 1 => 1..20u32],
            any::<u32>(),
        )
            .prop_map(|(k, backend, state, timeout_override, incarnation)| Op::Insert {
                k, backend, state, timeout_override, incarnation
            }),
        4 => k.clone().prop_map(|k| Op::Lookup { k }),
        2 => (k.clone(), any::<u8>()).prop_map(|(k, flags)| Op::Touch { k, flags }),
        1 => k.prop_map(|k| Op::Remove { k }),
        3 => prop_oneof![
            4 => 0..2 * S,
            2 => 0..12 * S,
            1 => 0..60 * S,
        ].prop_map(|dt| Op::Advance { dt }),
        1 => (0..8usize).prop_map(|buckets| Op::Sweep { buckets }),
    ]
}

fn value(
    backend: u32,
    state: FlowState,
    timeout_override: u32,
    incarnation: u32,
    now: u64,
) -> FlowValue {
    let mut v = FlowValue::new(BackendId(backend), incarnation, state, now);
    if state == FlowState::Other {
        v.set_timeout_override(timeout_override);
    } else {
        v.set_peer_mac([2, 0, 0, 0, (incarnation >> 8) as u8, incarnation as u8].into());
    }
    v
}

/// What the pipeline does to a hit: restart its idle timer and advance its TCP state.
fn apply_touch(v: &mut FlowValue, flags: u8, now: u64) {
    v.touch(now);
    v.state = v.state.on_tcp_flags(flags);
}

fn check_accounting(t: &FlowTable) -> Result<(), TestCaseError> {
    let s = t.stats();
    let held: Vec<FlowKey> = t.iter().map(|(k, _)| *k).collect();
    prop_assert_eq!(held.len(), t.len(), "len counts exactly the entries held");
    prop_assert_eq!(
        held.iter().collect::<HashSet<_>>().len(),
        held.len(),
        "no key held twice"
    );
    prop_assert!(t.len() <= t.capacity());
    prop_assert_eq!(s.occupancy, t.len() as u64);
    prop_assert_eq!(s.inserts - s.expired - s.evicted - s.removed, s.occupancy);
    Ok(())
}

/// The entries per backend (kept where ways fill and empty) are what a walk counts: for each
/// id, the entries of the incarnation its slot counts, which is the newest held.
fn check_per_backend(t: &FlowTable) -> Result<(), TestCaseError> {
    let slots = t.entries_by_backend();
    for id in 0..8u32 {
        let h = slots[id as usize];
        let walked = t
            .iter()
            .filter(|(_, v)| v.backend.0 == id && v.incarnation == h.incarnation)
            .count();
        prop_assert_eq!(h.entries as usize, walked, "backend {}", id);
        let newest = t
            .iter()
            .filter(|(_, v)| v.backend.0 == id)
            .map(|(_, v)| v.incarnation)
            .max();
        prop_assert!(newest.is_none_or(|n| n <= h.incarnation), "backend {}", id);
    }
    prop_assert!(slots[8..].iter().all(|h| h.entries == 0));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Room for every key (64 keys, 1024 ways) and no rate limit: the table must behave
    /// exactly like a map with idle timeouts.
    #[test]
    fn agrees_with_hashmap_model(ops in proptest::collection::vec(op(64), 1..300)) {
        let mut t = FlowTable::new(1024, timeouts(), 0);
        let mut model: HashMap<FlowKey, FlowValue> = HashMap::new();
        let mut now = 1_000 * S;
        for op in ops {
            match op {
                Op::Insert { k, backend, state, timeout_override, incarnation } => {
                    let v = value(backend, state, timeout_override, incarnation, now);
                    let got = t.insert(key(k), v, now).map(|e| *e);
                    prop_assert_eq!(got, Ok(v));
                    model.insert(key(k), v);
                }
                Op::Lookup { k } => {
                    let want = model.get(&key(k)).copied().filter(|v| model_live(v, now));
                    prop_assert_eq!(t.lookup(&key(k), now).copied(), want);
                }
                Op::Touch { k, flags } => {
                    let kk = key(k);
                    let want = model.get_mut(&kk).filter(|v| model_live(v, now));
                    match (t.lookup_hashed(&kk, kk.hash(SEED_FLOW), now), want) {
                        (Some(got), Some(want)) => {
                            prop_assert_eq!(*got, *want);
                            apply_touch(got, flags, now);
                            apply_touch(want, flags, now);
                        }
                        (None, None) => {}
                        (got, want) => {
                            prop_assert!(false, "touch {k}: table {got:?}, model {want:?}")
                        }
                    }
                }
                Op::Remove { k } => {
                    let got = t.remove(&key(k));
                    match model.remove(&key(k)) {
                        Some(v) if model_live(&v, now) => prop_assert_eq!(got, Some(v)),
                        // Expired: the table may or may not have reclaimed it already.
                        Some(v) => prop_assert!(got.is_none() || got == Some(v)),
                        None => prop_assert_eq!(got, None),
                    }
                }
                Op::Advance { dt } => now += dt,
                Op::Sweep { buckets } => {
                    let before = t.len();
                    let removed = t.sweep(now, buckets);
                    prop_assert!(removed <= buckets * WAYS);
                    prop_assert_eq!(t.len(), before - removed);
                }
            }
            // The live contents match the model's exactly.
            let table_live: HashMap<FlowKey, FlowValue> =
                t.iter().filter(|(_, v)| t.is_live(v, now)).map(|(k, v)| (*k, *v)).collect();
            let model_live_set: HashMap<FlowKey, FlowValue> =
                model.iter().filter(|(_, v)| model_live(v, now)).map(|(k, v)| (*k, *v)).collect();
            prop_assert_eq!(table_live, model_live_set);
            check_accounting(&t)?;
        }
        prop_assert_eq!(t.stats().full, 0);
        prop_assert_eq!(t.stats().rate_limited, 0);
    }

    /// A 16-way table (two buckets) for 64 keys, with or without a rate limit: it evicts and
    /// refuses, but never holds more than its capacity and never returns a stale or foreign
    /// value.
    #[test]
    fn small_table_never_lies(
        ops in proptest::collection::vec(op(64), 1..400),
        rate in prop_oneof![Just(0u32), Just(5), Just(50)],
    ) {
        let mut t = FlowTable::new(16, timeouts(), rate);
        prop_assert_eq!(t.capacity(), 16);
        // The last value stored for each key the table may still hold.
        let mut last: HashMap<FlowKey, FlowValue> = HashMap::new();
        let mut now = 0;
        for op in ops {
            match op {
                Op::Insert { k, backend, state, timeout_override, incarnation } => {
                    let v = value(backend, state, timeout_override, incarnation, now);
                    match t.insert(key(k), v, now) {
                        Ok(got) => {
                            prop_assert_eq!(*got, v);
                            last.insert(key(k), v);
                        }
                        Err(_) => {
                            prop_assert!(rate != 0 || t.stats().rate_limited == 0);
                            last.remove(&key(k));
                        }
                    }
                }
                Op::Lookup { k } | Op::Touch { k, .. } => {
                    let flags = if let Op::Touch { flags, .. } = op { Some(flags) } else { None };
                    match t.lookup(&key(k), now) {
                        Some(got) => {
                            prop_assert_eq!(Some(&*got), last.get(&key(k)));
                            prop_assert!(model_live(got, now));
                            if let Some(flags) = flags {
                                apply_touch(got, flags, now);
                                last.insert(key(k), *got);
                            }
                        }
                        // Evicted, expired or never stored: gone from the table now.
                        None => {
                            last.remove(&key(k));
                        }
                    }
                }
                Op::Remove { k } => {
                    if let Some(got) = t.remove(&key(k)) {
                        prop_assert_eq!(Some(&got), last.get(&key(k)));
                    }
                    last.remove(&key(k));
                }
                Op::Advance { dt } => now += dt,
                Op::Sweep { buckets } => {
                    t.sweep(now, buckets);
                }
            }
            for (k, v) in t.iter() {
                prop_assert_eq!(Some(v), last.get(k), "held value is the last stored for its key");
            }
            check_accounting(&t)?;
        }
    }
}

// --- No allocation after `new` --------------------------------------------------------

#[global_allocator]
static ALLOCATOR: strait_testkit::alloc::Counting = strait_testkit::alloc::Counting;

/// Allocations (and frees) made by this thread while running `f`.
fn allocations_in(f: impl FnOnce()) -> usize {
    strait_testkit::alloc::counted(f).1
}

#[test]
fn counting_allocator_counts() {
    let n = allocations_in(|| drop(std::hint::black_box(vec![1u8; 10])));
    assert_eq!(
        n, 2,
        "the counter must see an allocation and its free, or the zero below proves nothing"
    );
}

#[test]
fn no_allocation_after_new() {
    let mut big = FlowTable::new(1 << 16, timeouts(), 0);
    // Small and rate-limited, to take the eviction, Full and RateLimited paths too.
    let mut small = FlowTable::new(16, timeouts(), 1_000);
    let mut outcomes = [0usize; 3];
    let n = allocations_in(|| {
        let mut now = 0;
        for i in 0..100_000u32 {
            now += 50 * MS / 1000; // 50 us a step: 5 s in all
            let k = FlowKey {
                src: v4_mapped((i % 70_000).to_be_bytes()),
                dst: v4_mapped([192, 0, 2, 1]),
                src_port: (i % 5_000) as u16,
                dst_port: 80,
                proto: proto::TCP,
            };
            let state = if i % 3 == 0 {
                FlowState::TcpSyn
            } else {
                FlowState::TcpEstablished
            };
            let v = value(i % 8, state, 0, i, now);
            let _ = big.insert(k, v, now);
            if let Some(e) = big.lookup(&key((i % 64) as u8), now) {
                e.touch(now);
            }
            if let Some(e) = big.lookup(&k, now) {
                apply_touch(e, tcp_flags::ACK, now);
            }
            if i % 7 == 0 {
                let _ = big.remove(&k);
            }
            if i % 100 == 0 {
                big.sweep(now, 64);
            }
            match small.insert(k, v, now) {
                Ok(_) => outcomes[0] += 1,
                Err(InsertError::Full) => outcomes[1] += 1,
                Err(InsertError::RateLimited) => outcomes[2] += 1,
            }
            let _ = small.lookup(&k, now);
            small.sweep(now, 1);
        }
        std::hint::black_box(big.iter().count() + big.stats().inserts as usize);
    });
    assert_eq!(n, 0, "the flow table allocated after new");
    assert!(
        outcomes.iter().all(|&c| c > 0),
        "every insert outcome exercised: {outcomes:?}"
    );
    assert!(small.stats().evicted > 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Entries per backend under inserts, overwrites, expiry, eviction, removals and sweeps,
    /// in a table that has room and in one that evicts, with each id's incarnation only
    /// growing (a freed id given to a newer backend), as a core sees them.
    #[test]
    fn entries_per_backend_are_exact(
        ops in proptest::collection::vec(op(64), 1..400),
        capacity in prop_oneof![Just(16usize), Just(1024)],
    ) {
        let mut t = FlowTable::new(capacity, timeouts(), 0);
        let mut incarnation = [1u32; 8];
        let mut now = 1_000 * S;
        for op in ops {
            match op {
                Op::Insert { k, backend, state, timeout_override, incarnation: r } => {
                    // One insert in five is of a newer backend with the id.
                    if r % 5 == 0 {
                        incarnation[backend as usize] += 1;
                    }
                    let v = value(backend, state, timeout_override, incarnation[backend as usize], now);
                    let _ = t.insert(key(k), v, now);
                }
                Op::Lookup { k } => {
                    let _ = t.lookup(&key(k), now);
                }
                Op::Touch { k, flags } => {
                    if let Some(v) = t.lookup(&key(k), now) {
                        apply_touch(v, flags, now);
                    }
                }
                Op::Remove { k } => {
                    let _ = t.remove(&key(k));
                }
                Op::Advance { dt } => now += dt,
                Op::Sweep { buckets } => {
                    t.sweep(now, buckets);
                }
            }
            check_per_backend(&t)?;
        }
    }
}
