//! The `# HELP` text and unit of every metric morris exports (one table, so
//! that docs/operations.md's list and the endpoint agree; a test checks
//! that nothing is exported without one).

use metrics::Unit;

/// A metric's kind, for its description.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

use Kind::{Counter, Gauge, Histogram};

/// (name, kind, unit, help).
#[rustfmt::skip]
pub(super) const METRICS: &[(&str, Kind, Unit, &str)] = &[
    ("morris_build_info", Gauge, Unit::Count, "Always 1; labels: version, role (server, mount, nfs)"),
    // Servers.
    ("morris_server_request_duration_seconds", Histogram, Unit::Seconds, "Time to serve a request, by request name (op)"),
    ("morris_server_request_errors_total", Counter, Unit::Count, "Requests answered with an error, by request name (op)"),
    ("morris_server_read_bytes_total", Counter, Unit::Bytes, "Block bytes read from this server's disk, by copy number"),
    ("morris_server_written_bytes_total", Counter, Unit::Bytes, "Block bytes written to this server's disk, by copy number"),
    ("morris_server_store_commit_seconds", Histogram, Unit::Seconds, "Time to commit one metadata store transaction (SQLite)"),
    ("morris_server_fsync_seconds", Histogram, Unit::Seconds, "Time to flush one file's block data and checksums to stable storage (a sync write, fsync)"),
    ("morris_server_store_flushes_total", Counter, Unit::Count, "Flushes of the metadata store to stable storage (an fsync that found something committed since the last one; one with nothing to flush is skipped)"),
    ("morris_server_inodes", Gauge, Unit::Count, "Inodes in this server's own metadata range"),
    ("morris_server_entries", Gauge, Unit::Count, "Directory entries in this server's own metadata range"),
    ("morris_server_data_files", Gauge, Unit::Count, "Files with blocks on this server"),
    ("morris_server_data_bytes", Gauge, Unit::Bytes, "Bytes of block data on this server's disk (summed at most once a minute)"),
    ("morris_server_leases", Gauge, Unit::Count, "Leases granted by this server now"),
    ("morris_server_lease_recalls_total", Counter, Unit::Count, "Lease recalls this server has sent"),
    ("morris_server_sessions", Gauge, Unit::Count, "Client sessions connected"),
    ("morris_server_connections", Gauge, Unit::Count, "Connections open"),
    ("morris_server_connections_refused_total", Counter, Unit::Count, "Connections refused at the connection cap"),
    ("morris_server_connections_stalled_total", Counter, Unit::Count, "Connections closed because the peer stopped reading"),
    ("morris_server_reply_bytes_inflight", Gauge, Unit::Bytes, "Bytes of data replies being sent"),
    ("morris_server_io_inflight", Gauge, Unit::Count, "Block reads and writes being served"),
    ("morris_server_disk_free_bytes", Gauge, Unit::Bytes, "Free bytes on the data directory's file system"),
    ("morris_server_disk_size_bytes", Gauge, Unit::Bytes, "Size of the data directory's file system"),
    ("morris_server_uptime_seconds", Gauge, Unit::Seconds, "Time since the server process started"),
    ("morris_server_rebuilding", Gauge, Unit::Count, "1 while a replacement server's copies are not yet recorded stale"),
    ("morris_server_stale_files", Gauge, Unit::Count, "Files recorded here with stale copies, by the server holding them"),
    ("morris_server_resync_running", Gauge, Unit::Count, "1 while a resync pass copies to this server"),
    ("morris_server_resync_passes_total", Counter, Unit::Count, "Resync passes completed"),
    ("morris_server_resync_files", Gauge, Unit::Count, "Files the current (or last) resync pass found stale here"),
    ("morris_server_resync_files_done", Gauge, Unit::Count, "Of those, files caught up"),
    ("morris_server_resync_copied_bytes", Gauge, Unit::Bytes, "Bytes copied here by the current (or last) resync pass"),
    ("morris_server_range_primary", Gauge, Unit::Count, "1 if this server serves the metadata range (label range)"),
    ("morris_server_range_ready", Gauge, Unit::Count, "Primary: serving; secondary: its copy is current"),
    ("morris_server_range_generation", Gauge, Unit::Count, "The range's ownership generation (raised by each takeover)"),
    ("morris_server_range_inodes", Gauge, Unit::Count, "Inodes in this server's copy of the range"),
    ("morris_server_range_takeovers_total", Counter, Unit::Count, "Takeovers of the range by this server"),
    ("morris_server_checksum_failures_total", Counter, Unit::Count, "4 KiB chunks whose checksum did not match"),
    ("morris_server_checked_bytes_total", Counter, Unit::Bytes, "Bytes checked against their checksums"),
    ("morris_server_repairs_total", Counter, Unit::Count, "Damaged copies repaired from another copy"),
    ("morris_server_unrepairable_total", Counter, Unit::Count, "Damaged data with no other copy"),
    ("morris_server_fenced_writes_total", Counter, Unit::Count, "Writes refused because their lease had passed to another client"),
    ("morris_server_cache_hits_total", Counter, Unit::Count, "Cache mode: reads of a binding's data answered from this server's cached units (label binding)"),
    ("morris_server_cache_misses_total", Counter, Unit::Count, "Cache mode: reads that had to fetch from home"),
    ("morris_server_cache_fetched_bytes_total", Counter, Unit::Bytes, "Cache mode: bytes fetched from home"),
    ("morris_server_cache_evictions_total", Counter, Unit::Count, "Cache mode: cached units evicted"),
    ("morris_server_cache_pushed_total", Counter, Unit::Count, "Cache mode (sw, iw): changes pushed to home"),
    ("morris_server_cache_conflicts_total", Counter, Unit::Count, "Cache mode (iw): conflicts resolved"),
    ("morris_server_cache_bytes", Gauge, Unit::Bytes, "Cache mode: bytes of home's data cached on this server"),
    ("morris_server_cache_home_reachable", Gauge, Unit::Count, "Cache mode: 1 if home answered last time"),
    ("morris_server_cache_queued", Gauge, Unit::Count, "Cache mode (sw, iw): changed objects waiting to be pushed home"),
    ("morris_server_cache_dirty_bytes", Gauge, Unit::Bytes, "Cache mode (sw, iw): bytes of data waiting to be pushed home"),
    // Clients: mounts, gateways (and a server's own resync client).
    ("morris_client_request_duration_seconds", Histogram, Unit::Seconds, "Time from sending a request to a server to its answer, by request name (op)"),
    ("morris_client_request_errors_total", Counter, Unit::Count, "Requests that failed, by request name (op)"),
    ("morris_client_sent_bytes_total", Counter, Unit::Bytes, "Payload bytes (block data) sent to each server (label server)"),
    ("morris_client_received_bytes_total", Counter, Unit::Bytes, "Payload bytes (block data) received from each server (label server)"),
    ("morris_client_hedged_reads_total", Counter, Unit::Count, "Reads also asked of another copy because the first was silent"),
    ("morris_client_read_failovers_total", Counter, Unit::Count, "Reads of a copy that failed and went to another copy"),
    ("morris_client_leases", Gauge, Unit::Count, "Leases held by this client"),
    ("morris_client_lease_lapses_total", Counter, Unit::Count, "Times a server stayed silent for a lease time and this client dropped every lease it granted (label server)"),
    ("morris_client_lease_recalls_total", Counter, Unit::Count, "Lease recalls received"),
    ("morris_client_open_files", Gauge, Unit::Count, "Files open through this client"),
    ("morris_client_write_behind_gathered_bytes", Gauge, Unit::Bytes, "Small writes gathered and not yet sent"),
    ("morris_client_write_behind_inflight_bytes", Gauge, Unit::Bytes, "Write-behind bytes sent and not yet answered"),
    // Front ends.
    ("morris_fuse_request_duration_seconds", Histogram, Unit::Seconds, "Time to answer a FUSE request, by operation (op)"),
    ("morris_fuse_request_errors_total", Counter, Unit::Count, "FUSE requests answered with an error, by operation (op)"),
    ("morris_fuse_names_dropped_total", Counter, Unit::Count, "Times the mount had the kernel drop every name it kept at once (a lease given back before its names' invalidations took effect)"),
    ("morris_nfs_request_duration_seconds", Histogram, Unit::Seconds, "Time to answer an NFS, MOUNT or NLM call, by procedure (op)"),
];

