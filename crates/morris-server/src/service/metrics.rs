//! What a stripe server exports to Prometheus (issue 20; served by the
//! `morris` binary's `--metrics` endpoint): each request's latency by
//! request name, block bytes read and written by copy, store commit times
//! (`store.rs`), and, at every scrape, its state as gauges.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, Counter};
use morris_proto::observe::OpTimers;
use morris_proto::{Request, ServerStats};
use parking_lot::Mutex;
use tracing::debug;

use super::Server;

/// Copies labelled with a handle of their own; later ones take the slow path.
const COPIES: usize = 4;
/// How often the bytes held on disk are summed again (a walk of every data
/// file: too costly for every scrape).
const DATA_BYTES_EVERY: Duration = Duration::from_secs(60);

/// The server's registered metric handles.
pub(crate) struct ServerMetrics {
    timers: OpTimers,
    read: Vec<Counter>,
    written: Vec<Counter>,
    /// The last sum of bytes held on disk, and when it was taken.
    data_bytes: Mutex<Option<(Instant, u64)>>,
    /// Block bytes read and written since start, all copies (the status
    /// page's graphs).
    read_total: AtomicU64,
    written_total: AtomicU64,
}

/// A block read or write in a request: (write, copy).
pub(crate) fn data_op(req: &Request) -> Option<(bool, u8)> {
    match req {
        Request::Read { replica, .. } => Some((false, *replica)),
        Request::Write { replica, .. } => Some((true, *replica)),
        _ => None,
    }
}

impl ServerMetrics {
    pub(crate) fn new() -> Self {
        let by_copy = |name: &'static str| {
            (0..COPIES)
                .map(|c| counter!(name, "copy" => c.to_string()))
                .collect()
        };
        ServerMetrics {
            timers: OpTimers::new(
                "morris_server_request_duration_seconds",
                Some("morris_server_request_errors_total"),
                &Request::NAMES,
            ),
            read: by_copy("morris_server_read_bytes_total"),
            written: by_copy("morris_server_written_bytes_total"),
            data_bytes: Mutex::new(None),
            read_total: AtomicU64::new(0),
            written_total: AtomicU64::new(0),
        }
    }

    /// Records one request: its name (at `at` in [`Request::NAMES`]), time
    /// and outcome.
    pub(crate) fn request(
        &self,
        at: Option<usize>,
        op: &'static str,
        took: Duration,
        failed: bool,
    ) {
        self.timers.record_at(at, op, took, failed);
    }

    /// Counts block bytes read from or written to copy `copy` here.
    pub(crate) fn data(&self, write: bool, copy: u8, bytes: usize) {
        let list = if write { &self.written } else { &self.read };
        let n = bytes as u64;
        let total = if write {
            &self.written_total
        } else {
            &self.read_total
        };
        total.fetch_add(n, Ordering::Relaxed);
        match list.get(usize::from(copy)) {
            Some(c) => c.increment(n),
            None if write => {
                counter!("morris_server_written_bytes_total", "copy" => copy.to_string())
                    .increment(n)
            }
            None => {
                counter!("morris_server_read_bytes_total", "copy" => copy.to_string()).increment(n)
            }
        }
    }
}

impl Server {
    /// Requests served, block bytes read and written, since start.
    pub(crate) fn totals(&self) -> (u64, u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.metrics.read_total.load(Ordering::Relaxed),
            self.metrics.written_total.load(Ordering::Relaxed),
        )
    }

    /// Sets every state gauge from the server's state now (at each scrape).
    pub(crate) async fn export_gauges(&self) {
        let due = self
            .metrics
            .data_bytes
            .lock()
            .is_none_or(|(at, _)| at.elapsed() >= DATA_BYTES_EVERY);
        let data_bytes = if due {
            match self.data_bytes().await {
                Ok(n) => {
                    *self.metrics.data_bytes.lock() = Some((Instant::now(), n));
                    Some(n)
                }
                Err(e) => {
                    debug!(error = %e, "metrics: cannot sum the bytes held");
                    None
                }
            }
        } else {
            self.metrics.data_bytes.lock().map(|(_, n)| n)
        };
        let st = match self.snapshot(data_bytes.unwrap_or(0)).await {
            Ok(st) => st,
            Err(e) => {
                debug!(error = %e, "metrics: no state to export");
                return;
            }
        };
        export(&st, data_bytes.is_some());
        match self.cache_status() {
            Ok(list) => export_cache(&list),
            Err(e) => debug!(error = %e, "metrics: no cache state to export"),
        }
    }
}

