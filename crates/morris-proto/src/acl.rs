//! POSIX access control lists as Linux passes them in the
//! `system.posix_acl_access` and `system.posix_acl_default` extended
//! attributes: the binary form, its validity rules, and the four things a
//! file system does with an ACL (keep the mode in step, apply a chmod,
//! inherit a directory's default at create, decide an access). Pure
//! functions: the servers keep ACLs with the inode, the client library
//! computes inheritance and decides access for the NFS gateway, FUSE mounts
//! leave the decision to the kernel.
//!
//! The format (`include/uapi/linux/posix_acl_xattr.h`): a little-endian
//! `u32` version (2), then 8-byte entries `{ tag: u16, perm: u16, id: u32 }`
//! sorted by tag, then by id. Hand-written: eight bytes per entry, and the
//! crates that know it (`posix-acl`, `exacl`) call libacl on real files.

use std::fmt;

/// Name of the attribute holding a file's access ACL.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// Name of the attribute holding a directory's default ACL (what new
/// objects in it inherit).
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
/// Most entries one ACL may have (ext4's bound for a 4 KiB block is lower;
/// this keeps an ACL under the kernel's one-page limit).
pub const MAX_ENTRIES: usize = 500;

/// Kinds of ACL entry, with Linux's tag values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    /// The file's owner.
    UserObj,
    /// A named user.
    User(u32),
    /// The file's group.
    GroupObj,
    /// A named group.
    Group(u32),
    /// The most that named users and any group may get.
    Mask,
    /// Everybody else.
    Other,
}

impl Tag {
    fn code(self) -> u16 {
        match self {
            Tag::UserObj => 0x01,
            Tag::User(_) => 0x02,
            Tag::GroupObj => 0x04,
            Tag::Group(_) => 0x08,
            Tag::Mask => 0x10,
            Tag::Other => 0x20,
        }
    }

    fn id(self) -> u32 {
        match self {
            Tag::User(id) | Tag::Group(id) => id,
            _ => u32::MAX,
        }
    }
}

/// One entry: who, and which of read (4), write (2), execute (1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Who the entry is for.
    pub tag: Tag,
    /// `rwx` bits (0..=7).
    pub perm: u16,
}

/// Why bytes are not an ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclError(String);

impl fmt::Display for AclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AclError {}

fn bad(m: impl Into<String>) -> AclError {
    AclError(m.into())
}

