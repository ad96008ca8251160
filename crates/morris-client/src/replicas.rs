//! Reading a block from one of its copies (volumes with `replicas > 1`).
//!
//! The client keeps, per server, the data requests it has in flight there
//! and a moving average of how long they took. A read goes to the copy
//! whose server scores best (average latency × (1 + requests in flight)),
//! so one sequential reader draws on every server and a server slowed by
//! other work (a hot spot) is read around. A read whose server has answered
//! nothing for much longer than its average (stalled, stopped, cut off) is
//! sent to the next copy as well (a hedged read) and the first answer wins;
//! a server that is merely busy keeps its requests (hedging those would
//! double the traffic of a loaded volume). A copy that fails is read from
//! the next.
//! See docs/architecture.md ("Mirrored blocks").

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use morris_proto::layout::Layout;
use morris_proto::{FileId, StaleCopy};

use crate::pool::Pool;
use crate::{Error, Result};

/// Latency assumed for a server nothing has been read from yet.
const UNKNOWN_NS: u64 = 500_000;
/// A read is hedged once its server has answered nothing for this many
/// times its average latency...
const HEDGE_FACTOR: u64 = 4;
/// ...but never sooner than this, nor later than `HEDGE_MAX`.
const HEDGE_MIN: Duration = Duration::from_millis(20);
const HEDGE_MAX: Duration = Duration::from_millis(1000);
/// A server not heard from for this long is tried again at the assumed
/// latency: a penalty (a stall, a lost race) must not exclude it forever.
const FORGET_AFTER_MS: u64 = 1000;

#[derive(Default)]
struct ServerLoad {
    inflight: AtomicU32,
    /// Moving average (weight 1/8) of data request latency, ns; 0: none yet.
    ewma_ns: AtomicU64,
    /// When `ewma_ns` last changed, ms since `Loads::start`.
    updated_ms: AtomicU64,
    /// When a request to this server last succeeded, ms since `Loads::start`.
    answered_ms: AtomicU64,
    /// What the server last reported on a reply: block requests it was
    /// serving (every client's) and its read service time, ns; and when.
    reported_queue: AtomicU32,
    reported_service_ns: AtomicU64,
    reported_ms: AtomicU64,
}

/// What this client sees of each server's data load.
pub(crate) struct Loads {
    servers: Vec<ServerLoad>,
    start: Instant,
}

/// One data request in flight at a server; records its latency when done.
pub(crate) struct Busy<'a> {
    load: &'a ServerLoad,
    loads: &'a Loads,
    start: Instant,
    done: bool,
}

