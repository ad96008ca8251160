//! The one mapping from morris error classes to errno.

use fuser::Errno;
use morris_client::{Error, ErrorCode};

/// The errno the kernel gets for a morris error class.
///
/// This is the only place the FUSE front end translates error classes.
/// Transport and server-side failures (`Unavailable`, `Io`, `Protocol`,
/// `WrongVolume`, `Grace`, `NoLease`) are all `EIO` to applications: the client
/// library has already retried what can be retried.
pub(crate) fn errno(code: ErrorCode) -> Errno {
    match code {
        ErrorCode::NotFound => Errno::ENOENT,
        ErrorCode::Exists => Errno::EEXIST,
        ErrorCode::NotDir => Errno::ENOTDIR,
        ErrorCode::IsDir => Errno::EISDIR,
        ErrorCode::NotEmpty => Errno::ENOTEMPTY,
        ErrorCode::Access => Errno::EACCES,
        // The mount's key was refused (revoked or rotated away).
        ErrorCode::Denied => Errno::EACCES,
        ErrorCode::Perm => Errno::EPERM,
        ErrorCode::Invalid => Errno::EINVAL,
        ErrorCode::NameTooLong => Errno::ENAMETOOLONG,
        ErrorCode::NoSpace => Errno::ENOSPC,
        ErrorCode::Stale => Errno::ESTALE,
        ErrorCode::FileTooBig => Errno::EFBIG,
        ErrorCode::TooManyLinks => Errno::EMLINK,
        ErrorCode::NotSupported => Errno::EOPNOTSUPP,
        ErrorCode::ReadOnly => Errno::EROFS,
        ErrorCode::CrossDevice => Errno::EXDEV,
        ErrorCode::TooManyLeases => Errno::ENOLCK,
        ErrorCode::NoData => Errno::ENODATA,
        ErrorCode::WouldBlock => Errno::EAGAIN,
        ErrorCode::Deadlock => Errno::EDEADLK,
        ErrorCode::Interrupted => Errno::EINTR,
        ErrorCode::QuotaExceeded => Errno::EDQUOT,
        ErrorCode::Unavailable
        | ErrorCode::Io
        | ErrorCode::Corrupt
        | ErrorCode::Protocol
        | ErrorCode::WrongVolume
        | ErrorCode::Grace
        | ErrorCode::NoLease
        | ErrorCode::NotOwner
        | ErrorCode::OutOfSync
        | ErrorCode::UnknownBinding
        | ErrorCode::HomeDown => Errno::EIO,
    }
}

/// Logs a failed request and returns the errno to reply with.
pub(crate) fn fail(op: &'static str, ino: u64, err: &Error) -> Errno {
    let errno = errno(err.code);
    if err.code.is_routine() {
        tracing::debug!(op, ino, code = ?err.code, errno = errno.code(), message = %err.message, "request failed");
    } else {
        tracing::warn!(op, ino, code = ?err.code, errno = errno.code(), message = %err.message, "request failed");
    }
    errno
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ErrorCode; 32] = [
        ErrorCode::NotFound,
        ErrorCode::Exists,
        ErrorCode::NotDir,
        ErrorCode::IsDir,
        ErrorCode::NotEmpty,
        ErrorCode::Access,
        ErrorCode::Perm,
        ErrorCode::Invalid,
        ErrorCode::NameTooLong,
        ErrorCode::NoSpace,
        ErrorCode::Stale,
        ErrorCode::WrongVolume,
        ErrorCode::Grace,
        ErrorCode::NoLease,
        ErrorCode::FileTooBig,
        ErrorCode::TooManyLinks,
        ErrorCode::NotSupported,
        ErrorCode::Protocol,
        ErrorCode::Io,
        ErrorCode::Unavailable,
        ErrorCode::NotOwner,
        ErrorCode::OutOfSync,
        ErrorCode::ReadOnly,
        ErrorCode::UnknownBinding,
        ErrorCode::CrossDevice,
        ErrorCode::HomeDown,
        ErrorCode::TooManyLeases,
        ErrorCode::NoData,
        ErrorCode::WouldBlock,
        ErrorCode::Deadlock,
        ErrorCode::Interrupted,
        ErrorCode::QuotaExceeded,
    ];

    #[test]
    fn every_class_has_its_errno() {
        let expected = [
            libc::ENOENT,
            libc::EEXIST,
            libc::ENOTDIR,
            libc::EISDIR,
            libc::ENOTEMPTY,
            libc::EACCES,
            libc::EPERM,
            libc::EINVAL,
            libc::ENAMETOOLONG,
            libc::ENOSPC,
            libc::ESTALE,
            libc::EIO,
            libc::EIO,
            libc::EIO,
            libc::EFBIG,
            libc::EMLINK,
            libc::EOPNOTSUPP,
            libc::EIO,
            libc::EIO,
            libc::EIO,
            libc::EIO,
            libc::EIO,
            libc::EROFS,
            libc::EIO,
            libc::EXDEV,
            libc::EIO,
            libc::ENOLCK,
            libc::ENODATA,
            libc::EAGAIN,
            libc::EDEADLK,
            libc::EINTR,
            libc::EDQUOT,
        ];
        for (code, want) in ALL.iter().zip(expected) {
            assert_eq!(errno(*code).code(), want, "{code:?}");
        }
    }

    #[test]
    fn volume_failures_are_not_routine() {
        for code in ALL {
            // A stale handle is the caller's to handle (routine, as for NFS);
            // everything that maps to EIO, and a full disk, is the volume's.
            let eio = errno(code) == Errno::EIO
                || code == ErrorCode::NoSpace
                || code == ErrorCode::TooManyLeases;
            assert_eq!(code.is_routine(), !eio, "{code:?}");
        }
    }

    #[test]
    fn fail_returns_the_mapped_errno() {
        let err = Error::new(ErrorCode::NotEmpty, "dir has entries");
        assert_eq!(fail("rmdir", 7, &err), Errno::ENOTEMPTY);
    }
}
