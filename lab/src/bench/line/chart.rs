//! The PNG chart of a line-rate report: a row of panels for delivered Mpps and one for the
//! forwarding CPU's nanoseconds per delivered packet, one panel per traffic type in each, a
//! group of bars per service count (one bar per system with services), `limit` as a line
//! across the panel (and `limit-dpdk`, when measured, as a grey one), both on log scales (iptables at 10,000 services and `limit` are two
//! orders of magnitude apart). The bars are [`BARS`]: a system added there is drawn.
//!
//! Text is drawn with the DejaVu Sans embedded in the binary (plotters' `ab_glyph` back
//! end), so drawing needs no fontconfig and no system font.

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use super::{Report, System, Traffic};

/// Image size in pixels: two rows of panels.
const SIZE: (u32, u32) = (1400, 1340);
/// The systems drawn as bars, in bar order, with their colours.
const BARS: [(System, RGBColor); 6] = [
    (System::StraitDsrL2, RGBColor(31, 119, 180)),
    (System::StraitNat, RGBColor(44, 160, 44)),
    (System::StraitDpdkDsrL2, RGBColor(148, 103, 189)),
    (System::StraitDpdkNat, RGBColor(23, 190, 207)),
    (System::Iptables, RGBColor(214, 39, 40)),
    (System::Nftables, RGBColor(255, 127, 14)),
];
/// The limits drawn as lines across a panel, with their colours and legend names.
const LIMITS: [(System, RGBColor, &str); 2] = [
    (System::Limit, BLACK, "limit (AF_XDP MAC swap)"),
    (
        System::LimitDpdk,
        RGBColor(127, 127, 127),
        "limit-dpdk (DPDK MAC swap)",
    ),
];
/// The font family name the chart registers and uses.
const FONT: &str = "sans-serif";

static FONT_ONCE: Once = Once::new();