/// Describes every metric to the installed recorder.
pub(super) fn describe_all() {
    for &(name, kind, unit, help) in METRICS {
        match kind {
            Counter => metrics::describe_counter!(name, unit, help),
            Gauge => metrics::describe_gauge!(name, unit, help),
            Histogram => metrics::describe_histogram!(name, unit, help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `morris_...` name in `text`.
    fn names(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find("morris_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            out.push(tail[..end].to_string());
            rest = &tail[end..];
        }
        out
    }

    #[test]
    fn the_dashboard_uses_only_metrics_that_exist() {
        let dash = include_str!("../../../../docs/grafana/morris.json");
        let v: serde_json::Value = serde_json::from_str(dash).unwrap();
        assert!(v["panels"].as_array().is_some_and(|p| p.len() > 10));
        let known: Vec<&str> = METRICS.iter().map(|m| m.0).collect();
        let used = names(dash);
        assert!(used.len() > 20);
        for n in used {
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .filter(|b| known.contains(b))
                .unwrap_or(&n);
            assert!(
                known.contains(&base),
                "the dashboard uses {n}, which nothing exports"
            );
        }
    }

    #[test]
    fn the_operations_guide_lists_every_metric() {
        let guide = include_str!("../../../../docs/operations.md");
        for (name, ..) in METRICS {
            assert!(
                guide.contains(&format!("| `{name}` |")),
                "docs/operations.md does not list {name}"
            );
        }
    }

    #[test]
    fn names_follow_the_conventions() {
        for (name, kind, unit, help) in METRICS {
            assert!(name.starts_with("morris_"), "{name}");
            assert!(!help.is_empty(), "{name}");
            match kind {
                Kind::Counter => assert!(name.ends_with("_total"), "{name}"),
                Kind::Histogram => assert!(name.ends_with("_seconds"), "{name}"),
                Kind::Gauge => assert!(!name.ends_with("_total"), "{name}"),
            }
            if *unit == Unit::Bytes {
                assert!(name.contains("bytes"), "{name}");
            }
        }
    }
}
