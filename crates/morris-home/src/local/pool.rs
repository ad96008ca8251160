//! Bounded, timed blocking calls: every file-system call of a local home runs
//! on tokio's blocking threads, at most `parallel` at once, and its caller
//! waits at most `timeout`.
//!
//! A call that does not return in time (a hung NFS or FUSE mount below the
//! home directory) cannot be cancelled: its thread stays blocked in the
//! kernel. It keeps its permit until it returns, so a hung mount ties up at
//! most `parallel` threads; later callers then wait for a permit, inside the
//! same timeout, and get [`HomeError::Unreachable`] too.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::{HomeError, Result};

/// Runs blocking calls with a bound on their number and on their time.
#[derive(Debug)]
pub(crate) struct Pool {
    permits: Arc<Semaphore>,
    timeout: Duration,
}

impl Pool {
    /// A pool of `parallel` threads (at least one) whose calls may take
    /// `timeout`.
    pub(crate) fn new(parallel: usize, timeout: Duration) -> Self {
        Pool {
            permits: Arc::new(Semaphore::new(parallel.max(1))),
            timeout,
        }
    }

    /// Runs `f` on a blocking thread; `what` names the object it touches,
    /// for the error when it does not answer in time.
    pub(crate) async fn run<T, F>(&self, what: impl FnOnce() -> String, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let permits = self.permits.clone();
        let call = async move {
            let permit = permits
                .acquire_owned()
                .await
                .map_err(|_| HomeError::Io("local home is closed".into()))?;
            let task = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                f()
            });
            match task.await {
                Ok(r) => r,
                Err(e) => Err(HomeError::Io(format!("local home worker failed: {e}"))),
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => {
                let what = what();
                tracing::warn!(%what, timeout = ?self.timeout, "local home call timed out");
                Err(HomeError::Unreachable(format!(
                    "no answer from {what} in {}s",
                    self.timeout.as_secs_f64()
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_that_hangs_is_bounded_and_keeps_its_permit() {
        let pool = Pool::new(1, Duration::from_millis(200));
        let (release, wait) = mpsc::channel::<()>();
        let started = std::time::Instant::now();
        let r = pool
            .run(
                || "/hung/mount".to_string(),
                move || {
                    let _ = wait.recv();
                    Ok(1)
                },
            )
            .await;
        assert_eq!(
            r,
            Err(HomeError::Unreachable(
                "no answer from /hung/mount in 0.2s".into()
            ))
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        // The hung thread still holds the only permit: the next call waits
        // for it, and is bounded too.
        let r = pool.run(|| "/hung/mount".to_string(), || Ok(2)).await;
        assert!(matches!(r, Err(HomeError::Unreachable(_))), "{r:?}");
        // Once the hung call returns, the pool works again.
        let _ = release.send(());
        let mut ok = None;
        for _ in 0..50 {
            match pool.run(|| "/mount".to_string(), || Ok(3)).await {
                Ok(v) => {
                    ok = Some(v);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        assert_eq!(ok, Some(3));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_than_parallel_calls_run_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let pool = Arc::new(Pool::new(3, Duration::from_secs(10)));
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let (pool, now, most) = (pool.clone(), now.clone(), most.clone());
            set.spawn(async move {
                pool.run(String::new, move || {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(10));
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                })
                .await
            });
        }
        while let Some(r) = set.join_next().await {
            assert!(matches!(r, Ok(Ok(()))));
        }
        assert!(most.load(Ordering::SeqCst) <= 3);
    }
}
