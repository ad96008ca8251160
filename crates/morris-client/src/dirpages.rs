//! Listing pages read ahead: a directory listed in small steps (FUSE asks
//! for a few dozen entries at a time, as many as fit the kernel's buffer)
//! is read from its server in big pages, and the rest of a page answers
//! the next steps.
//!
//! A stashed page is used only under the very lease it was read under (same
//! lease generation) and only if this client changed nothing in the
//! directory since (same change count), continuing exactly where the last
//! answer stopped: another client's change recalls the lease first, so a
//! stashed page is never older than what a fresh request would return.
//!
//! The end of a listing is kept the same way: the kernel asks once more
//! after the last entries (an empty answer is how it learns the end), and
//! that answer needs no request.

use std::collections::{HashMap, VecDeque};

use morris_proto::{DirEntry, FileId};
use parking_lot::Mutex;

/// Entries asked of the server per listing request.
pub(crate) const PAGE: u32 = 4096;
/// Directories whose next page is kept at most.
const KEEP: usize = 256;

/// The rest of one page of one directory's listing.
struct Stash {
    /// The cookie the next step starts after.
    after: u64,
    /// The lease generation and change count it was read under.
    generation: u64,
    version: u64,
    entries: VecDeque<DirEntry>,
    /// The server said the listing ends with these entries.
    eof: bool,
}

impl Stash {
    /// Nothing after `after`: the listing's end.
    fn end(after: u64, generation: u64, version: u64) -> Stash {
        Stash {
            after,
            generation,
            version,
            entries: VecDeque::new(),
            eof: true,
        }
    }
}

/// Pages read ahead, per directory.
#[derive(Default)]
pub(crate) struct DirPages {
    map: Mutex<HashMap<FileId, Stash>>,
}

impl DirPages {
    /// Up to `max` entries after `cookie` from the stash of `dir`, if one
    /// continues there under `(generation, version)`; with whether the
    /// listing ends after them.
    pub(crate) fn take(
        &self,
        dir: FileId,
        cookie: u64,
        generation: u64,
        version: u64,
        max: usize,
    ) -> Option<(Vec<DirEntry>, bool)> {
        let mut map = self.map.lock();
        let s = map.remove(&dir)?;
        if s.after != cookie || s.generation != generation || s.version != version {
            return None;
        }
        let mut rest = s.entries;
        let now: Vec<DirEntry> = rest.drain(..max.min(rest.len())).collect();
        let after = now.last().map_or(cookie, |e| e.cookie);
        if rest.is_empty() {
            if s.eof && !now.is_empty() {
                map.insert(dir, Stash::end(after, generation, version));
            }
            return Some((now, s.eof));
        }
        map.insert(
            dir,
            Stash {
                after,
                generation,
                version,
                entries: rest,
                eof: s.eof,
            },
        );
        Some((now, false))
    }

    /// Splits a page read from the server: the first `max` entries are
    /// returned (with whether the listing ends after them), the rest kept.
    pub(crate) fn split(
        &self,
        dir: FileId,
        page: Vec<DirEntry>,
        eof: bool,
        generation: u64,
        version: u64,
        max: usize,
    ) -> (Vec<DirEntry>, bool) {
        if page.len() <= max {
            let mut map = self.map.lock();
            match page.last() {
                Some(last) if eof => {
                    if map.len() >= KEEP {
                        map.clear();
                    }
                    map.insert(dir, Stash::end(last.cookie, generation, version));
                }
                _ => {
                    map.remove(&dir);
                }
            }
            return (page, eof);
        }
        let mut rest: VecDeque<DirEntry> = page.into();
        let now: Vec<DirEntry> = rest.drain(..max).collect();
        let after = now.last().map_or(0, |e| e.cookie);
        let mut map = self.map.lock();
        if map.len() >= KEEP {
            map.clear();
        }
        map.insert(
            dir,
            Stash {
                after,
                generation,
                version,
                entries: rest,
                eof,
            },
        );
        (now, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use morris_proto::{FileKind, Handle};

    fn e(c: u64) -> DirEntry {
        DirEntry {
            name: format!("n{c}").into_bytes(),
            child: Handle { id: c, gen: 1 },
            kind: FileKind::File,
            cookie: c,
        }
    }

    #[test]
    fn pages_continue_only_where_and_under_what_they_were_read() {
        let p = DirPages::default();
        let page: Vec<DirEntry> = (1..=10).map(e).collect();
        let (now, eof) = p.split(7, page, true, 3, 0, 4);
        assert_eq!((now.len(), eof), (4, false));
        // Elsewhere, or under another lease or after a change: nothing.
        assert!(p.take(7, 3, 3, 0, 4).is_none());
        let page: Vec<DirEntry> = (1..=10).map(e).collect();
        p.split(7, page, true, 3, 0, 4);
        assert!(p.take(7, 4, 4, 0, 4).is_none());
        let page: Vec<DirEntry> = (1..=10).map(e).collect();
        p.split(7, page, true, 3, 0, 4);
        assert!(p.take(7, 4, 3, 1, 4).is_none());
        // Where it stopped: the rest, then the end.
        let page: Vec<DirEntry> = (1..=10).map(e).collect();
        p.split(7, page, true, 3, 0, 4);
        let (now, eof) = p.take(7, 4, 3, 0, 4).unwrap();
        assert_eq!((now[0].cookie, now.len(), eof), (5, 4, false));
        let (now, eof) = p.take(7, 8, 3, 0, 4).unwrap();
        assert_eq!((now[0].cookie, now.len(), eof), (9, 2, true));
        // The kernel's last ask, after the end: answered here, once.
        assert_eq!(p.take(7, 10, 3, 0, 4), Some((Vec::new(), true)));
        assert!(p.take(7, 10, 3, 0, 4).is_none());
    }

    #[test]
    fn the_end_of_a_listing_is_kept_under_its_lease_only() {
        let p = DirPages::default();
        let (now, eof) = p.split(7, (1..=3).map(e).collect(), true, 3, 0, 4);
        assert_eq!((now.len(), eof), (3, true));
        assert!(p.take(7, 3, 3, 1, 4).is_none(), "changed since");
        p.split(7, (1..=3).map(e).collect(), true, 3, 0, 4);
        assert!(p.take(7, 3, 4, 0, 4).is_none(), "another lease");
        p.split(7, (1..=3).map(e).collect(), true, 3, 0, 4);
        assert!(p.take(7, 2, 3, 0, 4).is_none(), "elsewhere");
        p.split(7, (1..=3).map(e).collect(), true, 3, 0, 4);
        assert_eq!(p.take(7, 3, 3, 0, 4), Some((Vec::new(), true)));
        // A page that does not end the listing leaves nothing.
        p.split(7, (1..=3).map(e).collect(), false, 3, 0, 4);
        assert!(p.take(7, 3, 3, 0, 4).is_none());
    }
}
