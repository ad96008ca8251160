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
//!
//! On a mirrored volume a pass also compares copies: copy `r` of the
//! blocks whose first copy this server keeps sits, slot for slot, in the
//! extent file of copy `r` on server `me + r`, so the two extent files'
//! checksum entries must be equal chunk for chunk (a chunk past a file's
//! end counting as zeros). The other server's entries come by
//! `ChunkSums` ([`OtherCopies`]); blocks that still differ when looked at
//! again a second later (a write between copies is normal) are handed to
//! the same reconcile that a revoked writer's blocks go to: under the
//! file's write lease, every copy is rewritten from the first. So copies
//! that differ with both intact — a writer and the inode's owner lost at
//! once, a bug — are found and made equal, not served alternately.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use morris_proto::{FileId, ScrubStatus, WireError};
use parking_lot::Mutex;
use tracing::{info, warn};

use crate::blocks::{sums, Blocks, MAX_REPLICAS};
use crate::store::Store;

/// Scrub rate when none is given: 64 MiB/s.
pub const DEFAULT_RATE: u64 = 64 << 20;

/// Most checksum entries one `ChunkSums` answers (64 MiB of data, a 64 KiB
/// answer).
pub(crate) const SUMS_PAGE: u32 = 16_384;

/// One page of a copy's checksums.
pub(crate) struct Sums {
    /// The extent file's length.
    pub len: u64,
    /// Entries from the chunk asked for, none past `len`.
    pub entries: Vec<u32>,
    /// The server holds units of the file cached from a home.
    pub cached: bool,
}

/// The rest of the volume, as a pass comparing copies sees it.
pub(crate) trait OtherCopies: Send + Sync {
    /// This server's index, the servers in the volume, copies of each block.
    fn layout(&self) -> Option<morris_proto::layout::Layout>;
    /// This server's index.
    fn me(&self) -> u32;
    /// Server `server`'s checksums of copy `replica` of `id` from chunk
    /// `first` on (at most [`SUMS_PAGE`]).
    fn sums(&self, server: u32, id: FileId, replica: u8, first: u64) -> Result<Sums, WireError>;
    /// This server's checksums of its first copy of `id`, likewise.
    fn local(&self, id: FileId, first: u64) -> Result<Sums, WireError>;
    /// Blocks `first..=last` of `id` have copies that differ: make them equal.
    fn diverged(&self, id: FileId, first: u64, last: u64);
}

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
        others: Arc<dyn OtherCopies>,
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
                // A pass that panics still ends (and says so): `morris
                // scrub` waits for every pass to stop running.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    me.pass(&blocks, &store, copies, others.as_ref(), rate)
                }))
                .unwrap_or_else(|_| {
                    Err(WireError::new(
                        morris_proto::ErrorCode::Io,
                        "the scrub pass failed unexpectedly (see the log)",
                    ))
                });
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
                            diverged_blocks = st.diverged_blocks,
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
        others: &dyn OtherCopies,
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
            if copies > 1 {
                self.compare_copies(others, id, copies);
            }
            self.status.lock().files_done += 1;
            if self.stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Compares this server's first copy of `id`'s blocks with every other
    /// copy; hands blocks that differ twice, a second apart, to reconcile.
    fn compare_copies(&self, others: &dyn OtherCopies, id: FileId, copies: u8) {
        let Some(layout) = others.layout() else {
            return;
        };
        let me = others.me();
        for r in 1..copies.min(MAX_REPLICAS) {
            let server = (me + u32::from(r)) % layout.servers.max(1);
            let look = || {
                differing_blocks(
                    |first| others.local(id, first),
                    |first| others.sums(server, id, r, first),
                    |chunk| {
                        let at = layout.global_of_local(id, me, chunk * sums::CHUNK);
                        layout.block_of(at).0
                    },
                )
            };
            let found = look().and_then(|first| match first {
                Differ::Blocks(ref b) if b.is_empty() => Ok(first),
                _ => {
                    // A write goes to one copy, then the next: look again.
                    std::thread::sleep(Duration::from_secs(1));
                    Ok(first.and(look()?))
                }
            });
            let ranges: Vec<(u64, u64)> = match found {
                Ok(Differ::Blocks(b)) => b.into_iter().map(|i| (i, i)).collect(),
                Ok(Differ::Many) => vec![(1, u64::MAX)],
                Err(e) => {
                    warn!(id, copy = r, server, error = %e, "scrub: cannot compare copies");
                    continue;
                }
            };
            for &(first, last) in &ranges {
                warn!(
                    id,
                    first,
                    last,
                    copy = r,
                    server,
                    "scrub: a block's copies differ (both intact); making them equal from the first copy"
                );
                others.diverged(id, first, last);
            }
            self.status.lock().diverged_blocks += ranges
                .iter()
                .map(|&(a, b)| if b == u64::MAX { 1 } else { b - a + 1 })
                .sum::<u64>();
        }
    }
}

/// Most differing blocks a comparison lists one by one; past that, the
/// whole file is made equal.
const MAX_LISTED: usize = 65_536;

