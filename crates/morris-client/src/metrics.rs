//! What a client (a mount or an NFS gateway) exports to Prometheus
//! (issue 20): each request's time by request name, payload bytes by
//! server, and, at each scrape, its leases and write-behind as gauges.

use std::time::Duration;

use metrics::{counter, Counter};
use morris_proto::net::RpcError;
use morris_proto::observe::OpTimers;
use morris_proto::{Reply, Request};

/// A client's registered metric handles ([`crate::pool::Pool`]).
pub(crate) struct PoolMetrics {
    timers: OpTimers,
    sent: Vec<Counter>,
    received: Vec<Counter>,
}

impl PoolMetrics {
    /// Handles for a volume of `servers` servers.
    pub(crate) fn new(servers: usize) -> Self {
        let by_server = |name: &'static str| {
            (0..servers)
                .map(|s| counter!(name, "server" => s.to_string()))
                .collect()
        };
        PoolMetrics {
            timers: OpTimers::new(
                "morris_client_request_duration_seconds",
                Some("morris_client_request_errors_total"),
                &Request::NAMES,
            ),
            sent: by_server("morris_client_sent_bytes_total"),
            received: by_server("morris_client_received_bytes_total"),
        }
    }

    /// Records one request to server `server`: its time, the payload bytes
    /// sent, and what came back.
    pub(crate) fn call(
        &self,
        server: u32,
        op: &'static str,
        took: Duration,
        sent: usize,
        out: &std::result::Result<(Reply, bytes::Bytes), RpcError>,
    ) {
        self.timers.record(op, took, out.is_err());
        if let Some(c) = self.sent.get(server as usize) {
            c.increment(sent as u64);
        }
        if let (Ok((_, p)), Some(c)) = (out, self.received.get(server as usize)) {
            c.increment(p.len() as u64);
        }
    }
}
