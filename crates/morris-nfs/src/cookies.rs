//! READDIR and READDIRPLUS cookies: `.` and `..` in front of the morris
//! directory entries, numbered as FUSE numbers its offsets
//! (`morris_client::listing`, which holds the scheme and its tests).

pub(crate) use morris_client::listing::{
    entry_position as entry_cookie, resume, AFTER_DOT, AFTER_DOTDOT,
};
