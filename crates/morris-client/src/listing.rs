//! Listing positions that put `.` and `..` in front of a directory's
//! entries: the FUSE readdir offsets and the NFS READDIR cookies both use
//! this one scheme, so a front end keeps no listing state.
//!
//! A listing starts at position 0 and continues from the position of the
//! last entry it received. morris entries carry a cookie (never 0, stable
//! for the life of the name, increasing in listing order) meaning "continue
//! after this entry":
//!
//! | position | meaning                       | continues with          |
//! |----------|-------------------------------|-------------------------|
//! | 0        | start                         | `.`, `..`, cookie 0     |
//! | 1        | after `.`                     | `..`, cookie 0          |
//! | 2        | after `..`                    | entries from cookie 0   |
//! | c + 2    | after the entry with cookie c | entries after cookie c  |
//!
//! Since cookies are never 0, `c + 2 >= 3` never collides with the
//! positions of `.` and `..` (1 and 2, as knfsd and nfs-ganesha number
//! them); servers hand out cookies below 2^62 (`store/cookies.rs`), so every
//! one can be encoded.

/// Position of `.`: continue with `..`.
pub const AFTER_DOT: u64 = 1;
/// Position of `..`: continue with the first entry.
pub const AFTER_DOTDOT: u64 = 2;

/// Where a listing resumes for a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    /// `.` is still to be listed.
    pub dot: bool,
    /// `..` is still to be listed.
    pub dotdot: bool,
    /// Continue with the morris entries after this morris cookie.
    pub cookie: u64,
}

/// Decodes a position.
pub fn resume(cookie: u64) -> Resume {
    match cookie {
        0 => Resume {
            dot: true,
            dotdot: true,
            cookie: 0,
        },
        AFTER_DOT => Resume {
            dot: false,
            dotdot: true,
            cookie: 0,
        },
        AFTER_DOTDOT => Resume {
            dot: false,
            dotdot: false,
            cookie: 0,
        },
        n => Resume {
            dot: false,
            dotdot: false,
            cookie: n - 2,
        },
    }
}

/// The position of the entry whose cookie is `cookie`: passing it back to
/// [`resume`] continues after that entry. `None` if the cookie is invalid
/// (0) or too large to encode.
pub fn entry_position(cookie: u64) -> Option<u64> {
    if cookie == 0 {
        return None;
    }
    cookie.checked_add(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_decode() {
        assert_eq!(
            resume(0),
            Resume {
                dot: true,
                dotdot: true,
                cookie: 0
            }
        );
        assert_eq!(
            resume(AFTER_DOT),
            Resume {
                dot: false,
                dotdot: true,
                cookie: 0
            }
        );
        assert_eq!(
            resume(AFTER_DOTDOT),
            Resume {
                dot: false,
                dotdot: false,
                cookie: 0
            }
        );
        for c in [1, 2, 3, 1000, u64::MAX - 2] {
            let nfs = entry_position(c).expect("encodable");
            assert!(nfs > AFTER_DOTDOT);
            assert_eq!(
                resume(nfs),
                Resume {
                    dot: false,
                    dotdot: false,
                    cookie: c
                }
            );
        }
        assert_eq!(entry_position(0), None);
        assert_eq!(entry_position(u64::MAX - 1), None);
        assert_eq!(entry_position(u64::MAX), None);
    }
}
