//! The one mapping from morris error classes to NFSv3 status codes.

use morris_client::{Error, ErrorCode};
use nfs3_server::nfs3_types::nfs3::nfsstat3;

/// The NFSv3 status a morris error class is answered with.
///
/// This is the only place the gateway translates error classes. Transport
/// and server-side failures (`Unavailable`, `Io`, `Protocol`, `WrongVolume`,
/// `NoLease`) are `NFS3ERR_IO`; `Grace` is `NFS3ERR_JUKEBOX` so that clients
/// retry after the servers' grace period instead of failing.
pub fn nfsstat(code: ErrorCode) -> nfsstat3 {
    match code {
        ErrorCode::NotFound => nfsstat3::NFS3ERR_NOENT,
        ErrorCode::Exists => nfsstat3::NFS3ERR_EXIST,
        ErrorCode::NotDir => nfsstat3::NFS3ERR_NOTDIR,
        ErrorCode::IsDir => nfsstat3::NFS3ERR_ISDIR,
        ErrorCode::NotEmpty => nfsstat3::NFS3ERR_NOTEMPTY,
        ErrorCode::Access => nfsstat3::NFS3ERR_ACCES,
        ErrorCode::Denied => nfsstat3::NFS3ERR_ACCES,
        ErrorCode::Perm => nfsstat3::NFS3ERR_PERM,
        ErrorCode::Invalid => nfsstat3::NFS3ERR_INVAL,
        ErrorCode::NameTooLong => nfsstat3::NFS3ERR_NAMETOOLONG,
        ErrorCode::NoSpace => nfsstat3::NFS3ERR_NOSPC,
        ErrorCode::QuotaExceeded => nfsstat3::NFS3ERR_DQUOT,
        ErrorCode::Stale => nfsstat3::NFS3ERR_STALE,
        ErrorCode::FileTooBig => nfsstat3::NFS3ERR_FBIG,
        ErrorCode::TooManyLinks => nfsstat3::NFS3ERR_MLINK,
        ErrorCode::NotSupported => nfsstat3::NFS3ERR_NOTSUPP,
        ErrorCode::ReadOnly => nfsstat3::NFS3ERR_ROFS,
        ErrorCode::CrossDevice => nfsstat3::NFS3ERR_XDEV,
        // NFSv3 has no extended attributes; the gateway never asks.
        ErrorCode::NoData => nfsstat3::NFS3ERR_NOTSUPP,
        // Locks are NLM's, which the gateway does not serve.
        ErrorCode::WouldBlock | ErrorCode::Deadlock | ErrorCode::Interrupted => {
            nfsstat3::NFS3ERR_IO
        }
        ErrorCode::Grace | ErrorCode::NotOwner | ErrorCode::HomeDown => nfsstat3::NFS3ERR_JUKEBOX,
        ErrorCode::Unavailable
        | ErrorCode::Io
        | ErrorCode::Corrupt
        | ErrorCode::TooManyLeases
        | ErrorCode::Protocol
        | ErrorCode::WrongVolume
        | ErrorCode::NoLease
        | ErrorCode::OutOfSync
        | ErrorCode::UnknownBinding => nfsstat3::NFS3ERR_IO,
    }
}

/// Logs a failed request and returns the status to answer with.
pub(crate) fn fail(op: &'static str, id: u64, err: &Error) -> nfsstat3 {
    let stat = nfsstat(err.code);
    if err.code.is_routine() {
        tracing::debug!(op, id, code = ?err.code, ?stat, message = %err.message, "nfs request failed");
    } else {
        tracing::warn!(op, id, code = ?err.code, ?stat, message = %err.message, "nfs request failed");
    }
    stat
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_codes_map_to_their_nfs_twins() {
        assert_eq!(nfsstat(ErrorCode::NotFound), nfsstat3::NFS3ERR_NOENT);
        assert_eq!(nfsstat(ErrorCode::Stale), nfsstat3::NFS3ERR_STALE);
        assert_eq!(nfsstat(ErrorCode::Access), nfsstat3::NFS3ERR_ACCES);
        assert_eq!(nfsstat(ErrorCode::NotEmpty), nfsstat3::NFS3ERR_NOTEMPTY);
        // RMDIR of a non-directory, REMOVE of a directory.
        assert_eq!(nfsstat(ErrorCode::NotDir), nfsstat3::NFS3ERR_NOTDIR);
        assert_eq!(nfsstat(ErrorCode::IsDir), nfsstat3::NFS3ERR_ISDIR);
        assert_eq!(nfsstat(ErrorCode::Grace), nfsstat3::NFS3ERR_JUKEBOX);
        assert_eq!(nfsstat(ErrorCode::Unavailable), nfsstat3::NFS3ERR_IO);
    }
}
