//! Listing pages read ahead: a directory listed in small steps (FUSE asks
//! for a few dozen entries at a time, as many as fit the kernel's buffer)
//! is read from its server in big pages, and the rest of a page answers
//! the next steps.
//!
//! A stashed page is used only under the very lease it was read under (same
//! lease generation) and only if this client changed nothing in the
//! directory since (same change count), continuing after the cookie the
//! page was read after or after any of its entries (the NFS gateway answers
//! fewer entries than it asked for, as many as the client's reply holds,
//! and continues from the last one it sent): another client's change
//! recalls the lease first, so a stashed page is never older than what a
//! fresh request would return.
//!
//! The end of a listing is kept the same way: the kernel asks once more
//! after the last entries (an empty answer is how it learns the end), and
//! that answer needs no request.

use std::collections::HashMap;

use morris_proto::{DirEntry, FileId};
use parking_lot::Mutex;

/// Entries asked of the server per listing request.
pub(crate) const PAGE: u32 = 4096;
/// Directories whose last page is kept at most.
const KEEP: usize = 256;

/// One page of one directory's listing.
struct Stash {
    /// The cookie the page was read after.
    from: u64,
    /// The lease generation and change count it was read under.
    generation: u64,
    version: u64,
    /// Its entries, in cookie order.
    entries: Vec<DirEntry>,
    /// The server said the listing ends with these entries.
    eof: bool,
}

/// Pages read ahead, per directory.
#[derive(Default)]
pub(crate) struct DirPages {
    map: Mutex<HashMap<FileId, Stash>>,
}

impl DirPages {
    /// Up to `max` entries after `cookie` from the stash of `dir`, if one
    /// was read under `(generation, version)` and holds what follows
    /// `cookie`; with whether the listing ends after them.
    pub(crate) fn take(
        &self,
        dir: FileId,
        cookie: u64,
        generation: u64,
        version: u64,
        max: usize,
    ) -> Option<(Vec<DirEntry>, bool)> {
        let mut map = self.map.lock();
        let s = map.get(&dir)?;
        if s.generation != generation || s.version != version {
            map.remove(&dir);
            return None;
        }
        let at = if cookie == s.from {
            0
        } else {
            s.entries.binary_search_by_key(&cookie, |e| e.cookie).ok()? + 1
        };
        let end = (at + max).min(s.entries.len());
        if at == end {
            // After the last entry: the end (answered once), or the next
            // page's business.
            let eof = s.eof;
            map.remove(&dir);
            return eof.then(|| (Vec::new(), true));
        }
        let now = s.entries[at..end].to_vec();
        Some((now, s.eof && end == s.entries.len()))
    }

    /// Splits `page`, read from the server after `from`: the first `max`
    /// entries are returned (with whether the listing ends after them),
    /// the page kept for the next steps.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn split(
        &self,
        dir: FileId,
        from: u64,
        page: Vec<DirEntry>,
        eof: bool,
        generation: u64,
        version: u64,
        max: usize,
    ) -> (Vec<DirEntry>, bool) {
        let mut map = self.map.lock();
        if page.len() <= max && (!eof || page.is_empty()) {
            map.remove(&dir);
            return (page, eof);
        }
        let now: Vec<DirEntry> = page[..max.min(page.len())].to_vec();
        let done = eof && now.len() == page.len();
        if map.len() >= KEEP {
            map.clear();
        }
        map.insert(
            dir,
            Stash {
                from,
                generation,
                version,
                entries: page,
                eof,
            },
        );
        (now, done)
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
        let page = || (1..=10).map(e).collect::<Vec<_>>();
        let (now, eof) = p.split(7, 0, page(), true, 3, 0, 4);
        assert_eq!((now.len(), eof), (4, false));
        // Elsewhere, or under another lease or after a change: nothing.
        assert!(p.take(7, 42, 3, 0, 4).is_none());
        p.split(7, 0, page(), true, 3, 0, 4);
        assert!(p.take(7, 4, 4, 0, 4).is_none());
        p.split(7, 0, page(), true, 3, 0, 4);
        assert!(p.take(7, 4, 3, 1, 4).is_none());
        // Where it stopped: the rest, then the end.
        p.split(7, 0, page(), true, 3, 0, 4);
        let (now, eof) = p.take(7, 4, 3, 0, 4).unwrap();
        assert_eq!((now[0].cookie, now.len(), eof), (5, 4, false));
        // Or after fewer than it was given (the NFS gateway), or from the
        // page's start again.
        let (now, eof) = p.take(7, 6, 3, 0, 2).unwrap();
        assert_eq!((now[0].cookie, now.len(), eof), (7, 2, false));
        let (now, _) = p.take(7, 0, 3, 0, 1).unwrap();
        assert_eq!(now[0].cookie, 1);
        let (now, eof) = p.take(7, 8, 3, 0, 4).unwrap();
        assert_eq!((now[0].cookie, now.len(), eof), (9, 2, true));
        // The kernel's last ask, after the end: answered here, once.
        assert_eq!(p.take(7, 10, 3, 0, 4), Some((Vec::new(), true)));
        assert!(p.take(7, 10, 3, 0, 4).is_none());
        // A page that does not end the listing: its last entry is the
        // next page's start.
        p.split(7, 0, page(), false, 3, 0, 4);
        assert!(p.take(7, 10, 3, 0, 4).is_none());
    }

    #[test]
    fn the_end_of_a_listing_is_kept_under_its_lease_only() {
        let p = DirPages::default();
        let page = || (1..=3).map(e).collect::<Vec<_>>();
        let (now, eof) = p.split(7, 0, page(), true, 3, 0, 4);
        assert_eq!((now.len(), eof), (3, true));
        assert!(p.take(7, 3, 3, 1, 4).is_none(), "changed since");
        p.split(7, 0, page(), true, 3, 0, 4);
        assert!(p.take(7, 3, 4, 0, 4).is_none(), "another lease");
        p.split(7, 0, page(), true, 3, 0, 4);
        assert!(p.take(7, 42, 3, 0, 4).is_none(), "elsewhere");
        p.split(7, 0, page(), true, 3, 0, 4);
        assert_eq!(p.take(7, 3, 3, 0, 4), Some((Vec::new(), true)));
        // A page that does not end the listing leaves nothing.
        p.split(7, 0, page(), false, 3, 0, 4);
        assert!(p.take(7, 3, 3, 0, 4).is_none());
    }
}
