//! Directory entry cookies: a name's place in listings.
//!
//! A listing returns entries in cookie order and continues after the last
//! cookie it returned. If cookies were handed out in creation order, a name
//! removed and created again (or replaced by a rename of a newer entry)
//! would move behind a listing in progress and be returned twice — `ls`
//! showing one file twice. So, as ext4's hashed directories do, a cookie is
//! a hash of the name (FNV-1a, a fixed function: cookies are stored), kept
//! in 1 ..= 2^62 − 1 so that front ends can add small offsets for `.` and
//! `..` without overflow. A name whose hash slot is taken by another name
//! takes the next free one. A name replaced in place ([`repoint`]) keeps
//! its cookie. Entries made before cookies were hashed keep their old
//! (small, sequential) cookies.
//!
//! Names a cached directory gets from home ([`insert_in_order`]) are the
//! exception: each takes the cookie after the largest in the directory, so
//! they are listed in the order they were stored, and a listing can go on
//! while the directory is being filled (every name stored later comes
//! after its position). Home is the only writer of such a directory: a
//! name removed and made again there between two revalidations is the one
//! case that can show twice in one long listing.

use std::hash::Hasher;

use morris_proto::{FileId, FileKind, Handle, WireError};
use rusqlite::{params, OptionalExtension, Transaction};

use super::{db_err, kind_code, sql_id};

/// Largest cookie handed out (exclusive bound 2^62).
const MAX_COOKIE: u64 = (1 << 62) - 1;

/// The preferred cookie of `name`.
pub(super) fn of(name: &[u8]) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(name);
    (h.finish() >> 2).clamp(1, MAX_COOKIE)
}

/// The first free cookie in `dir` at or after `name`'s preferred one.
fn free_cookie(tx: &Transaction<'_>, dir: FileId, name: &[u8]) -> Result<u64, WireError> {
    let mut c = of(name);
    loop {
        let taken: Option<i64> = tx
            .prepare_cached("SELECT 1 FROM entries WHERE dir = ?1 AND cookie = ?2")
            .and_then(|mut s| {
                s.query_row(params![sql_id(dir), c as i64], |r| r.get(0))
                    .optional()
            })
            .map_err(db_err)?;
        if taken.is_none() {
            return Ok(c);
        }
        c = if c >= MAX_COOKIE { 1 } else { c + 1 };
    }
}

/// Adds the entry `name → child` (the name must be absent).
pub(super) fn insert(
    tx: &Transaction<'_>,
    dir: FileId,
    name: &[u8],
    child: Handle,
    kind: FileKind,
) -> Result<u64, WireError> {
    let cookie = free_cookie(tx, dir, name)?;
    tx.prepare_cached(
        "INSERT INTO entries (dir, name, cookie, child, gen, kind)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut s| {
        s.execute(params![
            sql_id(dir),
            name,
            cookie as i64,
            sql_id(child.id),
            i64::from(child.gen),
            kind_code(kind)
        ])
    })
    .map_err(db_err)?;
    Ok(cookie)
}

/// Adds `name → child` at `cookie` unless the name or the cookie is taken
/// in `dir`; returns whether it was added (one indexed insert).
fn insert_at(
    tx: &Transaction<'_>,
    dir: FileId,
    name: &[u8],
    child: Handle,
    kind: FileKind,
    cookie: u64,
) -> Result<bool, WireError> {
    let added = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO entries (dir, name, cookie, child, gen, kind)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .and_then(|mut s| {
            s.execute(params![
                sql_id(dir),
                name,
                cookie as i64,
                sql_id(child.id),
                i64::from(child.gen),
                kind_code(kind)
            ])
        })
        .map_err(db_err)?;
    Ok(added == 1)
}

/// Adds the entry `name → child` unless `name` is there already; returns
/// the cookie it was added at (`None`: the name was there). One indexed insert when the name's own cookie is
/// free (nearly always), so that filling a directory with many names
/// (cache mode's listings) costs one B-tree insert per name, not a lookup,
/// a cookie probe and an insert.
pub(super) fn insert_if_absent(
    tx: &Transaction<'_>,
    dir: FileId,
    name: &[u8],
    child: Handle,
    kind: FileKind,
) -> Result<Option<u64>, WireError> {
    let hashed = of(name);
    if insert_at(tx, dir, name, child, kind, hashed)? {
        return Ok(Some(hashed));
    }
    // Ignored: the name is there, or another name holds its cookie.
    if super::find_entry(tx, dir, name)?.is_some() {
        return Ok(None);
    }
    insert(tx, dir, name, child, kind).map(Some)
}

/// The cookie after the largest in `dir` (1 in an empty one); `None` once
/// the cookies run out (then [`insert_if_absent`]'s hashed ones are used).
pub(super) fn next_in_order(tx: &Transaction<'_>, dir: FileId) -> Result<Option<u64>, WireError> {
    let max: Option<i64> = tx
        .prepare_cached("SELECT MAX(cookie) FROM entries WHERE dir = ?1")
        .and_then(|mut s| s.query_row(params![sql_id(dir)], |r| r.get(0)))
        .map_err(db_err)?;
    let next = max.map_or(1, |m| m.saturating_add(1).max(1) as u64);
    Ok((next <= MAX_COOKIE).then_some(next))
}

/// Adds `name → child` unless `name` is there already, at cookie `*next`
/// (from [`next_in_order`]), which then moves past it; once `*next` is
/// `None`, at a hashed cookie. Returns the cookie it was added at (`None`:
/// the name was there).
pub(super) fn insert_in_order(
    tx: &Transaction<'_>,
    dir: FileId,
    name: &[u8],
    child: Handle,
    kind: FileKind,
    next: &mut Option<u64>,
) -> Result<Option<u64>, WireError> {
    while let Some(c) = *next {
        if insert_at(tx, dir, name, child, kind, c)? {
            *next = (c < MAX_COOKIE).then_some(c + 1);
            return Ok(Some(c));
        }
        if super::find_entry(tx, dir, name)?.is_some() {
            return Ok(None);
        }
        // A hashed cookie of an earlier name sits here: the next one up.
        *next = (c < MAX_COOKIE).then_some(c + 1);
    }
    insert_if_absent(tx, dir, name, child, kind)
}

/// Makes the existing entry `name` name `child` instead, keeping its cookie.
pub(super) fn repoint(
    tx: &Transaction<'_>,
    dir: FileId,
    name: &[u8],
    child: Handle,
    kind: FileKind,
) -> Result<(), WireError> {
    tx.prepare_cached(
        "UPDATE entries SET child = ?3, gen = ?4, kind = ?5 WHERE dir = ?1 AND name = ?2",
    )
    .and_then(|mut s| {
        s.execute(params![
            sql_id(dir),
            name,
            sql_id(child.id),
            i64::from(child.gen),
            kind_code(kind)
        ])
    })
    .map_err(db_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_a_fixed_function_of_the_name() {
        // Stored on disk: must never change between versions.
        assert_eq!(of(b""), 0xcbf2_9ce4_8422_2325 >> 2);
        assert_eq!(of(b"a"), of(b"a"));
        assert_ne!(of(b"a"), of(b"b"));
        for name in [&b"x"[..], b"target", b"tmp.123", &[0xff; 255]] {
            let c = of(name);
            assert!((1..=MAX_COOKIE).contains(&c), "{c}");
        }
    }
}
