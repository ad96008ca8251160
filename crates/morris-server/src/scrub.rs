//! Scrubbing: reading every chunk this server keeps and checking it against
//! its checksum, slowly, so that bit rot is found (and repaired from another
//! copy) before a reader needs the data.
//!
//! A pass lists the extent files (the store's record of them), adds up
//! their allocated bytes for the progress figures, then checks each copy's
//! extent file in 1 MiB pieces ([`Blocks::verify_file`]), sleeping between
//! pieces to stay under the pass's rate. Chunks that fail are noted for
//! repair exactly as a read that finds them ([`Blocks::take_damage`]). One
//! pass at a time, in a thread of its own; `morris scrub` starts one, and
//! a server started with a scrub interval starts one when the last
//! complete pass (kept in `blocks/SCRUBBED`) is that old.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use morris_proto::{FileId, ScrubStatus, WireError};
use parking_lot::Mutex;
use tracing::{info, warn};

use crate::blocks::{Blocks, MAX_REPLICAS};
use crate::store::Store;

/// Scrub rate when none is given: 64 MiB/s.
pub const DEFAULT_RATE: u64 = 64 << 20;

/// The scrub state of one server.
pub(crate) struct Scrubber {
    status: Mutex<ScrubStatus>,
    stop: AtomicBool,
    default_rate: u64,
    /// `blocks/SCRUBBED`: when the last complete pass ended.
    stamp: PathBuf,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Scrubber {
    /// A scrubber whose passes run at `default_rate` bytes a second unless
    /// told otherwise; `blocks` is the block directory.
    pub(crate) fn new(blocks: &std::path::Path, default_rate: u64) -> Scrubber {
        let stamp = blocks.join("SCRUBBED");
        let last = std::fs::read_to_string(&stamp)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let last = match last {
            Some(t) => t,
            None => {
                // A new server: its first pass is one interval away.
                let t = now_unix();
                if let Err(e) = std::fs::write(&stamp, format!("{t}\n")) {
                    warn!(error = %e, "cannot note the scrub time");
                }
                t
            }
        };
        Scrubber {
            status: Mutex::new(ScrubStatus {
                last_done_unix: last,
                ..ScrubStatus::default()
            }),
            stop: AtomicBool::new(false),
            default_rate: if default_rate == 0 {
                DEFAULT_RATE
            } else {
                default_rate
            },
            stamp,
        }
    }

    /// The current or last pass.
    pub(crate) fn status(&self) -> ScrubStatus {
        self.status.lock().clone()
    }

    /// Asks the pass that runs to stop.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// True if no pass runs and the last complete one ended at least
    /// `every` ago.
    pub(crate) fn due(&self, every: Duration) -> bool {
        let st = self.status.lock();
        !st.running && now_unix().saturating_sub(st.last_done_unix) >= every.as_secs()
    }

    /// Starts a pass at `rate` bytes a second (0: the default) in a thread
    /// of its own; false if one runs already.
    pub(crate) fn start(
        self: &Arc<Self>,
        blocks: Arc<Blocks>,
        store: Arc<Store>,
        copies: u8,
        rate: u64,
    ) -> bool {
        let rate = if rate == 0 { self.default_rate } else { rate };
        {
            let mut st = self.status.lock();
            if st.running {
                return false;
            }
            *st = ScrubStatus {
                running: true,
                passes: st.passes,
                rate,
                last_done_unix: st.last_done_unix,
                ..ScrubStatus::default()
            };
        }
        self.stop.store(false, Ordering::Relaxed);
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("morris-scrub".into())
            .spawn(move || {
                let r = me.pass(&blocks, &store, copies, rate);
                let mut st = me.status.lock();
                st.running = false;
                match r {
                    Ok(true) => {
                        st.passes += 1;
                        st.last_done_unix = now_unix();
                        st.last_error = None;
                        info!(
                            files = st.files_done,
                            bytes = st.bytes_done,
                            bad_chunks = st.bad_chunks,
                            "scrub pass finished"
                        );
                        if let Err(e) =
                            std::fs::write(&me.stamp, format!("{}\n", st.last_done_unix))
                        {
                            warn!(error = %e, "cannot note the scrub time");
                        }
                    }
                    Ok(false) => {
                        st.last_error = Some("stopped".into());
                        info!("scrub pass stopped");
                    }
                    Err(e) => {
                        warn!(error = %e, "scrub pass failed");
                        st.last_error = Some(e.to_string());
                    }
                }
            });
        if let Err(e) = spawned {
            let mut st = self.status.lock();
            st.running = false;
            st.last_error = Some(format!("cannot start a thread: {e}"));
            return false;
        }
        true
    }

    /// One pass; false if it was stopped.
    fn pass(
        &self,
        blocks: &Blocks,
        store: &Store,
        copies: u8,
        rate: u64,
    ) -> Result<bool, WireError> {
        let mut ids: Vec<FileId> = Vec::new();
        let mut after = 0;
        loop {
            let page = store.scan_data_files(after, 4096)?;
            let Some(&last) = page.last() else { break };
            after = last;
            ids.extend(page);
        }
        let mut total = 0u64;
        for &id in &ids {
            total = total.saturating_add(blocks.allocated(id, copies)?.unwrap_or(0));
        }
        {
            let mut st = self.status.lock();
            st.files_total = ids.len() as u64;
            st.bytes_total = total;
        }
        info!(files = ids.len(), bytes = total, rate, "scrub pass started");
        let started = Instant::now();
        let mut done = 0u64;
        for id in ids {
            for r in 0..copies.min(MAX_REPLICAS) {
                let mut go_on = true;
                let bad = blocks.verify_file(id, r, |n| {
                    done += n;
                    self.status.lock().bytes_done = done;
                    // Ahead of the rate: wait until it is met again.
                    let due = Duration::from_secs_f64(done as f64 / rate.max(1) as f64);
                    if let Some(wait) = due.checked_sub(started.elapsed()) {
                        std::thread::sleep(wait);
                    }
                    go_on = !self.stop.load(Ordering::Relaxed);
                    go_on
                });
                let bad = match bad {
                    Ok(b) => b,
                    // Deleted meanwhile, or unreadable: note it and go on.
                    Err(e) => {
                        warn!(id, copy = r, error = %e, "scrub: cannot check a file");
                        0
                    }
                };
                self.status.lock().bad_chunks += bad;
                if !go_on {
                    return Ok(false);
                }
            }
            self.status.lock().files_done += 1;
            if self.stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
