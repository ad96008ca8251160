//! Waits that take suspiciously long are logged with what they wait for.
//!
//! A request of a mount or gateway that waits for a lease, for another
//! request's use of one, or for a directory lock longer than [`SLOW`] is
//! either held up by another client (which a recall settles within a lease
//! time) or stuck; either way the log says which inode and what for, so
//! that an operator (or a test) sees where a stall sits.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long a wait may take before it is logged.
pub(crate) const SLOW: Duration = Duration::from_secs(15);

/// Runs `fut`; if it has not finished after [`SLOW`], logs `what` and
/// logs again when it finishes.
pub(crate) async fn watch<F: Future>(what: impl FnOnce() -> String, fut: F) -> F::Output {
    let start = Instant::now();
    tokio::pin!(fut);
    match tokio::time::timeout(SLOW, &mut fut).await {
        Ok(v) => v,
        Err(_) => {
            let what = what();
            tracing::warn!(waiting_s = SLOW.as_secs(), "slow wait: {what}");
            let v = fut.await;
            tracing::warn!(
                waited_ms = start.elapsed().as_millis() as u64,
                "slow wait over: {what}"
            );
            v
        }
    }
}
