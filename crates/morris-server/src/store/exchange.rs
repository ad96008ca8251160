//! `renameat2(RENAME_EXCHANGE)` within one directory: two names swap what
//! they point at in one transaction.

use morris_proto::{ErrorCode, Handle, Inode, WireError};

use super::once::OpKey;
use super::{check_name, cookies, find_entry, load_dir_row, store_dir_row, touch_dir, Store};

impl Store {
    /// Swaps the objects names `a` and `b` of directory `dir` point at
    /// (each keeps its listing position); both must exist. Not in a
    /// directory cached from a home. Returns the directory's inode. Run at
    /// most once per `op`.
    pub fn exchange(
        &self,
        dir: Handle,
        a: &[u8],
        b: &[u8],
        op: Option<OpKey>,
    ) -> Result<Inode, WireError> {
        check_name(a)?;
        check_name(b)?;
        let (inode, _) = self.write_txn_once(op, |tx| {
            let mut d = load_dir_row(tx, dir)?;
            if d.inode.home.is_some() {
                return Err(WireError::new(
                    ErrorCode::NotSupported,
                    "exchanging names in a directory cached from a home",
                ));
            }
            let missing = |n: &[u8]| {
                WireError::new(
                    ErrorCode::NotFound,
                    format!("no entry {}", String::from_utf8_lossy(n)),
                )
            };
            let ea = find_entry(tx, dir.id, a)?.ok_or_else(|| missing(a))?;
            let eb = find_entry(tx, dir.id, b)?.ok_or_else(|| missing(b))?;
            if a == b || ea.child == eb.child {
                return Ok(d.inode);
            }
            cookies::repoint(tx, dir.id, a, eb.child, eb.kind)?;
            cookies::repoint(tx, dir.id, b, ea.child, ea.kind)?;
            touch_dir(&mut d.inode.attr);
            store_dir_row(tx, &d)?;
            Ok(d.inode)
        })?;
        Ok(inode)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{attr, descriptor, root};
    use super::*;
    use morris_proto::FileKind;

    #[test]
    fn two_names_swap_and_a_missing_one_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("m.sqlite")).unwrap();
        s.format(&descriptor(1), 0, 77).unwrap();
        let r = root(&s);
        let f = s
            .create_inode(0, &attr(FileKind::File), None, 1, None, None)
            .unwrap();
        let d = s
            .create_inode(r.id, &attr(FileKind::Dir), None, 2, None, None)
            .unwrap();
        s.link(r, b"f", f.handle(), FileKind::File, None, None)
            .unwrap();
        s.link(r, b"d", d.handle(), FileKind::Dir, None, None)
            .unwrap();
        s.exchange(r, b"f", b"d", None).unwrap();
        let at = |n: &[u8]| s.lookup(r, n).unwrap().unwrap();
        assert_eq!((at(b"f").child, at(b"f").kind), (d.handle(), FileKind::Dir));
        assert_eq!(
            (at(b"d").child, at(b"d").kind),
            (f.handle(), FileKind::File)
        );
        let e = s.exchange(r, b"f", b"nope", None).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
    }
}