impl Busy<'_> {
    /// Adds this request's latency so far to its server's average.
    fn sample(&self) -> u64 {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .load
            .ewma_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 { ns } else { old - old / 8 + ns / 8 })
            });
        let now = self.loads.now_ms();
        self.load.updated_ms.store(now, Ordering::Relaxed);
        now
    }

    /// The request answered: its latency counts in the average.
    pub(crate) fn finish(mut self) {
        let now = self.sample();
        self.load.answered_ms.store(now, Ordering::Relaxed);
        self.done = true;
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if !self.done {
            // Abandoned (a hedge won) or failed: at least this slow, so a
            // stuck server's average grows instead of staying flattering.
            self.sample();
        }
        self.load.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Loads {
    /// Load views of `n` servers.
    pub(crate) fn new(n: u32) -> Self {
        Loads {
            servers: (0..n).map(|_| ServerLoad::default()).collect(),
            start: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn get(&self, s: u32) -> Option<&ServerLoad> {
        self.servers.get(s as usize)
    }

    fn latency_ns(&self, s: u32) -> u64 {
        let Some(l) = self.get(s) else {
            return UNKNOWN_NS;
        };
        match l.ewma_ns.load(Ordering::Relaxed) {
            0 => UNKNOWN_NS,
            ns if self
                .now_ms()
                .saturating_sub(l.updated_ms.load(Ordering::Relaxed))
                > FORGET_AFTER_MS =>
            {
                ns.min(UNKNOWN_NS)
            }
            ns => ns,
        }
    }

    /// Records the load server `s` reported on a reply.
    pub(crate) fn report(&self, s: u32, queue: u32, service_us: u32) {
        if let Some(l) = self.get(s) {
            l.reported_queue.store(queue, Ordering::Relaxed);
            l.reported_service_ns
                .store(u64::from(service_us) * 1000, Ordering::Relaxed);
            l.reported_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// Expected cost of one more request at `s`: latency (this client's
    /// average, or the server's own service time if that is longer) times
    /// (1 + the requests queued there: this client's in flight, or what the
    /// server last reported if more — load other clients put on it).
    fn score(&self, s: u32) -> u64 {
        let Some(l) = self.get(s) else {
            return u64::MAX;
        };
        let own = l.inflight.load(Ordering::Relaxed);
        let fresh = self
            .now_ms()
            .saturating_sub(l.reported_ms.load(Ordering::Relaxed))
            <= FORGET_AFTER_MS
            && l.reported_ms.load(Ordering::Relaxed) > 0;
        let (queue, service) = if fresh {
            (
                own.max(l.reported_queue.load(Ordering::Relaxed)),
                l.reported_service_ns.load(Ordering::Relaxed),
            )
        } else {
            (own, 0)
        };
        self.latency_ns(s)
            .max(service)
            .max(1)
            .saturating_mul(1 + u64::from(queue))
    }

    /// The best server of `candidates` not in `tried`.
    pub(crate) fn pick(&self, candidates: &[(u8, u32)], tried: &[u8]) -> Option<(u8, u32)> {
        candidates
            .iter()
            .filter(|(r, _)| !tried.contains(r))
            .min_by_key(|(_, s)| self.score(*s))
            .copied()
    }

    /// Counts a data request at server `s` until the guard is finished or dropped.
    pub(crate) fn begin(&self, s: u32) -> Option<Busy<'_>> {
        let load = self.get(s)?;
        load.inflight.fetch_add(1, Ordering::Relaxed);
        Some(Busy {
            load,
            loads: self,
            start: Instant::now(),
            done: false,
        })
    }

    /// Whether server `s` has answered nothing for `quiet` (stalled rather
    /// than busy).
    pub(crate) fn silent_for(&self, s: u32, quiet: Duration) -> bool {
        let Some(l) = self.get(s) else {
            return true;
        };
        let quiet_ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
        self.now_ms()
            .saturating_sub(l.answered_ms.load(Ordering::Relaxed))
            >= quiet_ms
    }

    /// How long server `s` may stay silent before a read waiting on it is
    /// asked of another copy too.
    pub(crate) fn hedge_after(&self, s: u32) -> Duration {
        let known = self
            .get(s)
            .is_some_and(|l| l.ewma_ns.load(Ordering::Relaxed) > 0);
        if !known {
            // Nothing measured yet (a new client): be patient rather than
            // double the first burst of reads.
            return HEDGE_MAX;
        }
        Duration::from_nanos(self.latency_ns(s).saturating_mul(HEDGE_FACTOR))
            .clamp(HEDGE_MIN, HEDGE_MAX)
    }
}

/// The copies of block `index` of `id` that hold its current data, as
/// (copy number, server) in placement order: every copy but those a
/// stale-copy record of the file covers.
pub(crate) fn current_copies(
    layout: &Layout,
    stale: &[StaleCopy],
    id: FileId,
    index: u64,
) -> Vec<(u8, u32)> {
    layout
        .placement(id, index)
        .into_iter()
        .enumerate()
        .filter(|(_, s)| !stale.iter().any(|rec| rec.covers(*s, index)))
        .map(|(r, s)| (r as u8, s))
        .collect()
}

/// Reads `len` bytes at `off` of block `index` of `id` from one of `copies`
/// ((copy number, server), see [`current_copies`]), choosing, hedging and
/// failing over as the module describes.
pub(crate) async fn fetch_any(
    pool: Arc<Pool>,
    loads: Arc<Loads>,
    copies: Vec<(u8, u32)>,
    id: FileId,
    index: u64,
    off: u32,
    len: u32,
) -> Result<Bytes> {
    let mut tried: Vec<u8> = Vec::new();
    let mut running = FuturesUnordered::new();
    let mut last_err: Option<Error> = None;
    let start_one = |tried: &mut Vec<u8>| {
        let (r, s) = loads.pick(&copies, tried)?;
        tried.push(r);
        let (pool, loads) = (pool.clone(), loads.clone());
        Some((s, async move {
            let busy = loads.begin(s);
            let out =
                crate::io::fetch_copy(&pool, Some(&loads), s, id, index, r, off, len, true, None)
                    .await;
            if out.is_ok() {
                if let Some(b) = busy {
                    b.finish();
                }
            }
            (s, out)
        }))
    };
    let (mut waiting_on, first) = start_one(&mut tried).ok_or_else(|| {
        Error::new(
            morris_proto::ErrorCode::Io,
            format!("block {index} of file {id} has no current copy"),
        )
    })?;
    let mut hedge_in = loads.hedge_after(waiting_on);
    running.push(first);
    loop {
        let hedge = tokio::time::sleep(hedge_in);
        tokio::select! {
            done = running.next() => match done {
                Some((_, Ok(data))) => return Ok(data),
                Some((s, Err(e))) => {
                    tracing::debug!(server = s, id, index, error = %e, "reading a copy failed; trying another");
                    metrics::counter!("morris_client_read_failovers_total").increment(1);
                    last_err = Some(e);
                    match start_one(&mut tried) {
                        Some((s, f)) => {
                            waiting_on = s;
                            hedge_in = loads.hedge_after(s);
                            running.push(f);
                        }
                        None if running.is_empty() => break,
                        None => {}
                    }
                }
                None => break,
            },
            () = hedge => {
                // Busy but answering: keep waiting. Silent: ask another copy.
                if loads.silent_for(waiting_on, hedge_in) {
                    if let Some((s, f)) = start_one(&mut tried) {
                        tracing::debug!(id, index, stalled = waiting_on, to = s, "hedged read");
                        metrics::counter!("morris_client_hedged_reads_total").increment(1);
                        waiting_on = s;
                        running.push(f);
                    }
                }
                hedge_in = loads.hedge_after(waiting_on);
            }
        }
    }
    // Every copy failed at once: wait for the first current copy's server
    // as a volume without copies would (reconnects, restart grace).
    let Some(&(r, s)) = copies.first() else {
        return Err(last_err.unwrap_or_else(|| Error::new(morris_proto::ErrorCode::Io, "no copy")));
    };
    match crate::io::fetch_copy(&pool, Some(&loads), s, id, index, r, off, len, false, None).await {
        Ok(d) => Ok(d),
        Err(e) => Err(last_err.unwrap_or(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_faster_copy_and_forgets_old_penalties() {
        let l = Loads::new(3);
        let copies = [(0u8, 0u32), (1, 1)];
        // Server 0 answered slowly, server 1 quickly.
        l.servers[0].ewma_ns.store(50_000_000, Ordering::Relaxed);
        l.servers[1].ewma_ns.store(200_000, Ordering::Relaxed);
        assert_eq!(l.pick(&copies, &[]), Some((1, 1)));
        assert_eq!(l.pick(&copies, &[1]), Some((0, 0)));
        assert_eq!(l.pick(&copies, &[0, 1]), None);
        // Requests in flight count against a server.
        let busy: Vec<_> = (0..300).filter_map(|_| l.begin(1)).collect();
        assert_eq!(l.pick(&copies, &[]), Some((0, 0)));
        drop(busy);
        assert_eq!(l.servers[1].inflight.load(Ordering::Relaxed), 0);
        // A penalty not refreshed for a while no longer excludes server 0.
        l.servers[0].updated_ms.store(0, Ordering::Relaxed);
        l.servers[1]
            .ewma_ns
            .store(UNKNOWN_NS * 2, Ordering::Relaxed);
        l.servers[1].updated_ms.store(u64::MAX, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(FORGET_AFTER_MS + 50));
        assert_eq!(l.latency_ns(0), UNKNOWN_NS);
        assert_eq!(l.pick(&copies, &[]), Some((0, 0)));
        // Hedge delays stay within their bounds; unmeasured servers get the longest.
        assert_eq!(l.hedge_after(2), HEDGE_MAX);
        l.servers[2].ewma_ns.store(40_000_000, Ordering::Relaxed);
        l.servers[2].updated_ms.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(l.hedge_after(2), Duration::from_millis(160));
        // Silence: server 2 never answered; server 1 just did.
        assert!(l.silent_for(2, Duration::from_millis(10)) || l.now_ms() < 10);
        l.servers[1]
            .answered_ms
            .store(l.now_ms(), Ordering::Relaxed);
        assert!(!l.silent_for(1, Duration::from_millis(500)));
        l.servers[2].ewma_ns.store(1_000_000_000, Ordering::Relaxed);
        assert_eq!(l.hedge_after(2), HEDGE_MAX);
    }

    #[test]
    fn load_reported_by_servers_counts_against_them() {
        let l = Loads::new(2);
        let copies = [(0u8, 0u32), (1, 1)];
        for s in 0..2 {
            l.servers[s].ewma_ns.store(1_000_000, Ordering::Relaxed);
            l.servers[s].updated_ms.store(u64::MAX, Ordering::Relaxed);
        }
        // Other clients keep server 0's disk busy: it says so on a reply.
        std::thread::sleep(Duration::from_millis(2));
        l.report(0, 6, 500);
        assert_eq!(l.pick(&copies, &[]), Some((1, 1)));
        // A server whose own service time is long loses too.
        l.report(0, 0, 0);
        l.report(1, 0, 40_000);
        assert_eq!(l.pick(&copies, &[]), Some((0, 0)));
        // Reports go stale like latencies: forgotten after a while.
        l.servers[1].reported_ms.store(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(FORGET_AFTER_MS + 20));
        l.servers[0].reported_ms.store(1, Ordering::Relaxed);
        assert_eq!(l.score(0), l.score(1));
    }
}