fn register_font() {
    FONT_ONCE.call_once(|| {
        // The embedded font is a valid TrueType file; a failure here would only leave the
        // chart without text, which `render` then reports when drawing fails.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

/// Draws `report` into a PNG at `path`.
///
/// # Errors
///
/// When there is nothing to draw, or drawing or writing the file fails.
pub fn render(report: &Report, path: &Path) -> Result<()> {
    register_font();
    if report.results.is_empty() {
        return Err(anyhow!("no results to draw"));
    }
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (title, body) = root.split_vertically(50);
    title
        .draw(&Text::new(
            format!(
                "strait-lab bench line-rate: delivered Mpps and CPU per packet, UDP {}-byte frames, forwarder on one core ({})",
                report.frame_bytes, report.date
            ),
            (20, 12),
            (FONT, 22).into_font(),
        ))
        .map_err(err)?;
    title
        .draw(&Text::new(
            report.machine.clone(),
            (20, 34),
            (FONT, 13).into_font().color(&RGBColor(90, 90, 90)),
        ))
        .map_err(err)?;
    let rows = body.split_evenly((2, 1));
    for (row, metric) in rows.iter().zip([Metric::Mpps, Metric::CpuNs]) {
        let panels = row.split_evenly((1, Traffic::ALL.len()));
        let range = match metric {
            Metric::Mpps => y_range(
                report.results.iter().map(|p| p.delivered_mpps),
                (0.001, 10.0),
            ),
            Metric::CpuNs => y_range(
                report.results.iter().filter_map(|p| p.cpu_ns_per_packet),
                (10.0, 1e6),
            ),
        };
        // New flows on the left: the headline comparison.
        for (area, traffic) in panels.iter().zip([Traffic::NewFlows, Traffic::Established]) {
            panel(area, report, traffic, metric, range)?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("{e:?}")
}

/// What a row of panels draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    /// Delivered Mpps (higher is better).
    Mpps,
    /// The forwarding CPU's ns per delivered packet (lower is better).
    CpuNs,
}

impl Metric {
    fn value(self, p: &super::Point) -> Option<f64> {
        match self {
            Metric::Mpps => Some(p.delivered_mpps),
            Metric::CpuNs => p.cpu_ns_per_packet,
        }
        .filter(|v| *v > 0.0 && v.is_finite())
    }

    fn axis(self) -> &'static str {
        match self {
            Metric::Mpps => "delivered Mpps (log scale)",
            Metric::CpuNs => "CPU ns per delivered packet (log scale)",
        }
    }

    fn format(self, v: f64) -> String {
        match self {
            Metric::Mpps => format_mpps(v),
            Metric::CpuNs => format_ns(v),
        }
    }
}

/// One traffic type's panel.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    report: &Report,
    traffic: Traffic,
    metric: Metric,
    (lo, hi): (f64, f64),
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let points: Vec<_> = report
        .results
        .iter()
        .filter(|p| p.traffic == traffic)
        .collect();
    let mut scales: Vec<usize> = points
        .iter()
        .filter(|p| p.system.has_services())
        .map(|p| p.services)
        .collect();
    scales.sort_unstable();
    scales.dedup();
    let systems: Vec<(System, RGBColor)> = BARS
        .iter()
        .copied()
        .filter(|(s, _)| points.iter().any(|p| p.system == *s))
        .collect();
    let limits: Vec<(f64, RGBColor, &str)> = LIMITS
        .iter()
        .filter_map(|&(system, color, name)| {
            let p = points.iter().find(|p| p.system == system)?;
            Some((metric.value(p)?, color, name))
        })
        .collect();
    let per_group = systems.len() + 1;
    // No gap after the last group.
    let slots = (scales.len() * per_group).saturating_sub(1).max(1) as i32;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "{}: {} ({})",
                match metric {
                    Metric::Mpps => "throughput",
                    Metric::CpuNs => "CPU per packet",
                },
                traffic.as_str(),
                match traffic {
                    Traffic::NewFlows => "every packet a new 5-tuple".to_owned(),
                    Traffic::Established => format!("{} flows", report.established_flows),
                }
            ),
            (FONT, 18),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0..slots).into_segmented(), (lo..hi).log_scale())
        .map_err(err)?;
    let label_slot = |g: usize| (g * per_group + systems.len() / 2) as i32;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(slots as usize + 1)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => (0..scales.len())
                .find(|&g| label_slot(g) == *i)
                .map_or_else(String::new, |g| format!("{} services", scales[g])),
            SegmentValue::Last => String::new(),
        })
        .y_desc(metric.axis())
        .y_label_formatter(&|v| match metric {
            Metric::Mpps => format!("{v}"),
            Metric::CpuNs => format_ns(*v),
        })
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 14))
        .draw()
        .map_err(err)?;

    for (si, (system, color)) in systems.iter().enumerate() {
        let bars: Vec<(i32, f64)> = scales
            .iter()
            .enumerate()
            .filter_map(|(g, &n)| {
                let p = points
                    .iter()
                    .find(|p| p.system == *system && p.services == n)?;
                Some(((g * per_group + si) as i32, metric.value(p)?))
            })
            .collect();
        let color = *color;
        chart
            .draw_series(bars.iter().map(|&(x, v)| {
                Rectangle::new(
                    [
                        (SegmentValue::Exact(x), lo),
                        (SegmentValue::Exact(x + 1), v),
                    ],
                    color.filled(),
                )
            }))
            .map_err(err)?
            .label(system.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
        let style = (FONT, 12)
            .into_font()
            .into_text_style(area)
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        chart
            .draw_series(bars.iter().map(|&(x, v)| {
                Text::new(
                    metric.format(v),
                    (SegmentValue::CenterOf(x), v),
                    style.clone(),
                )
            }))
            .map_err(err)?;
    }
    for (l, color, name) in limits {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(SegmentValue::Exact(0), l), (SegmentValue::Last, l)],
                color.stroke_width(2),
            )))
            .map_err(err)?
            .label(format!("{name}: {}", metric.format(l)))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()
        .map_err(err)?;
    Ok(())
}

/// The y range shared by a row's panels: whole decades around every positive value, with
/// most of a decade free above the highest bar for the legend; `empty` when there is none.
fn y_range(values: impl Iterator<Item = f64>, empty: (f64, f64)) -> (f64, f64) {
    let values: Vec<f64> = values.filter(|v| *v > 0.0 && v.is_finite()).collect();
    if values.is_empty() {
        return empty;
    }
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(0.0, f64::max);
    (
        10f64.powf((lo * 0.5).log10().floor()),
        10f64.powf((hi * 8.0).log10().ceil()),
    )
}

/// `85 ns`, `4.2 µs`, `125 µs`.
fn format_ns(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0} µs", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.1} µs", v / 1000.0)
    } else {
        format!("{v:.0} ns")
    }
}

/// `0.612`, `0.0071`: three significant digits.
fn format_mpps(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else if v >= 0.1 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    }
}