/// What comparing two copies found.
#[derive(Debug, PartialEq, Eq)]
enum Differ {
    /// These blocks (ascending; none if the copies match or the file is
    /// cached from a home, whose copies may differ by design).
    Blocks(Vec<u64>),
    /// More than [`MAX_LISTED`] blocks.
    Many,
}

impl Differ {
    /// What both looks found.
    fn and(self, again: Differ) -> Differ {
        match (self, again) {
            (Differ::Blocks(a), Differ::Blocks(b)) => Differ::Blocks(
                a.into_iter()
                    .filter(|x| b.binary_search(x).is_ok())
                    .collect(),
            ),
            (Differ::Blocks(a), Differ::Many) | (Differ::Many, Differ::Blocks(a)) => {
                Differ::Blocks(a)
            }
            (Differ::Many, Differ::Many) => Differ::Many,
        }
    }
}

/// Compares two copies' checksums page by page (`local` and `remote` each
/// answer the page from a chunk on); `block_of` names the block a chunk
/// of the extent file belongs to. A chunk past a copy's end counts as
/// zeros (entry 0). Memory: two pages and the list.
fn differing_blocks(
    mut local: impl FnMut(u64) -> Result<Sums, WireError>,
    mut remote: impl FnMut(u64) -> Result<Sums, WireError>,
    block_of: impl Fn(u64) -> u64,
) -> Result<Differ, WireError> {
    let mut blocks: Vec<u64> = Vec::new();
    let mut first = 0u64;
    loop {
        let (a, b) = (local(first)?, remote(first)?);
        if a.cached || b.cached {
            return Ok(Differ::Blocks(Vec::new()));
        }
        let end = a.len.max(b.len).div_ceil(sums::CHUNK);
        if first >= end {
            return Ok(Differ::Blocks(blocks));
        }
        // Entries answered this time; a page ends where the shorter ends.
        let n = a.entries.len().max(b.entries.len()).max(1) as u64;
        let at = |s: &Sums, i: usize| s.entries.get(i).copied().unwrap_or(0);
        for i in 0..n as usize {
            if at(&a, i) != at(&b, i) {
                let block = block_of(first + i as u64);
                if blocks.last() != Some(&block) {
                    if blocks.len() == MAX_LISTED {
                        return Ok(Differ::Many);
                    }
                    blocks.push(block);
                }
            }
        }
        first += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy as pages of at most `page` entries.
    fn pages(
        len: u64,
        entries: Vec<u32>,
        page: usize,
    ) -> impl FnMut(u64) -> Result<Sums, WireError> {
        move |first| {
            let f = (first as usize).min(entries.len());
            Ok(Sums {
                len,
                entries: entries[f..(f + page).min(entries.len())].to_vec(),
                cached: false,
            })
        }
    }

    #[test]
    fn copies_differ_where_their_entries_do_past_ends_counting_as_zeros() {
        let same = |c| c; // one chunk per block
        let a = || pages(3 * 4096, vec![1, 0, 7], 2);
        let found = differing_blocks(a(), a(), same).unwrap();
        assert_eq!(found, Differ::Blocks(vec![]));
        // Longer, with zeros past the other's end: the same data.
        let b = pages(5 * 4096, vec![1, 0, 7, 0, 0], 2);
        assert_eq!(
            differing_blocks(a(), b, same).unwrap(),
            Differ::Blocks(vec![])
        );
        let c = || pages(5 * 4096, vec![1, 2, 7, 0, 9], 2);
        assert_eq!(
            differing_blocks(a(), c(), same).unwrap(),
            Differ::Blocks(vec![1, 4])
        );
        assert_eq!(
            differing_blocks(pages(0, vec![], 2), c(), same).unwrap(),
            Differ::Blocks(vec![0, 1, 2, 4])
        );
        // Chunks map to blocks; a block is listed once.
        let d = pages(4 * 4096, vec![9, 9, 9, 9], 3);
        assert_eq!(
            differing_blocks(pages(0, vec![], 3), d, |c| c / 2 + 1).unwrap(),
            Differ::Blocks(vec![1, 2])
        );
    }

    #[test]
    fn a_cached_file_is_not_compared_and_too_many_blocks_mean_the_whole_file() {
        let cached = |_| {
            Ok(Sums {
                len: 4096,
                entries: vec![5],
                cached: true,
            })
        };
        let one = pages(4096, vec![6], 1);
        assert_eq!(
            differing_blocks(cached, one, |c| c).unwrap(),
            Differ::Blocks(vec![])
        );
        let n = MAX_LISTED + 1;
        let all = pages(n as u64 * 4096, vec![1; n], SUMS_PAGE as usize);
        let none = pages(0, vec![], SUMS_PAGE as usize);
        assert_eq!(differing_blocks(none, all, |c| c).unwrap(), Differ::Many);
        assert_eq!(
            Differ::Blocks(vec![1, 3, 5]).and(Differ::Blocks(vec![3, 4, 5])),
            Differ::Blocks(vec![3, 5])
        );
        assert_eq!(
            Differ::Many.and(Differ::Blocks(vec![2])),
            Differ::Blocks(vec![2])
        );
        assert_eq!(Differ::Many.and(Differ::Many), Differ::Many);
    }
}
