//! Medians and ranges of repeated measurements.

use serde::{Deserialize, Serialize};

/// Median and range of repeated measurements.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

impl Stat {
    pub(crate) fn of(mut xs: Vec<f64>) -> Option<Stat> {
        if xs.is_empty() {
            return None;
        }
        xs.sort_by(|a, b| a.total_cmp(b));
        let n = xs.len();
        let median = if n % 2 == 1 {
            xs[n / 2]
        } else {
            (xs[n / 2 - 1] + xs[n / 2]) / 2.0
        };
        Some(Stat {
            median,
            min: xs[0],
            max: xs[n - 1],
            runs: n,
        })
    }

    pub(crate) fn show(&self) -> String {
        if self.runs == 1 {
            fmt_secs(self.median)
        } else {
            format!(
                "{} [{}–{}]",
                fmt_secs(self.median),
                fmt_secs(self.min),
                fmt_secs(self.max)
            )
        }
    }
}

pub(crate) fn fmt_secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}
