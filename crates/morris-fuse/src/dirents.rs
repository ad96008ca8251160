//! Directory listing: how FUSE readdir offsets map to morris cookies.
//!
//! # Offset scheme
//!
//! The kernel starts a listing at offset 0 and, to continue, passes back the
//! offset stored with the last entry it consumed. Offsets are the positions
//! of `morris_client::listing` (shared with the NFS gateway's cookies):
//! 1 after `.`, 2 after `..`, `c + 2` after the entry with cookie `c`; every
//! offset decodes on its own, so the listing is stateless here. A cookie
//! that cannot be encoded fails the listing with `EIO`.
//! Entries with names the kernel would reject (empty, `.`, `..`, longer than
//! 255 bytes, containing `/` or NUL) are skipped with a warning instead of
//! failing the whole directory.

use std::future::Future;

use fuser::{Errno, FileType, INodeNo, ReplyDirectory};
use morris_client::{DirEntry, Error, FileId};
use morris_proto::MAX_NAME_LEN;

use crate::attr::file_type;
use crate::errno::fail;

pub(crate) use morris_client::listing::{
    entry_position as entry_offset, resume, AFTER_DOT, AFTER_DOTDOT,
};

/// How many entries to ask the client for per round trip. A kernel readdir
/// buffer (one or a few pages) holds roughly this many typical entries.
pub(crate) const BATCH: u32 = 128;

/// Whether the kernel accepts `name` as a directory entry name.
pub(crate) fn valid_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name != b"."
        && name != b".."
        && !name.contains(&b'/')
        && !name.contains(&0)
}

/// What a listing's fetch returns per entry: the entry itself
/// ([`DirEntry`], for readdir), or with what more the sink needs (for
/// readdirplus, its inode).
pub(crate) trait Listed {
    /// The directory entry.
    fn entry(&self) -> &DirEntry;
}

impl Listed for DirEntry {
    fn entry(&self) -> &DirEntry {
        self
    }
}

impl<X> Listed for (DirEntry, X) {
    fn entry(&self) -> &DirEntry {
        &self.0
    }
}

/// Somewhere to put directory entries: the kernel's reply buffer, or a test
/// double. `add` returns `true` when the entry did not fit (and was not added).
pub(crate) trait DirSink<T> {
    /// Adds one entry (`item`: what the fetch returned for it; `None` for
    /// `.` and `..`); `true` means the buffer is full.
    fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &[u8], item: Option<&T>)
        -> bool;

    /// Whether another entry could be added: a sink that takes no more
    /// ends the listing's reply before the next batch is fetched.
    fn takes_more(&self) -> bool {
        true
    }
}

impl DirSink<DirEntry> for ReplyDirectory {
    fn add(
        &mut self,
        ino: u64,
        offset: u64,
        kind: FileType,
        name: &[u8],
        _item: Option<&DirEntry>,
    ) -> bool {
        use std::os::unix::ffi::OsStrExt;
        ReplyDirectory::add(
            self,
            INodeNo(ino),
            offset,
            kind,
            std::ffi::OsStr::from_bytes(name),
        )
    }
}

