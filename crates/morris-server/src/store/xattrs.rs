//! Extended attributes: one row per (object, name) in `xattrs`, kept by the
//! object's owner beside its inode and mirrored with it (a replicated
//! table), removed with the inode.

use morris_proto::{
    ErrorCode, Handle, Inode, Timestamp, WireError, Xattr, XattrHow, MAX_XATTR_BYTES,
    MAX_XATTR_NAME, MAX_XATTR_NAMES, MAX_XATTR_VALUE,
};
use rusqlite::{params, Connection, OptionalExtension, Transaction};

use super::once::OpKey;
use super::{check_handle, db_err, encode_inode, load_inode, sql_id, Store};

/// The table (created with the store's schema).
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS xattrs (
    id INTEGER NOT NULL,
    name BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (id, name)
) WITHOUT ROWID;
";

fn invalid(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Invalid, message)
}

/// Checks an attribute name: 1..=255 bytes, no NUL, a namespace prefix.
pub fn check_xattr_name(name: &[u8]) -> Result<(), WireError> {
    if name.is_empty() {
        return Err(invalid("an empty extended attribute name"));
    }
    if name.len() > MAX_XATTR_NAME {
        // The kernel answers ERANGE itself before asking a mount.
        return Err(invalid(format!(
            "extended attribute name of {} bytes (at most {MAX_XATTR_NAME})",
            name.len()
        )));
    }
    if name.contains(&0) {
        return Err(invalid("an extended attribute name with a NUL byte"));
    }
    Ok(())
}

/// Every attribute of `id`, in name order.
pub(super) fn list(c: &Connection, id: u64) -> Result<Vec<Xattr>, WireError> {
    let mut st = c
        .prepare_cached("SELECT name, value FROM xattrs WHERE id = ?1 ORDER BY name")
        .map_err(db_err)?;
    let rows = st
        .query_map(params![sql_id(id)], |r| {
            Ok(Xattr {
                name: r.get(0)?,
                value: r.get(1)?,
            })
        })
        .map_err(db_err)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(db_err)
}

/// Removes every attribute of `id` (its inode is being removed).
pub(super) fn forget(tx: &Transaction<'_>, id: u64) -> Result<(), WireError> {
    tx.prepare_cached("DELETE FROM xattrs WHERE id = ?1")
        .and_then(|mut s| s.execute(params![sql_id(id)]))
        .map_err(db_err)?;
    Ok(())
}

