//! The first-scan plot: time against log size per backend, with its raw-scan floor beside it.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use super::first_scan::Row;

pub(super) fn first_scan(rows: &[Row], path: &Path) -> Result<()> {
    let points = |backend: &str, pick: fn(&Row) -> Option<f64>| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.backend == backend && r.entries > 0)
            .filter_map(|r| pick(r).map(|t| (r.entries as f64, t.max(1e-6))))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let all: Vec<(f64, f64)> = rows
        .iter()
        .flat_map(|r| {
            [r.first_scan_warm.as_ref(), r.floor_warm.as_ref()]
                .into_iter()
                .flatten()
                .map(move |s| (r.entries as f64, s.median.max(1e-6)))
        })
        .collect();
    if all.is_empty() {
        return Ok(());
    }
    let (xmin, xmax) = all.iter().fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (ymin, ymax) = all.iter().fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "ctxlog: first scan vs. raw-scan floor (warm cache, median)",
            ("sans-serif", 20),
        )
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (xmin * 0.8..xmax * 1.25).log_scale(),
            (ymin * 0.7..ymax * 1.5).log_scale(),
        )
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("log size (entries)")
        .y_desc("seconds")
        .x_label_formatter(&|x| format!("{:.0}", x))
        .y_label_formatter(&|y| format!("{y:.3}"))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    let palette = [BLUE, RED, GREEN, MAGENTA];
    let mut backends: Vec<&str> = rows.iter().map(|r| r.backend.as_str()).collect();
    backends.dedup();
    for (i, b) in backends.iter().enumerate() {
        let color = palette[i % palette.len()];
        let scan = points(b, |r| r.first_scan_warm.as_ref().map(|s| s.median));
        chart
            .draw_series(LineSeries::new(scan.clone(), color.stroke_width(3)))
            .map_err(|e| anyhow!("{e}"))?
            .label(format!("{b}: first scan"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3)));
        chart
            .draw_series(scan.iter().map(|p| Circle::new(*p, 4, color.filled())))
            .map_err(|e| anyhow!("{e}"))?;
        let floor = points(b, |r| r.floor_warm.as_ref().map(|s| s.median));
        chart
            .draw_series(DashedLineSeries::new(floor.clone(), 6, 4, color.stroke_width(1)))
            .map_err(|e| anyhow!("{e}"))?
            .label(format!("{b}: raw-scan floor"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(1)));
        chart
            .draw_series(floor.iter().map(|p| Cross::new(*p, 4, color.stroke_width(1))))
            .map_err(|e| anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
