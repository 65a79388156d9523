//! CSV and PNG output of an incast run.
//!
//! The PNG is drawn with `plotters` (bitmap backend, PNG encoder, line series) and labelled
//! with a 10 KB ASCII subset of DejaVu Sans embedded in the binary
//! (`assets/fonts/`, Bitstream Vera licence), so it needs no system fonts.

use crate::sim::incast::IncastResult;
use plotters::prelude::*;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Once;

/// Write the time series as CSV: one row per sample,
/// `t_us,queue_kb,queue_max_kb,pfc_paused`, then per flow `fI_gbps` (goodput over the
/// interval ending at `t_us`), `fI_rate_gbps` (the controller's rate at `t_us`) and
/// `fI_alpha` (empty without α).
pub fn write_csv(result: &IncastResult, mut out: impl Write) -> io::Result<()> {
    let n = result.flows.len();
    write!(out, "t_us,queue_kb,queue_max_kb,pfc_paused")?;
    for i in 0..n {
        write!(out, ",f{i}_gbps,f{i}_rate_gbps,f{i}_alpha")?;
    }
    writeln!(out)?;
    for s in &result.samples {
        write!(
            out,
            "{:.3},{:.3},{:.3},{}",
            s.t.as_nanos() as f64 / 1000.0,
            s.queue_bytes as f64 / 1000.0,
            s.queue_max_bytes as f64 / 1000.0,
            u8::from(s.pfc_paused)
        )?;
        for f in &s.flows {
            write!(
                out,
                ",{:.4},{:.4},",
                f.throughput_bps / 1e9,
                f.rate_bps as f64 / 1e9
            )?;
            if let Some(a) = f.alpha {
                write!(out, "{a:.6}")?;
            }
        }
        writeln!(out)?;
    }
    out.flush()
}

static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-ascii.ttf");

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is embedded and known good; a failure would only lose the labels.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

fn err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// One panel: a line per flow of `value(sample, flow)` against time in ms.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    result: &IncastResult,
    title: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> io::Result<()>
where
    DB::ErrorType: 'static,
{
    let t_max = result.config.duration.as_nanos() as f64 / 1e6;
    panel_xy(area, title, "time (ms)", t_max, y_desc, series)
}

/// A panel of a figure made by [`write_panels_png`]: a title, the y axis' name and one named
/// line per series of (x, y) points.
pub struct Panel {
    /// Shown above the panel.
    pub title: String,
    /// The y axis' name.
    pub y_desc: String,
    /// Named lines of (x, y) points.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

/// Stack `panels` vertically in one PNG, all against the same x axis (`x_desc`, 0..x_max).
pub fn write_panels_png(
    path: &Path,
    width: u32,
    height: u32,
    x_desc: &str,
    x_max: f64,
    panels: &[Panel],
) -> io::Result<()> {
    register_font();
    // Fail with the file system's own error (not the drawing backend's) if the PNG cannot
    // be written.
    std::fs::File::create(path)?;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((panels.len().max(1), 1));
    for (a, p) in areas.iter().zip(panels) {
        panel_xy(a, &p.title, x_desc, x_max, &p.y_desc, &p.series)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn panel_xy<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x_desc: &str,
    t_max: f64,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> io::Result<()>
where
    DB::ErrorType: 'static,
{
    let t_max = t_max.max(1e-9);
    let y_max = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.08;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(8)
        .margin_right(28)
        .x_label_area_size(32)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)?;
    let legend = series.len() <= 8;
    for (k, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let s = chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(1)))
            .map_err(err)?;
        if legend {
            s.label(name.as_str()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        }
    }
    if legend && series.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// Plot the run as a PNG (`width` × `height` pixels): four panels against time: per-flow
/// goodput, per-flow controller rate R_C, per-flow α (when the controller has one), and
/// the switch backlog.
pub fn write_png(result: &IncastResult, path: &Path, width: u32, height: u32) -> io::Result<()> {
    register_font();
    // Fail with the file system's own error (not the drawing backend's) if the PNG cannot
    // be written.
    std::fs::File::create(path)?;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let has_alpha = result
        .samples
        .iter()
        .any(|s| s.flows.iter().any(|f| f.alpha.is_some()));
    let panels = root.split_evenly((if has_alpha { 4 } else { 3 }, 1));
    let ms = |t: crate::time::Instant| t.as_nanos() as f64 / 1e6;
    let n = result.flows.len();
    let per_flow =
        |f: &dyn Fn(&crate::sim::incast::FlowSample) -> Option<f64>| -> Vec<(String, Vec<(f64, f64)>)> {
            (0..n)
                .map(|i| {
                    let pts = result
                        .samples
                        .iter()
                        .filter_map(|s| f(&s.flows[i]).map(|v| (ms(s.t), v)))
                        .collect();
                    (format!("flow {i}"), pts)
                })
                .collect()
        };
    let cfg = &result.config;
    let title = format!(
        "{} senders, {} Gb/s, cc={}: goodput per flow",
        cfg.senders,
        cfg.link_bps as f64 / 1e9,
        cfg.cc.name()
    );
    let mut k = 0;
    panel(
        &panels[k],
        result,
        &title,
        "Gb/s",
        &per_flow(&|f| Some(f.throughput_bps / 1e9)),
    )?;
    k += 1;
    panel(
        &panels[k],
        result,
        "sending rate R_C per flow",
        "Gb/s",
        &per_flow(&|f| Some(f.rate_bps as f64 / 1e9)),
    )?;
    k += 1;
    if has_alpha {
        panel(
            &panels[k],
            result,
            "alpha per flow",
            "alpha",
            &per_flow(&|f| f.alpha),
        )?;
        k += 1;
    }
    let queue: Vec<(f64, f64)> = result
        .samples
        .iter()
        .map(|s| (ms(s.t), s.queue_max_bytes as f64 / 1000.0))
        .collect();
    panel(
        &panels[k],
        result,
        "switch queue (max per sample interval)",
        "KB",
        &[("queue".to_string(), queue)],
    )?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cc::CcConfig;
    use crate::sim::incast::{run, IncastConfig};

    const G100: u64 = 100_000_000_000;

    fn config(senders: usize, link_bps: u64, ms: u64) -> IncastConfig {
        let mut c = IncastConfig::new(senders, link_bps);
        c.duration = crate::time::Duration::from_millis(ms);
        c
    }

    #[test]
    fn csv_and_png_outputs() {
        let r = run(&config(2, G100, 2)).unwrap();
        let mut csv = Vec::new();
        write_csv(&r, &mut csv).unwrap();
        let text = String::from_utf8(csv).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next().unwrap(),
            "t_us,queue_kb,queue_max_kb,pfc_paused,f0_gbps,f0_rate_gbps,f0_alpha,\
             f1_gbps,f1_rate_gbps,f1_alpha"
        );
        let rows: Vec<&str> = lines.collect();
        assert_eq!(rows.len(), r.samples.len());
        assert!(rows.iter().all(|l| l.split(',').count() == 10));
        assert!(rows[0].starts_with("20.000,"));

        let dir = std::env::temp_dir().join(format!("ferroce-incast-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let png = dir.join("incast.png");
        write_png(&r, &png, 800, 900).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(bytes.len() > 10_000);
        // Without α (no CC) there is one panel fewer; it still works.
        let mut c = config(2, G100, 1);
        c.cc = CcConfig::None;
        let r = run(&c).unwrap();
        write_png(&r, &dir.join("none.png"), 600, 600).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
