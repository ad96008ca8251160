//! File ids set aside for this client ahead of its creates.
//!
//! A create that must wait for its inode's server to hand out an id
//! (`CreateInode`) costs a server round trip before it can answer. A mount
//! instead asks each server now and then for a batch of ids of its
//! metadata range (`ReserveIds`, durable at the server before it answers,
//! so no id is ever given twice), and a create takes one: it answers at
//! once and stores the inode with that id afterwards (`CreateInodeAt`,
//! then the name's `Link`: `fs.rs` `make`, docs/architecture.md "Creates
//! with reserved ids"). Ids left unused when the client goes are simply
//! never used (ids are 64-bit).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use morris_proto::FileId;
use parking_lot::Mutex;

/// Ids asked for at a time, per server.
pub(crate) const BATCH: u32 = 256;
/// Fewer left than this at a server: ask it for the next batch.
const LOW: usize = 64;

/// The ids this client holds, per server (each server's own range).
pub(crate) struct Ids {
    free: Mutex<Vec<VecDeque<FileId>>>,
    asking: Vec<AtomicBool>,
}

impl Ids {
    /// No ids yet, for `servers` servers.
    pub(crate) fn new(servers: u32) -> Self {
        Ids {
            free: Mutex::new((0..servers).map(|_| VecDeque::new()).collect()),
            asking: (0..servers).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// One id of server `s`'s range, if one is left; and whether a new
    /// batch should be asked for now (this caller then asks and calls
    /// [`Ids::asked`]).
    pub(crate) fn take(&self, s: u32) -> (Option<FileId>, bool) {
        let (id, left) = {
            let mut free = self.free.lock();
            match free.get_mut(s as usize) {
                Some(q) => (q.pop_front(), q.len()),
                None => return (None, false),
            }
        };
        let ask = left < LOW
            && self.asking.get(s as usize).is_some_and(|a| {
                a.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            });
        (id, ask)
    }

    /// The answer to a batch asked of server `s` (`None`: it failed).
    pub(crate) fn asked(&self, s: u32, ids: Option<Vec<FileId>>) {
        if let Some(ids) = ids {
            if let Some(q) = self.free.lock().get_mut(s as usize) {
                q.extend(ids);
            }
        }
        if let Some(a) = self.asking.get(s as usize) {
            a.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_batch_asked_at_a_time_and_each_id_taken_once() {
        let ids = Ids::new(2);
        // Empty: the first taker asks, the next does not ask again.
        assert_eq!(ids.take(0), (None, true));
        assert_eq!(ids.take(0), (None, false));
        ids.asked(0, Some((100..200).collect()));
        let mut got = Vec::new();
        for _ in 0..100 {
            let (id, ask) = ids.take(0);
            got.push(id.unwrap_or(0));
            // Running low (fewer than LOW left) asks once.
            if ask {
                ids.asked(0, None);
            }
        }
        assert_eq!(got, (100..200).collect::<Vec<_>>());
        assert_eq!(ids.take(0).0, None);
        // Another server's ids are its own; an unknown server has none.
        assert_eq!(ids.take(1), (None, true));
        assert_eq!(ids.take(7), (None, false));
    }
}