/// A valid POSIX ACL (entries in Linux's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Decodes and checks the attribute form. An ACL without entries (a
    /// header alone) decodes as `None`: Linux's way of saying "remove".
    pub fn decode(bytes: &[u8]) -> Result<Option<Acl>, AclError> {
        let (head, rest) = bytes
            .split_first_chunk::<4>()
            .ok_or_else(|| bad("an ACL shorter than its header"))?;
        if u32::from_le_bytes(*head) != VERSION {
            return Err(bad(format!(
                "ACL version {} (only {VERSION} is known)",
                u32::from_le_bytes(*head)
            )));
        }
        if rest.len() % 8 != 0 {
            return Err(bad("an ACL that is not a whole number of entries"));
        }
        if rest.len() / 8 > MAX_ENTRIES {
            return Err(bad(format!("an ACL of more than {MAX_ENTRIES} entries")));
        }
        let mut entries = Vec::with_capacity(rest.len() / 8);
        for e in rest.chunks_exact(8) {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            let tag = match tag {
                0x01 => Tag::UserObj,
                0x02 => Tag::User(id),
                0x04 => Tag::GroupObj,
                0x08 => Tag::Group(id),
                0x10 => Tag::Mask,
                0x20 => Tag::Other,
                t => return Err(bad(format!("unknown ACL entry tag {t:#x}"))),
            };
            if perm & !7 != 0 {
                return Err(bad(format!("ACL permissions {perm:#o} beyond rwx")));
            }
            entries.push(Entry { tag, perm });
        }
        if entries.is_empty() {
            return Ok(None);
        }
        let acl = Acl { entries };
        acl.check()?;
        Ok(Some(acl))
    }

    /// Builds an ACL from entries in any order; checks it as `decode` does.
    pub fn new(mut entries: Vec<Entry>) -> Result<Acl, AclError> {
        entries.sort_by_key(|e| e.tag);
        let acl = Acl { entries };
        acl.check()?;
        Ok(acl)
    }

    /// The ACL equivalent to permission bits `mode` (three entries).
    pub fn from_mode(mode: u32) -> Acl {
        let p = |shift: u32| ((mode >> shift) & 7) as u16;
        Acl {
            entries: vec![
                Entry {
                    tag: Tag::UserObj,
                    perm: p(6),
                },
                Entry {
                    tag: Tag::GroupObj,
                    perm: p(3),
                },
                Entry {
                    tag: Tag::Other,
                    perm: p(0),
                },
            ],
        }
    }

    /// The attribute form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 8 * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.code().to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.tag.id().to_le_bytes());
        }
        out
    }

    /// The entries, in order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Linux's `posix_acl_valid`: one owner, owning-group and other entry,
    /// named users and groups each once and in id order, and a mask when
    /// there are any.
    fn check(&self) -> Result<(), AclError> {
        let mut last: Option<Tag> = None;
        let (mut user_obj, mut group_obj, mut other, mut mask, mut named) = (0, 0, 0, 0, 0);
        for e in &self.entries {
            if let Some(prev) = last {
                if prev >= e.tag {
                    return Err(bad("ACL entries out of order or repeated"));
                }
            }
            last = Some(e.tag);
            match e.tag {
                Tag::UserObj => user_obj += 1,
                Tag::GroupObj => group_obj += 1,
                Tag::Other => other += 1,
                Tag::Mask => mask += 1,
                Tag::User(id) | Tag::Group(id) => {
                    if id == u32::MAX {
                        return Err(bad("an ACL entry for the undefined id"));
                    }
                    named += 1;
                }
            }
        }
        if user_obj != 1 || group_obj != 1 || other != 1 {
            return Err(bad(
                "an ACL needs exactly one owner, one owning-group and one other entry",
            ));
        }
        if named > 0 && mask == 0 {
            return Err(bad("an ACL with named entries needs a mask entry"));
        }
        Ok(())
    }

    fn find(&self, want: fn(Tag) -> bool) -> Option<usize> {
        self.entries.iter().position(|e| want(e.tag))
    }

    /// The permission bits (`0o777`) this ACL implies: owner, mask (or
    /// owning group without one), other.
    pub fn mode_bits(&self) -> u32 {
        let perm = |i: Option<usize>| i.map_or(0, |i| u32::from(self.entries[i].perm));
        let group = self
            .find(|t| t == Tag::Mask)
            .or_else(|| self.find(|t| t == Tag::GroupObj));
        perm(self.find(|t| t == Tag::UserObj)) << 6
            | perm(group) << 3
            | perm(self.find(|t| t == Tag::Other))
    }

    /// True if the mode bits say everything this ACL says (no named
    /// entries, no mask): then no attribute is kept, only the mode.
    pub fn is_mode_only(&self) -> bool {
        self.entries.len() == 3
    }

    /// Applies a chmod to `mode` (`posix_acl_chmod`): the owner, mask (or
    /// owning group) and other entries take the new bits.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.find(|t| t == Tag::Mask).is_some();
        for e in &mut self.entries {
            let shift = match e.tag {
                Tag::UserObj => 6,
                Tag::Mask => 3,
                Tag::GroupObj if !has_mask => 3,
                Tag::Other => 0,
                _ => continue,
            };
            e.perm = ((mode >> shift) & 7) as u16;
        }
    }

    /// A new object's access ACL from its directory's default ACL (`self`)
    /// and the mode the creator asked for (`posix_acl_create_masq`):
    /// returns the ACL and the permission bits, both masked by the other.
    pub fn inherit(&self, mode: u32) -> (Acl, u32) {
        let mut acl = self.clone();
        let mut mode = mode;
        let has_mask = acl.find(|t| t == Tag::Mask).is_some();
        for e in &mut acl.entries {
            match e.tag {
                Tag::UserObj => {
                    e.perm &= ((mode >> 6) & 7) as u16;
                    mode &= (u32::from(e.perm) << 6) | !0o700;
                }
                Tag::Other => {
                    e.perm &= (mode & 7) as u16;
                    mode &= u32::from(e.perm) | !0o7;
                }
                Tag::Mask => {
                    e.perm &= ((mode >> 3) & 7) as u16;
                    mode &= (u32::from(e.perm) << 3) | !0o70;
                }
                Tag::GroupObj if !has_mask => {
                    e.perm &= ((mode >> 3) & 7) as u16;
                    mode &= (u32::from(e.perm) << 3) | !0o70;
                }
                _ => {}
            }
        }
        (acl, mode)
    }

    /// Whether this ACL grants `want` (`rwx` bits) to a caller with `uid`
    /// in groups `in_group`, on an object owned by `owner`:`group`
    /// (`posix_acl_permission`; root is the caller's business).
    pub fn permits(
        &self,
        owner: u32,
        group: u32,
        uid: u32,
        in_group: impl Fn(u32) -> bool,
        want: u16,
    ) -> bool {
        let mask = self
            .entries
            .iter()
            .find(|e| e.tag == Tag::Mask)
            .map_or(7, |e| e.perm);
        let grants = |perm: u16| perm & want == want;
        let mut found = false;
        for e in &self.entries {
            match e.tag {
                Tag::UserObj if uid == owner => return grants(e.perm),
                Tag::User(id) if id == uid => return grants(e.perm & mask),
                Tag::GroupObj if in_group(group) => {
                    found = true;
                    if grants(e.perm & mask) {
                        return true;
                    }
                }
                Tag::Group(id) if in_group(id) => {
                    found = true;
                    if grants(e.perm & mask) {
                        return true;
                    }
                }
                Tag::Other => return !found && grants(e.perm),
                _ => {}
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(Tag, u16)]) -> Acl {
        Acl::new(
            entries
                .iter()
                .map(|&(tag, perm)| Entry { tag, perm })
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn the_attribute_form_round_trips_and_bad_bytes_are_refused() {
        let a = acl(&[
            (Tag::Other, 4),
            (Tag::User(1000), 6),
            (Tag::UserObj, 7),
            (Tag::GroupObj, 5),
            (Tag::Mask, 7),
            (Tag::Group(20), 4),
            (Tag::User(7), 1),
        ]);
        let bytes = a.encode();
        assert_eq!(bytes.len(), 4 + 7 * 8);
        assert_eq!(Acl::decode(&bytes).unwrap(), Some(a.clone()));
        // What setfacl sends for `u::rw-,g::r--,o::---`.
        let mut min = vec![2, 0, 0, 0];
        for (tag, perm) in [(1u16, 6u16), (4, 4), (0x20, 0)] {
            min.extend_from_slice(&tag.to_le_bytes());
            min.extend_from_slice(&perm.to_le_bytes());
            min.extend_from_slice(&u32::MAX.to_le_bytes());
        }
        let m = Acl::decode(&min).unwrap().unwrap();
        assert!(m.is_mode_only());
        assert_eq!(m.mode_bits(), 0o640);
        assert_eq!(m, Acl::from_mode(0o640));
        assert_eq!(Acl::decode(&[2, 0, 0, 0]).unwrap(), None);
        for badly in [
            &b""[..],
            &[2, 0, 0],
            &[1, 0, 0, 0],
            &bytes[..bytes.len() - 1],
        ] {
            assert!(Acl::decode(badly).is_err());
        }
        // Out of order, repeated, missing pieces, a named entry without a
        // mask, unknown tags and permission bits.
        let mut swapped = bytes.clone();
        let (first, second) = swapped[4..20].split_at_mut(8);
        first.swap_with_slice(second);
        assert!(Acl::decode(&swapped).is_err());
        let entries =
            |v: &[(Tag, u16)]| Acl::new(v.iter().map(|&(tag, perm)| Entry { tag, perm }).collect());
        assert!(entries(&[(Tag::UserObj, 7), (Tag::Other, 0)]).is_err());
        assert!(entries(&[
            (Tag::UserObj, 7),
            (Tag::GroupObj, 0),
            (Tag::Other, 0),
            (Tag::User(3), 1)
        ])
        .is_err());
        assert!(entries(&[
            (Tag::UserObj, 7),
            (Tag::UserObj, 7),
            (Tag::GroupObj, 0),
            (Tag::Other, 0)
        ])
        .is_err());
        let mut odd = min.clone();
        odd[4] = 0x40;
        assert!(Acl::decode(&odd).is_err());
        let mut perm = min.clone();
        perm[6] = 8;
        assert!(Acl::decode(&perm).is_err());
    }

    #[test]
    fn the_mode_follows_the_mask_and_chmod_follows_the_mode() {
        let mut a = acl(&[
            (Tag::UserObj, 7),
            (Tag::User(1000), 7),
            (Tag::GroupObj, 5),
            (Tag::Mask, 6),
            (Tag::Other, 1),
        ]);
        assert_eq!(a.mode_bits(), 0o761);
        assert!(!a.is_mode_only());
        a.chmod(0o504);
        assert_eq!(a.mode_bits(), 0o504);
        // The owning group entry is kept; the mask took the group bits.
        assert_eq!(
            a.entries()[2],
            Entry {
                tag: Tag::GroupObj,
                perm: 5
            }
        );
        let mut m = Acl::from_mode(0o700);
        m.chmod(0o651);
        assert_eq!(m, Acl::from_mode(0o651));
    }

    #[test]
    fn inheritance_masks_the_default_by_the_asked_mode() {
        let def = acl(&[
            (Tag::UserObj, 7),
            (Tag::User(1000), 7),
            (Tag::GroupObj, 7),
            (Tag::Mask, 7),
            (Tag::Other, 5),
        ]);
        // open(O_CREAT, 0644): the named user keeps rwx, the mask limits it.
        let (a, mode) = def.inherit(0o644);
        assert_eq!(mode, 0o644);
        assert_eq!(a.mode_bits(), 0o644);
        assert_eq!(
            a.entries()[1],
            Entry {
                tag: Tag::User(1000),
                perm: 7
            }
        );
        assert_eq!(
            a.entries()[3],
            Entry {
                tag: Tag::Mask,
                perm: 4
            }
        );
        // Bits the default denies are denied in the mode too.
        let (_, mode) = Acl::from_mode(0o750).inherit(0o777);
        assert_eq!(mode, 0o750);
        let (_, mode) = Acl::from_mode(0o750).inherit(0o4777);
        assert_eq!(mode, 0o4750, "set-ID bits are the caller's");
    }

    #[test]
    fn access_is_decided_as_linux_does() {
        let a = acl(&[
            (Tag::UserObj, 6),
            (Tag::User(1000), 7),
            (Tag::User(1001), 0),
            (Tag::GroupObj, 4),
            (Tag::Group(50), 6),
            (Tag::Mask, 6),
            (Tag::Other, 4),
        ]);
        let none = |_: u32| false;
        // Owner: its entry, no mask.
        assert!(a.permits(1, 100, 1, none, 6));
        assert!(!a.permits(1, 100, 1, none, 1));
        // A named user is masked: rw of rwx.
        assert!(a.permits(1, 100, 1000, none, 6));
        assert!(!a.permits(1, 100, 1000, none, 1));
        // A named user with nothing does not fall through to other.
        assert!(!a.permits(1, 100, 1001, none, 4));
        // Groups: any matching entry that grants; a member of a group that
        // grants nothing is not "other".
        assert!(a.permits(1, 100, 2000, |g| g == 50, 6));
        assert!(a.permits(1, 100, 2000, |g| g == 100, 4));
        assert!(!a.permits(1, 100, 2000, |g| g == 100, 2));
        let strict = acl(&[(Tag::UserObj, 7), (Tag::GroupObj, 0), (Tag::Other, 7)]);
        assert!(!strict.permits(1, 100, 2000, |g| g == 100, 4));
        assert!(strict.permits(1, 100, 2000, none, 4));
    }

    #[test]
    fn random_bytes_never_panic_and_what_decodes_encodes_back() {
        // A quick stand-in for `fuzz/fuzz_targets/acl_decode.rs` on stable:
        // valid headers followed by random entries, from a fixed seed.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut decoded = 0;
        for _ in 0..20_000 {
            // The three base entries, some named ones and a mask, usually
            // in order, sometimes not; permissions sometimes beyond rwx.
            let mut entries: Vec<(u16, u16, u32)> =
                vec![(1, 0, u32::MAX), (4, 0, u32::MAX), (0x20, 0, u32::MAX)];
            for _ in 0..next() % 4 {
                let tag = if next() % 2 == 0 { 2 } else { 8 };
                entries.push((tag, 0, (next() % 5) as u32));
            }
            if next() % 4 != 0 {
                entries.push((0x10, 0, u32::MAX));
            }
            for e in &mut entries {
                e.1 = (next() % 9) as u16;
            }
            if next() % 4 != 0 {
                entries.sort_by_key(|e| (e.0, e.2));
            }
            let mut b = vec![2, 0, 0, 0];
            for (tag, perm, id) in entries {
                b.extend_from_slice(&tag.to_le_bytes());
                b.extend_from_slice(&perm.to_le_bytes());
                b.extend_from_slice(&id.to_le_bytes());
            }
            let cut = (next() % (b.len() as u64 + 1)) as usize;
            for bytes in [&b[..], &b[..cut]] {
                if let Ok(Some(a)) = Acl::decode(bytes) {
                    decoded += 1;
                    assert_eq!(a.encode(), bytes);
                    let (mut c, _) = a.inherit(0o751);
                    c.chmod(0o640);
                    assert_eq!(Acl::decode(&c.encode()).unwrap(), Some(c));
                }
            }
        }
        assert!(decoded > 100, "only {decoded} valid ACLs generated");
    }
}