/// Sets the gauges of `st`.
fn export(st: &ServerStats, with_data_bytes: bool) {
    let g = |name: &'static str, v: u64| gauge!(name).set(v as f64);
    g("morris_server_inodes", st.inodes);
    g("morris_server_entries", st.entries);
    g("morris_server_data_files", st.data_files);
    if with_data_bytes {
        g("morris_server_data_bytes", st.data_bytes);
    }
    g("morris_server_leases", st.leases);
    g("morris_server_sessions", st.sessions);
    g("morris_server_connections", st.connections);
    g("morris_server_reply_bytes_inflight", st.reply_bytes);
    g("morris_server_io_inflight", st.io_inflight);
    g("morris_server_disk_free_bytes", st.disk_free);
    g("morris_server_disk_size_bytes", st.disk_total);
    g("morris_server_uptime_seconds", st.uptime_secs);
    g("morris_server_rebuilding", u64::from(st.rebuilding));
    counter!("morris_server_lease_recalls_total").absolute(st.recalls);
    counter!("morris_server_connections_refused_total").absolute(st.connections_refused);
    counter!("morris_server_connections_stalled_total").absolute(st.connections_stalled);
    for (server, files) in &st.stale_by_server {
        gauge!("morris_server_stale_files", "server" => server.to_string()).set(*files as f64);
    }
    let r = &st.resync;
    g("morris_server_resync_running", u64::from(r.running));
    counter!("morris_server_resync_passes_total").absolute(r.passes);
    g("morris_server_resync_files", r.files_total);
    g("morris_server_resync_files_done", r.files_done);
    g("morris_server_resync_copied_bytes", r.bytes_copied);
    for range in &st.ranges {
        let labels = [("range", range.range.to_string())];
        gauge!("morris_server_range_primary", &labels).set(f64::from(u8::from(range.primary)));
        gauge!("morris_server_range_ready", &labels).set(f64::from(u8::from(range.ready)));
        gauge!("morris_server_range_generation", &labels).set(range.gen as f64);
        gauge!("morris_server_range_inodes", &labels).set(range.inodes as f64);
        counter!("morris_server_range_takeovers_total", &labels).absolute(range.takeovers);
    }
    let i = &st.integrity;
    counter!("morris_server_checksum_failures_total").absolute(i.bad_chunks);
    counter!("morris_server_checked_bytes_total").absolute(i.checked_bytes);
    counter!("morris_server_repairs_total").absolute(i.repairs);
    counter!("morris_server_unrepairable_total").absolute(i.unrepairable);
    counter!("morris_server_fenced_writes_total").absolute(i.fenced);
}

/// Sets each home binding's counters (cache mode), labelled by the bound
/// directory's id.
fn export_cache(list: &[morris_proto::BindingStatus]) {
    for b in list {
        let labels = [("binding", b.binding.to_string())];
        counter!("morris_server_cache_hits_total", &labels).absolute(b.hits);
        counter!("morris_server_cache_misses_total", &labels).absolute(b.misses);
        counter!("morris_server_cache_fetched_bytes_total", &labels).absolute(b.fetched_bytes);
        counter!("morris_server_cache_evictions_total", &labels).absolute(b.evictions);
        counter!("morris_server_cache_pushed_total", &labels).absolute(b.pushed);
        counter!("morris_server_cache_conflicts_total", &labels).absolute(b.conflicts);
        gauge!("morris_server_cache_bytes", &labels).set(b.cached_bytes as f64);
        gauge!("morris_server_cache_home_reachable", &labels).set(f64::from(u8::from(b.reachable)));
        gauge!("morris_server_cache_queued", &labels).set(b.queued as f64);
        gauge!("morris_server_cache_dirty_bytes", &labels).set(b.dirty_bytes as f64);
    }
}