/// The bytes of names (each with its NUL) and of names and values that
/// `id` has, without the attribute `except`.
fn usage(tx: &Transaction<'_>, id: u64, except: &[u8]) -> Result<(usize, usize), WireError> {
    let (names, all): (i64, i64) = tx
        .prepare_cached(
            "SELECT COALESCE(SUM(length(name) + 1), 0), \
                    COALESCE(SUM(length(name) + length(value)), 0) \
             FROM xattrs WHERE id = ?1 AND name != ?2",
        )
        .and_then(|mut s| s.query_row(params![sql_id(id), except], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(db_err)?;
    Ok((
        usize::try_from(names).unwrap_or(usize::MAX),
        usize::try_from(all).unwrap_or(usize::MAX),
    ))
}

impl Store {
    /// The object `h` names and every extended attribute of it.
    pub fn get_xattrs(&self, h: Handle) -> Result<(Inode, Vec<Xattr>), WireError> {
        self.with_reader(|c| {
            let tx = c.unchecked_transaction().map_err(db_err)?;
            let ino = check_handle(h, load_inode(&tx, h.id)?)?;
            let out = list(&tx, h.id)?;
            tx.finish().map_err(db_err)?;
            Ok((ino, out))
        })
    }

    /// Sets (`Some`) or removes (`None`) attribute `name` of the object `h`
    /// names, as `how` allows, and makes its ctime now; returns the inode.
    /// Run at most once per `op`.
    pub fn set_xattr(
        &self,
        h: Handle,
        name: &[u8],
        value: Option<&[u8]>,
        how: XattrHow,
        op: Option<OpKey>,
    ) -> Result<Inode, WireError> {
        check_xattr_name(name)?;
        if let Some(v) = value {
            if v.len() > MAX_XATTR_VALUE {
                // The kernel answers E2BIG itself before asking a mount.
                return Err(invalid(format!(
                    "extended attribute value of {} bytes (at most {MAX_XATTR_VALUE})",
                    v.len()
                )));
            }
        }
        let (ino, _) = self.write_txn_once(op, |tx| {
            let mut ino = check_handle(h, load_inode(tx, h.id)?)?;
            if ino.home.is_some() {
                return Err(WireError::new(
                    ErrorCode::NotSupported,
                    "extended attributes are not kept for objects cached from a home",
                ));
            }
            let there: Option<i64> = tx
                .prepare_cached("SELECT 1 FROM xattrs WHERE id = ?1 AND name = ?2")
                .and_then(|mut s| {
                    s.query_row(params![sql_id(h.id), name], |r| r.get(0))
                        .optional()
                })
                .map_err(db_err)?;
            match (there.is_some(), how, value) {
                (true, XattrHow::Create, Some(_)) => {
                    return Err(WireError::new(
                        ErrorCode::Exists,
                        "the extended attribute exists",
                    ))
                }
                (false, XattrHow::Replace, _) | (false, _, None) => {
                    return Err(WireError::new(
                        ErrorCode::NoData,
                        "no such extended attribute",
                    ))
                }
                _ => {}
            }
            match value {
                Some(v) => {
                    let (names, all) = usage(tx, h.id, name)?;
                    if names + name.len() + 1 > MAX_XATTR_NAMES
                        || all + name.len() + v.len() > MAX_XATTR_BYTES
                    {
                        return Err(WireError::new(
                            ErrorCode::NoSpace,
                            "no room for more extended attributes on this object",
                        ));
                    }
                    tx.prepare_cached(
                        "INSERT OR REPLACE INTO xattrs (id, name, value) VALUES (?1, ?2, ?3)",
                    )
                    .and_then(|mut s| s.execute(params![sql_id(h.id), name, v]))
                    .map_err(db_err)?;
                }
                None => {
                    tx.prepare_cached("DELETE FROM xattrs WHERE id = ?1 AND name = ?2")
                        .and_then(|mut s| s.execute(params![sql_id(h.id), name]))
                        .map_err(db_err)?;
                }
            }
            ino.attr.ctime = Timestamp::now();
            let data = encode_inode(&ino)?;
            tx.prepare_cached("UPDATE inodes SET data = ?2 WHERE id = ?1")
                .and_then(|mut s| s.execute(params![sql_id(ino.id), data]))
                .map_err(db_err)?;
            Ok(ino)
        })?;
        Ok(ino)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{attr, descriptor};
    use super::*;
    use morris_proto::FileKind;

    fn store(dir: &std::path::Path) -> Store {
        let s = Store::open(&dir.join("m.sqlite")).unwrap();
        s.format(&descriptor(1), 0, 77).unwrap();
        s
    }

    fn names(s: &Store, h: Handle) -> Vec<(String, Vec<u8>)> {
        s.get_xattrs(h)
            .unwrap()
            .1
            .into_iter()
            .map(|x| (String::from_utf8(x.name).unwrap(), x.value))
            .collect()
    }

    #[test]
    fn set_replace_create_and_remove_as_setxattr_does() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let f = s
            .create_inode(0, &attr(FileKind::File), None, 1, None, None)
            .unwrap()
            .handle();
        assert!(names(&s, f).is_empty());
        let before = s.get_handle(f).unwrap().attr.ctime;
        std::thread::sleep(std::time::Duration::from_millis(2));
        let i = s
            .set_xattr(f, b"user.b", Some(b"2"), XattrHow::Either, None)
            .unwrap();
        assert!(i.attr.ctime > before, "ctime moves");
        s.set_xattr(f, b"user.a", Some(b""), XattrHow::Create, None)
            .unwrap();
        assert_eq!(
            names(&s, f),
            vec![("user.a".into(), vec![]), ("user.b".into(), b"2".to_vec())]
        );
        let e = s
            .set_xattr(f, b"user.a", Some(b"x"), XattrHow::Create, None)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Exists);
        let e = s
            .set_xattr(f, b"user.c", Some(b"x"), XattrHow::Replace, None)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NoData);
        s.set_xattr(f, b"user.a", Some(b"new"), XattrHow::Replace, None)
            .unwrap();
        s.set_xattr(f, b"user.b", None, XattrHow::Either, None)
            .unwrap();
        assert_eq!(names(&s, f), vec![("user.a".into(), b"new".to_vec())]);
        let e = s
            .set_xattr(f, b"user.b", None, XattrHow::Either, None)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NoData);
        for bad in [&b""[..], b"user.\0x", &[b'u'; 256]] {
            let e = s
                .set_xattr(f, bad, Some(b"v"), XattrHow::Either, None)
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::Invalid);
        }
        let big = vec![7u8; MAX_XATTR_VALUE + 1];
        let e = s
            .set_xattr(f, b"user.big", Some(&big), XattrHow::Either, None)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Invalid);
        // A stale handle is refused.
        let stale = Handle { id: f.id, gen: 99 };
        assert_eq!(s.get_xattrs(stale).unwrap_err().code, ErrorCode::Stale);
    }

    #[test]
    fn room_is_bounded_per_object_and_replacing_reuses_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let f = s
            .create_inode(0, &attr(FileKind::File), None, 1, None, None)
            .unwrap()
            .handle();
        let v = vec![1u8; MAX_XATTR_VALUE];
        let mut n = 0;
        let full = loop {
            let name = format!("user.v{n}");
            match s.set_xattr(f, name.as_bytes(), Some(&v), XattrHow::Either, None) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(full.code, ErrorCode::NoSpace);
        assert_eq!(n, MAX_XATTR_BYTES / (MAX_XATTR_VALUE + 8));
        // The same name again replaces: its old bytes do not count.
        s.set_xattr(f, b"user.v0", Some(&v), XattrHow::Replace, None)
            .unwrap();
        // Names alone are bounded too (what one listxattr can return).
        let g = s
            .create_inode(0, &attr(FileKind::File), None, 2, None, None)
            .unwrap()
            .handle();
        let long = |i: usize| format!("user.{i:0>250}");
        let mut i = 0;
        let e = loop {
            match s.set_xattr(g, long(i).as_bytes(), Some(b""), XattrHow::Create, None) {
                Ok(_) => i += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(e.code, ErrorCode::NoSpace);
        assert_eq!(i, MAX_XATTR_NAMES / 256);
    }

    #[test]
    fn attributes_go_with_their_inode_and_a_repeat_is_answered_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let f = s
            .create_inode(0, &attr(FileKind::File), None, 1, None, None)
            .unwrap()
            .handle();
        let op = |n| OpKey::new(5, n);
        s.set_xattr(f, b"user.a", Some(b"1"), XattrHow::Create, op(1))
            .unwrap();
        // Resent after a lost answer: its outcome, not Exists.
        s.set_xattr(f, b"user.a", Some(b"1"), XattrHow::Create, op(1))
            .unwrap();
        s.set_xattr(f, b"user.a", None, XattrHow::Either, op(2))
            .unwrap();
        s.set_xattr(f, b"user.a", None, XattrHow::Either, op(2))
            .unwrap();
        s.set_xattr(f, b"trusted.t", Some(b"x"), XattrHow::Either, None)
            .unwrap();
        s.delete_inode(f, None).unwrap();
        let left: i64 = s.with_reader(|c| {
            c.query_row("SELECT COUNT(*) FROM xattrs", [], |r| r.get(0))
                .unwrap()
        });
        assert_eq!(left, 0);
    }
}