/// Fills `sink` with the listing of `dir` from FUSE offset `offset`.
///
/// `parent` is the id reported for `..` (needed only when `resume(offset)`
/// still lists `..`). `fetch(cookie, max)` lists the client's entries after
/// `cookie`, returning them and whether the listing is complete. Stops when
/// the sink is full or the directory is exhausted; either way the caller
/// replies with what the sink holds (an empty reply means end of directory).
pub(crate) async fn fill<T, S, F, Fut>(
    sink: &mut S,
    dir: FileId,
    parent: FileId,
    offset: u64,
    mut fetch: F,
) -> Result<(), Errno>
where
    T: Listed,
    S: DirSink<T>,
    F: FnMut(u64, u32) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, bool), Error>>,
{
    let start = resume(offset);
    if start.dot && sink.add(dir, AFTER_DOT, FileType::Directory, b".", None) {
        return Ok(());
    }
    if start.dotdot && sink.add(parent, AFTER_DOTDOT, FileType::Directory, b"..", None) {
        return Ok(());
    }
    let mut cursor = start.cookie;
    let mut added_any = start.dot || start.dotdot;
    loop {
        let (entries, complete) = fetch(cursor, BATCH)
            .await
            .map_err(|e| fail("readdir", dir, &e))?;
        if entries.is_empty() {
            if complete || added_any {
                // Either the end, or a server that returned nothing without
                // being done: reply with what we have; the kernel asks again.
                return Ok(());
            }
            tracing::warn!(
                dir,
                cookie = cursor,
                "readdir: empty, incomplete batch from the client"
            );
            return Err(Errno::EIO);
        }
        for item in &entries {
            let entry = item.entry();
            if entry.cookie <= cursor {
                tracing::warn!(
                    dir,
                    cookie = entry.cookie,
                    after = cursor,
                    "readdir: cookie out of order"
                );
                return Err(Errno::EIO);
            }
            let Some(off) = entry_offset(entry.cookie) else {
                tracing::warn!(
                    dir,
                    cookie = entry.cookie,
                    "readdir: cookie too large to encode"
                );
                return Err(Errno::EIO);
            };
            if !valid_name(&entry.name) {
                tracing::warn!(dir, cookie = entry.cookie, name = ?String::from_utf8_lossy(&entry.name), "readdir: skipping entry with an invalid name");
                cursor = entry.cookie;
                continue;
            }
            if sink.add(
                entry.child.id,
                off,
                file_type(entry.kind),
                &entry.name,
                Some(item),
            ) {
                return Ok(());
            }
            added_any = true;
            cursor = entry.cookie;
        }
        if complete || !sink.takes_more() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use morris_client::{FileKind, Handle};

    use super::*;
    use crate::errno::errno;

    /// What the fake client answers to one readdir.
    type Answer = std::future::Ready<Result<(Vec<DirEntry>, bool), Error>>;

    /// A reply buffer that holds `cap` entries.
    struct Sink {
        cap: usize,
        got: Vec<(u64, u64, Vec<u8>)>,
    }

    impl DirSink<DirEntry> for Sink {
        fn add(
            &mut self,
            ino: u64,
            offset: u64,
            _kind: FileType,
            name: &[u8],
            _item: Option<&DirEntry>,
        ) -> bool {
            if self.got.len() == self.cap {
                return true;
            }
            self.got.push((ino, offset, name.to_vec()));
            false
        }
    }

    fn entry(name: &str, id: u64, cookie: u64) -> DirEntry {
        DirEntry {
            name: name.as_bytes().to_vec(),
            child: Handle { id, gen: 1 },
            kind: FileKind::File,
            cookie,
        }
    }

    /// A directory whose client lists at most `per_call` entries at a time.
    fn dir(entries: Vec<DirEntry>, per_call: usize) -> impl FnMut(u64, u32) -> Answer {
        move |cookie, max| {
            let rest: Vec<DirEntry> = entries
                .iter()
                .filter(|e| e.cookie > cookie)
                .cloned()
                .collect();
            let n = rest.len().min(per_call).min(max as usize);
            let complete = n == rest.len();
            std::future::ready(Ok((rest[..n].to_vec(), complete)))
        }
    }

    fn run<F>(cap: usize, offset: u64, fetch: F) -> Result<Vec<(u64, u64, Vec<u8>)>, Errno>
    where
        F: FnMut(u64, u32) -> Answer,
    {
        let mut sink = Sink { cap, got: vec![] };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|_| Errno::EIO)?;
        rt.block_on(fill(&mut sink, 10, 4, offset, fetch))?;
        Ok(sink.got)
    }

    /// Lists the whole directory the way the kernel does: each call continues
    /// from the offset of the last entry of the previous one, until a call
    /// returns nothing.
    fn list_all(entries: Vec<DirEntry>, per_call: usize, cap: usize) -> Vec<(u64, Vec<u8>)> {
        let mut offset = 0;
        let mut out = vec![];
        for _ in 0..10_000 {
            let got = run(cap, offset, dir(entries.clone(), per_call)).expect("listing");
            let Some(last) = got.last() else { return out };
            offset = last.1;
            out.extend(got.into_iter().map(|(ino, _, name)| (ino, name)));
        }
        panic!("listing did not end");
    }

    fn sample() -> Vec<DirEntry> {
        // Sparse cookies, including 1 and 2 (which must not collide with the
        // offsets of "." and "..").
        [
            (1, "a"),
            (2, "b"),
            (3, "c"),
            (7, "d"),
            (100, "e"),
            (101, "f"),
            (5000, "g"),
        ]
        .iter()
        .enumerate()
        .map(|(i, (c, n))| entry(n, 20 + i as u64, *c))
        .collect()
    }

    /// A reply that takes `left` entries and says so before it is full.
    struct Capped {
        left: usize,
        got: usize,
    }

    impl DirSink<DirEntry> for Capped {
        fn add(&mut self, _: u64, _: u64, _: FileType, _: &[u8], item: Option<&DirEntry>) -> bool {
            if item.is_some() {
                if self.left == 0 {
                    return true;
                }
                self.left -= 1;
            }
            self.got += 1;
            false
        }

        fn takes_more(&self) -> bool {
            self.left > 0
        }
    }

    #[test]
    fn a_reply_that_takes_no_more_fetches_no_next_batch() {
        let mut sink = Capped { left: 3, got: 0 };
        let mut calls = Vec::new();
        let mut inner = dir(sample(), 3);
        let fetch = |cookie, max| {
            calls.push(cookie);
            inner(cookie, max)
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(fill(&mut sink, 10, 4, 0, fetch)).expect("fill");
        // ".", "..", and the first batch of three; the second batch (which
        // a listing with attributes would look up) never asked for.
        assert_eq!(sink.got, 5);
        assert_eq!(calls, vec![0]);
    }

    #[test]
    fn whole_listing_with_any_buffer_and_batch_size() {
        let mut want: Vec<(u64, Vec<u8>)> = vec![(10, b".".to_vec()), (4, b"..".to_vec())];
        want.extend(sample().iter().map(|e| (e.child.id, e.name.clone())));
        for cap in 1..=10 {
            for per_call in 1..=8 {
                assert_eq!(
                    list_all(sample(), per_call, cap),
                    want,
                    "cap {cap} per_call {per_call}"
                );
            }
        }
    }

    #[test]
    fn continuing_from_every_offset() {
        let entries = sample();
        let full = run(100, 0, dir(entries.clone(), 3)).expect("listing");
        assert_eq!(full.len(), entries.len() + 2);
        for (i, (_, off, _)) in full.iter().enumerate() {
            let rest = run(100, *off, dir(entries.clone(), 3)).expect("listing");
            assert_eq!(rest, full[i + 1..].to_vec(), "from offset {off}");
        }
    }

    #[test]
    fn entries_survive_deletions_between_calls() {
        let entries = sample();
        let first = run(4, 0, dir(entries.clone(), 8)).expect("listing");
        // ".", "..", "a", "b"; then "c" is deleted and "z" is added at the end.
        let last_off = first[3].1;
        let mut changed: Vec<DirEntry> = entries.into_iter().filter(|e| e.name != b"c").collect();
        changed.push(entry("z", 99, 6000));
        let rest = run(100, last_off, dir(changed, 8)).expect("listing");
        let names: Vec<&[u8]> = rest.iter().map(|r| r.2.as_slice()).collect();
        assert_eq!(names, [&b"d"[..], b"e", b"f", b"g", b"z"]);
    }

    #[test]
    fn invalid_names_are_skipped() {
        let entries = vec![
            entry("ok1", 21, 1),
            entry("", 22, 2),
            entry("a/b", 23, 3),
            entry(".", 24, 4),
            entry("..", 25, 5),
            entry(&"x".repeat(256), 26, 6),
            DirEntry {
                name: b"nul\0".to_vec(),
                ..entry("", 27, 7)
            },
            entry(&"y".repeat(255), 28, 8),
        ];
        let got = run(100, 2, dir(entries, 2)).expect("listing");
        let ids: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(ids, [21, 28]);
        assert!(valid_name("héllo".as_bytes()));
        assert!(valid_name(&[0xff, 0xfe]));
    }

    #[test]
    fn broken_client_answers_fail_with_eio() {
        // Cookies that go backwards would loop forever.
        let backwards = |_c: u64, _m: u32| {
            std::future::ready(Ok((vec![entry("a", 5, 3), entry("b", 6, 3)], false)))
        };
        assert_eq!(run(100, 2, backwards), Err(Errno::EIO));
        // A cookie too large to encode.
        let huge = |_c: u64, _m: u32| std::future::ready(Ok((vec![entry("a", 5, u64::MAX)], true)));
        assert_eq!(run(100, 2, huge), Err(Errno::EIO));
        // Nothing, yet not complete, with nothing to show.
        let stuck = |_c: u64, _m: u32| std::future::ready(Ok((vec![], false)));
        assert_eq!(run(100, 2, stuck), Err(Errno::EIO));
        // ... but "." and ".." are still delivered from offset 0.
        assert_eq!(run(100, 0, stuck).map(|v| v.len()), Ok(2));
    }

    #[test]
    fn client_errors_are_mapped() {
        let gone = |_c: u64, _m: u32| {
            std::future::ready(Err(Error::new(
                morris_client::ErrorCode::NotDir,
                "not a directory",
            )))
        };
        assert_eq!(
            run(100, 0, gone),
            Err(errno(morris_client::ErrorCode::NotDir))
        );
    }

    #[test]
    fn empty_directory() {
        let got = run(100, 0, dir(vec![], 8)).expect("listing");
        assert_eq!(got, vec![(10, 1, b".".to_vec()), (4, 2, b"..".to_vec())]);
        assert_eq!(run(100, 2, dir(vec![], 8)), Ok(vec![]));
    }
}
