//! How busy this server's block I/O is: requests in flight and a moving
//! average of how long reads and writes take to serve. Reported by
//! `Status` so that an operator (`morris status`) sees a hot spot: a disk
//! loaded by another program shows as long service times on one server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Weight of the newest sample in the moving averages: 1/8.
const EWMA_SHIFT: u32 = 3;

/// Block I/O load counters of one server.
#[derive(Debug, Default)]
pub(crate) struct Load {
    inflight: AtomicU64,
    read_ns: AtomicU64,
    write_ns: AtomicU64,
}

/// Which kind of block request a sample is for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum IoKind {
    Read,
    Write,
}

/// One block request being served; records its service time when dropped.
pub(crate) struct InFlight<'a> {
    load: &'a Load,
    kind: IoKind,
    start: Instant,
}

impl Load {
    /// Counts a block request from now until the returned guard is dropped.
    pub(crate) fn begin(&self, kind: IoKind) -> InFlight<'_> {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            load: self,
            kind,
            start: Instant::now(),
        }
    }

    /// Block requests being served now.
    pub(crate) fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Moving averages of read and write service times, in microseconds.
    pub(crate) fn service_us(&self) -> (u64, u64) {
        (
            self.read_ns.load(Ordering::Relaxed) / 1000,
            self.write_ns.load(Ordering::Relaxed) / 1000,
        )
    }
}

fn ewma(avg: &AtomicU64, sample: u64) {
    let _ = avg.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        if old == 0 {
            return Some(sample);
        }
        let next = if sample >= old {
            old + ((sample - old) >> EWMA_SHIFT)
        } else {
            old - ((old - sample) >> EWMA_SHIFT)
        };
        Some(next)
    });
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        match self.kind {
            IoKind::Read => ewma(&self.load.read_ns, ns),
            IoKind::Write => ewma(&self.load.write_ns, ns),
        }
        self.load.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_follow_samples_and_inflight_counts() {
        let l = Load::default();
        {
            let _a = l.begin(IoKind::Read);
            let _b = l.begin(IoKind::Write);
            assert_eq!(l.inflight(), 2);
        }
        assert_eq!(l.inflight(), 0);
        let avg = AtomicU64::new(0);
        ewma(&avg, 8000);
        assert_eq!(avg.load(Ordering::Relaxed), 8000);
        for _ in 0..100 {
            ewma(&avg, 16_000);
        }
        let v = avg.load(Ordering::Relaxed);
        assert!((15_900..=16_000).contains(&v), "{v}");
        for _ in 0..100 {
            ewma(&avg, 0);
        }
        assert!(avg.load(Ordering::Relaxed) < 100);
    }
}
