//! Writing constant Prometheus families: the admin API's collectors (`admin`, `kube::stats`,
//! `cores`, `sync`) read their numbers on each scrape and emit them through these, so every
//! metric of the gateway is encoded one way. A leaf: it knows no module of the crate, each
//! module that owns numbers writes its own families through it.

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

/// Writes gauge family `name` of seconds (a float) with one sample per row.
pub(crate) fn seconds_gauge(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, f64)],
) -> std::fmt::Result {
    let probe = ConstGauge::new(0f64);
    let mut fam = enc.encode_descriptor(name, help, None, probe.metric_type())?;
    for (labels, v) in rows {
        ConstGauge::new(*v).encode(fam.encode_family(labels)?)?;
    }
    Ok(())
}
