//! Writing constant Prometheus families: the admin API's collectors (`admin`, `kube::stats`)
//! read their numbers on each scrape and emit them through these, so every metric of the
//! gateway is encoded one way.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// A family's samples: each one's labels and value.
pub(crate) type Rows<'a, T> = Vec<(Vec<(&'a str, String)>, T)>;

/// Writes counter family `name` with one sample per row.
pub(crate) fn counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, u64)],
) -> std::fmt::Result {
    let probe = ConstCounter::new(0u64);
    let mut fam = enc.encode_descriptor(name, help, None, probe.metric_type())?;
    for (labels, v) in rows {
        ConstCounter::new(*v).encode(fam.encode_family(labels)?)?;
    }
    Ok(())
}

/// Writes counter family `name` of seconds (a float) with one sample per row.
pub(crate) fn seconds_counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, f64)],
) -> std::fmt::Result {
    let probe = ConstCounter::new(0f64);
    let mut fam = enc.encode_descriptor(name, help, None, probe.metric_type())?;
    for (labels, v) in rows {
        ConstCounter::new(*v).encode(fam.encode_family(labels)?)?;
    }
    Ok(())
}

/// Writes gauge family `name` with one sample per row.
pub(crate) fn gauge(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, i64)],
) -> std::fmt::Result {
    let probe = ConstGauge::new(0i64);
    let mut fam = enc.encode_descriptor(name, help, None, probe.metric_type())?;
    for (labels, v) in rows {
        ConstGauge::new(*v).encode(fam.encode_family(labels)?)?;
    }
    Ok(())
}

/// One sample without labels.
pub(crate) fn one<T>(v: T) -> Rows<'static, T> {
    vec![(Vec::new(), v)]
}

/// A count as a gauge value, saturating.
pub(crate) fn gauge_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Writes where each worker's UMEM frames are (`strait_umem_frames{core, state}`), the UMEM's
/// size and the frames whose books disagree, from the workers' latest look
/// ([`strait_dataplane::xsk::WorkerStats::umem`]).
///
/// The states add up to `strait_umem_capacity_frames`: `free` (user space's free list),
/// `fill`, `rx`, `tx`, `completion` (on those rings) and `kernel` (taken by the kernel from a
/// fill or TX ring and not yet on an RX or completion ring: a moment in copy mode, the
/// posted buffers of a zero-copy driver). A frame lost would show as `kernel` growing while
/// traffic is stopped, or as a misplaced frame.
pub(crate) fn umem(
    enc: &mut DescriptorEncoder<'_>,
    samples: &[(String, crate::shared::CoreSample)],
) -> std::fmt::Result {
    let core = |n: &String| vec![("core", n.clone())];
    let states: Vec<_> = samples
        .iter()
        .flat_map(|(n, s)| {
            let a = &s.worker.umem;
            [
                ("free", i64::from(a.held)),
                ("fill", i64::from(a.fill)),
                ("rx", i64::from(a.rx)),
                ("tx", i64::from(a.tx)),
                ("completion", i64::from(a.comp)),
                ("kernel", a.in_kernel),
            ]
            .map(|(state, v)| (vec![("core", n.clone()), ("state", state.to_owned())], v))
        })
        .collect();
    gauge(
        enc,
        "umem_frames",
        "UMEM frames by where they are: free (user space), fill, rx, tx, completion (on those \
         rings), kernel (taken from fill or TX, not yet on RX or completion). They add up to \
         strait_umem_capacity_frames.",
        &states,
    )?;
    let total: Vec<_> = samples
        .iter()
        .map(|(n, s)| (core(n), i64::from(s.worker.umem.total)))
        .collect();
    gauge(
        enc,
        "umem_capacity_frames",
        "Frames in the worker's UMEM.",
        &total,
    )?;
    let misplaced: Vec<_> = samples
        .iter()
        .map(|(n, s)| (core(n), i64::from(s.worker.umem.misplaced)))
        .collect();
    gauge(
        enc,
        "umem_misplaced_frames",
        "Frames whose recorded owner disagrees with the free list: 0 unless a frame was lost \
         or counted twice.",
        &misplaced,
    )
}
