//! Per-operation latency histograms for the Prometheus metrics (issue 20).
//!
//! Every process (server, mount, NFS gateway) records through the `metrics`
//! facade; the `morris` binary installs the exporter when asked
//! (`--metrics HOST:PORT`). Without one every record is a no-op. The
//! handles are registered once, so a record is a table look-up and an
//! atomic push, not a registry search with a label allocation.

use std::time::Duration;

use metrics::{Counter, Histogram};

/// Latency histograms (and error counters) of one family of operations,
/// one per operation name, e.g. `morris_server_request_duration_seconds{op}`.
pub struct OpTimers {
    metric: &'static str,
    errors_metric: Option<&'static str>,
    names: Vec<&'static str>,
    hists: Vec<Histogram>,
    errors: Vec<Counter>,
}

impl OpTimers {
    /// Registers `metric{op=NAME}` for every name in `names` (and
    /// `errors_metric{op=NAME}`, if any). Call after the exporter is
    /// installed: handles taken before it record nowhere.
    pub fn new(
        metric: &'static str,
        errors_metric: Option<&'static str>,
        names: &[&'static str],
    ) -> Self {
        let hists = names
            .iter()
            .map(|&n| metrics::histogram!(metric, "op" => n))
            .collect();
        let errors = match errors_metric {
            Some(m) => names
                .iter()
                .map(|&n| metrics::counter!(m, "op" => n))
                .collect(),
            None => Vec::new(),
        };
        OpTimers {
            metric,
            errors_metric,
            names: names.to_vec(),
            hists,
            errors,
        }
    }

    /// Where `op` is in the names given to [`OpTimers::new`].
    pub fn position(&self, op: &str) -> Option<usize> {
        self.names.iter().position(|&n| n == op)
    }

    /// Records that `op` took `took`, and whether it failed.
    pub fn record(&self, op: &'static str, took: Duration, failed: bool) {
        self.record_at(self.position(op), op, took, failed);
    }

    /// [`OpTimers::record`] for a caller that already knows `op`'s
    /// [`OpTimers::position`].
    pub fn record_at(&self, at: Option<usize>, op: &'static str, took: Duration, failed: bool) {
        match at.and_then(|i| self.hists.get(i).map(|h| (i, h))) {
            Some((i, h)) => {
                h.record(took.as_secs_f64());
                if let (true, Some(c)) = (failed, self.errors.get(i)) {
                    c.increment(1);
                }
            }
            // A name not listed at start: the slow path, same series.
            None => {
                metrics::histogram!(self.metric, "op" => op).record(took.as_secs_f64());
                if let (true, Some(m)) = (failed, self.errors_metric) {
                    metrics::counter!(m, "op" => op).increment(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_without_an_exporter_are_harmless() {
        let t = OpTimers::new("x_seconds", Some("x_errors_total"), &["A", "B"]);
        t.record("A", Duration::from_millis(1), false);
        t.record("C", Duration::from_millis(1), true);
        t.record_at(t.position("B"), "B", Duration::from_millis(1), false);
    }
}
