//! Extended attributes: one row per (object, name) in `xattrs`, kept by the
//! object's owner beside its inode and mirrored with it (a replicated
//! table), removed with the inode.
//!
//! POSIX ACLs are two of them (`system.posix_acl_access`, `_default`),
//! with rules of their own kept here in the same transaction as the mode:
//! an access ACL sets the mode's permission bits (and is not kept at all
//! when the mode says it all), a chmod rewrites the access ACL, a default
//! ACL is for directories only.

use morris_proto::acl::{self, Acl};
use morris_proto::{
    ErrorCode, FileKind, Handle, Inode, Timestamp, WireError, Xattr, XattrHow, MAX_XATTR_BYTES,
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

/// Decodes an ACL value (`None`: an empty ACL, which removes).
fn decode_acl(v: &[u8]) -> Result<Option<Acl>, WireError> {
    Acl::decode(v).map_err(|e| invalid(format!("not a POSIX ACL: {e}")))
}

/// Checks that an ACL attribute may be set on an object of `kind`.
fn acl_allowed(name: &[u8], kind: FileKind) -> Result<(), WireError> {
    if kind == FileKind::Symlink {
        return Err(WireError::new(
            ErrorCode::NotSupported,
            "symbolic links have no ACLs",
        ));
    }
    if name == acl::DEFAULT && kind != FileKind::Dir {
        return Err(WireError::new(
            ErrorCode::Access,
            "only directories have a default ACL",
        ));
    }
    Ok(())
}

fn put(tx: &Transaction<'_>, id: u64, name: &[u8], value: &[u8]) -> Result<(), WireError> {
    tx.prepare_cached("INSERT OR REPLACE INTO xattrs (id, name, value) VALUES (?1, ?2, ?3)")
        .and_then(|mut s| s.execute(params![sql_id(id), name, value]))
        .map_err(db_err)?;
    Ok(())
}

fn remove(tx: &Transaction<'_>, id: u64, name: &[u8]) -> Result<bool, WireError> {
    let n = tx
        .prepare_cached("DELETE FROM xattrs WHERE id = ?1 AND name = ?2")
        .and_then(|mut s| s.execute(params![sql_id(id), name]))
        .map_err(db_err)?;
    Ok(n > 0)
}

fn get(tx: &Transaction<'_>, id: u64, name: &[u8]) -> Result<Option<Vec<u8>>, WireError> {
    tx.prepare_cached("SELECT value FROM xattrs WHERE id = ?1 AND name = ?2")
        .and_then(|mut s| {
            s.query_row(params![sql_id(id), name], |r| r.get(0))
                .optional()
        })
        .map_err(db_err)
}

/// What to keep for ACL attribute `name` of `ino` when it is set to
/// `value` (`None`: removed), with the mode changed to follow an access
/// ACL. Nothing is kept for an empty ACL or an access ACL the mode says
/// all of.
fn acl_value(
    ino: &mut Inode,
    name: &[u8],
    value: Option<&[u8]>,
) -> Result<Option<Vec<u8>>, WireError> {
    acl_allowed(name, ino.attr.kind)?;
    let Some(acl) = value.map(decode_acl).transpose()?.flatten() else {
        return Ok(None);
    };
    if name == acl::ACCESS {
        ino.attr.mode = (ino.attr.mode & !0o777) | acl.mode_bits();
        if acl.is_mode_only() {
            return Ok(None);
        }
    }
    Ok(Some(acl.encode()))
}

/// After a chmod of `id` to `mode`: its access ACL (if any) takes the new
/// permission bits.
pub(super) fn chmod_acl(tx: &Transaction<'_>, id: u64, mode: u32) -> Result<(), WireError> {
    let Some(v) = get(tx, id, acl::ACCESS)? else {
        return Ok(());
    };
    // Only valid ACLs are stored; one that is not is dropped, not kept.
    match Acl::decode(&v) {
        Ok(Some(mut a)) => {
            a.chmod(mode);
            put(tx, id, acl::ACCESS, &a.encode())
        }
        _ => remove(tx, id, acl::ACCESS).map(|_| ()),
    }
}

/// Stores a new object's first attributes (its inherited ACLs): checked
/// as `set_xattr` checks them.
pub(super) fn put_initial(
    tx: &Transaction<'_>,
    ino: &Inode,
    list: &[Xattr],
) -> Result<(), WireError> {
    let (mut names, mut all) = (0usize, 0usize);
    for x in list {
        check_xattr_name(&x.name)?;
        if x.value.len() > MAX_XATTR_VALUE {
            return Err(invalid("an extended attribute value too big"));
        }
        names += x.name.len() + 1;
        all += x.name.len() + x.value.len();
        if names > MAX_XATTR_NAMES || all > MAX_XATTR_BYTES {
            return Err(WireError::new(
                ErrorCode::NoSpace,
                "no room for these extended attributes",
            ));
        }
        let mut value = x.value.clone();
        if x.name == acl::ACCESS || x.name == acl::DEFAULT {
            acl_allowed(&x.name, ino.attr.kind)?;
            match decode_acl(&x.value)? {
                Some(a) if x.name == acl::ACCESS && a.is_mode_only() => continue,
                Some(a) => value = a.encode(),
                None => continue,
            }
        }
        put(tx, ino.id, &x.name, &value)?;
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
            let is_acl = name == acl::ACCESS || name == acl::DEFAULT;
            let mut how = how;
            let mut value = value.map(<[u8]>::to_vec);
            if is_acl {
                // The flags do not apply (as `vfs_set_acl`); the mode
                // follows an access ACL, which may then not be kept.
                value = acl_value(&mut ino, name, value.as_deref())?;
                how = XattrHow::Either;
            }
            let there = get(tx, h.id, name)?.is_some();
            match (there, how, &value) {
                (true, XattrHow::Create, Some(_)) => {
                    return Err(WireError::new(
                        ErrorCode::Exists,
                        "the extended attribute exists",
                    ))
                }
                // Removing an ACL that is not there is no error (ext4).
                (false, _, None) if is_acl => {}
                (false, XattrHow::Replace, _) | (false, _, None) => {
                    return Err(WireError::new(
                        ErrorCode::NoData,
                        "no such extended attribute",
                    ))
                }
                _ => {}
            }
            match &value {
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
                    put(tx, h.id, name, v)?;
                }
                None => {
                    remove(tx, h.id, name)?;
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
    use morris_proto::SetAttr;

    fn store(dir: &std::path::Path) -> Store {
        let s = Store::open(&dir.join("m.sqlite")).unwrap();
        s.format(&descriptor(1), 0, 77).unwrap();
        s
    }

    /// A new file (not linked anywhere) of generation `gen`.
    fn file(s: &Store, gen: u32) -> Handle {
        s.create_inode(0, &attr(FileKind::File), None, gen, None, None)
            .unwrap()
            .handle()
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
        let f = file(&s, 1);
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
        let f = file(&s, 1);
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
        let g = file(&s, 2);
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
        let f = file(&s, 1);
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

    fn named(uid: u32) -> Vec<u8> {
        use morris_proto::acl::{Entry, Tag};
        let e = |tag, perm| Entry { tag, perm };
        Acl::new(vec![
            e(Tag::UserObj, 7),
            e(Tag::User(uid), 7),
            e(Tag::GroupObj, 4),
            e(Tag::Mask, 5),
            e(Tag::Other, 0),
        ])
        .unwrap()
        .encode()
    }

    #[test]
    fn an_access_acl_and_the_mode_follow_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let f = file(&s, 1);
        let mode = |s: &Store| s.get_handle(f).unwrap().attr.mode & 0o7777;
        assert_eq!(mode(&s), 0o644);
        // A named user: kept, and the group bits are the mask.
        let i = s
            .set_xattr(f, acl::ACCESS, Some(&named(42)), XattrHow::Create, None)
            .unwrap();
        assert_eq!(i.attr.mode & 0o7777, 0o750);
        assert_eq!(
            names(&s, f),
            vec![("system.posix_acl_access".into(), named(42))]
        );
        // chmod rewrites owner, mask and other.
        s.set_attr(
            f,
            &SetAttr {
                mode: Some(0o604),
                ..Default::default()
            },
        )
        .unwrap();
        let kept = Acl::decode(&names(&s, f)[0].1).unwrap().unwrap();
        assert_eq!(kept.mode_bits(), 0o604);
        // An ACL the mode says all of: only the mode is kept.
        let i = s
            .set_xattr(
                f,
                acl::ACCESS,
                Some(&Acl::from_mode(0o600).encode()),
                XattrHow::Replace,
                None,
            )
            .unwrap();
        assert_eq!(i.attr.mode & 0o7777, 0o600);
        assert!(names(&s, f).is_empty());
        // Removing an ACL that is not there is no error.
        s.set_xattr(f, acl::ACCESS, None, XattrHow::Either, None)
            .unwrap();
        // Not an ACL; a default ACL on a file; a symlink's ACL.
        let e = s
            .set_xattr(
                f,
                acl::ACCESS,
                Some(b"\x02\0\0\0junk"),
                XattrHow::Either,
                None,
            )
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Invalid);
        let e = s
            .set_xattr(f, acl::DEFAULT, Some(&named(1)), XattrHow::Either, None)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Access);
        let l = s
            .create_inode(0, &attr(FileKind::Symlink), Some(b"t"), 3, None, None)
            .unwrap()
            .handle();
        let e = s
            .set_xattr(l, acl::ACCESS, Some(&named(1)), XattrHow::Either, None)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NotSupported);
    }

    #[test]
    fn a_new_object_keeps_the_acls_it_was_made_with() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let first = vec![
            Xattr {
                name: acl::ACCESS.to_vec(),
                value: named(7),
            },
            Xattr {
                name: acl::DEFAULT.to_vec(),
                value: named(7),
            },
        ];
        let d = s
            .create_inode_with(0, &attr(FileKind::Dir), None, 1, None, None, &first)
            .unwrap()
            .handle();
        assert_eq!(names(&s, d).len(), 2);
        // A file cannot have a default ACL; a mode-only access ACL is not kept.
        let e = s
            .create_inode_with(0, &attr(FileKind::File), None, 2, None, None, &first)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Access);
        let plain = [Xattr {
            name: acl::ACCESS.to_vec(),
            value: Acl::from_mode(0o644).encode(),
        }];
        let f = s
            .create_inode_with(0, &attr(FileKind::File), None, 3, None, None, &plain)
            .unwrap()
            .handle();
        assert!(names(&s, f).is_empty());
    }
}
