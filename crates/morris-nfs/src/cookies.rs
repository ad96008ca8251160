//! READDIR and READDIRPLUS cookies: `.` and `..` in front of the morris
//! directory entries.
//!
//! A client starts a listing at cookie 0 and continues from the cookie of
//! the last entry it received. morris entries carry a cookie (never 0,
//! stable for the life of the entry, increasing in listing order) meaning
//! "continue after this entry". Every NFS cookie decodes on its own; the
//! gateway keeps no listing state:
//!
//! | NFS cookie | meaning                       | continues with          |
//! |------------|-------------------------------|-------------------------|
//! | 0          | start                         | `.`, `..`, cookie 0     |
//! | 1          | after `.`                     | `..`, cookie 0          |
//! | 2          | after `..`                    | entries from cookie 0   |
//! | c + 2      | after the entry with cookie c | entries after cookie c  |
//!
//! Since morris cookies are never 0, `c + 2 >= 3` never collides with the
//! cookies of `.` and `..` (1 and 2, as knfsd and nfs-ganesha give them). A
//! morris cookie above `u64::MAX - 2` cannot be represented; the server
//! allocates them upwards from 1. The FUSE adapter numbers its offsets the
//! same way (`morris-fuse/src/dirents.rs`).

/// NFS cookie of `.`: continue with `..`.
pub(crate) const AFTER_DOT: u64 = 1;
/// NFS cookie of `..`: continue with the first morris entry.
pub(crate) const AFTER_DOTDOT: u64 = 2;

/// Where a listing resumes for an NFS cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resume {
    /// `.` is still to be listed.
    pub(crate) dot: bool,
    /// `..` is still to be listed.
    pub(crate) dotdot: bool,
    /// Continue with the morris entries after this morris cookie.
    pub(crate) cookie: u64,
}

/// Decodes an NFS cookie.
pub(crate) fn resume(cookie: u64) -> Resume {
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

/// The NFS cookie of the morris entry whose cookie is `cookie`: passing it
/// back to [`resume`] continues after that entry. `None` if the cookie is
/// invalid (0) or too large to encode.
pub(crate) fn entry_cookie(cookie: u64) -> Option<u64> {
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
            let nfs = entry_cookie(c).expect("encodable");
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
        assert_eq!(entry_cookie(0), None);
        assert_eq!(entry_cookie(u64::MAX - 1), None);
        assert_eq!(entry_cookie(u64::MAX), None);
    }
}
