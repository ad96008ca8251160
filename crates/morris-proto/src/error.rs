//! Errors that cross the wire.

use serde::{Deserialize, Serialize};

/// A protocol-level error class. Front ends map these to errno or NFS status
/// once, at their boundary; nothing below them needs to know about either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// No such file, directory entry or inode.
    NotFound,
    /// The name already exists.
    Exists,
    /// A directory was required.
    NotDir,
    /// The operation is not allowed on a directory.
    IsDir,
    /// The directory is not empty.
    NotEmpty,
    /// Permission denied by mode bits.
    Access,
    /// Operation not permitted (ownership rules).
    Perm,
    /// Malformed or out-of-range argument.
    Invalid,
    /// A name is longer than 255 bytes.
    NameTooLong,
    /// The server's disk is full.
    NoSpace,
    /// The file handle names a file that no longer exists (generation mismatch).
    Stale,
    /// The connection names another volume, or the server is not formatted.
    WrongVolume,
    /// The server is in its lease grace period after a restart; retry shortly.
    Grace,
    /// The caller does not hold the lease the operation requires.
    NoLease,
    /// The file would exceed the largest supported size.
    FileTooBig,
    /// Too many hard links.
    TooManyLinks,
    /// Operation not supported.
    NotSupported,
    /// A frame could not be decoded or was out of protocol.
    Protocol,
    /// The server could not reach its disk or store.
    Io,
    /// The peer is unreachable or the connection was lost.
    Unavailable,
    /// This server does not serve that inode's metadata range now (it is
    /// the range's other copy, or its ownership lapsed); ask the other copy.
    NotOwner,
    /// A metadata copy is not at the position the primary expected; the
    /// primary sends a whole snapshot.
    OutOfSync,
    /// The object lies in a read-only cache of a home (cache mode `ro`).
    ReadOnly,
    /// The request names a binding (cache mode) this server has not been
    /// told of: send `OpenHome` and ask again.
    UnknownBinding,
    /// The object cannot be moved there (an object fetched from a home
    /// keeps its place: `mv` copies it instead).
    CrossDevice,
    /// The change lies under a binding whose changes wait while its home
    /// does not answer (`--on-disconnect block`): ask again later.
    HomeDown,
    /// The connection's key does not allow this (a client key sending a
    /// request only servers send), or the handshake failed.
    Denied,
    /// The bytes on the server's disk do not match their checksum (bit rot,
    /// a torn write, tampering): that copy is not served; read another.
    Corrupt,
    /// The server holds as many leases as it allows (for this client, or in
    /// all): give some back first.
    TooManyLeases,
    /// The object has no extended attribute of that name.
    NoData,
    /// Another owner holds a conflicting lock.
    WouldBlock,
    /// Waiting for that lock would close a cycle of owners waiting for
    /// each other.
    Deadlock,
    /// The caller was interrupted (a signal) while it waited.
    Interrupted,
    /// The object's owner or group is over its quota (`EDQUOT`).
    QuotaExceeded,
}

impl ErrorCode {
    /// True for ordinary answers to a caller's request (no such name, not
    /// permitted, stale handle, ...), false for failures of the volume
    /// (unreachable server, I/O, protocol): front ends log the first at debug
    /// level and the second as warnings.
    pub fn is_routine(self) -> bool {
        matches!(
            self,
            ErrorCode::NotFound
                | ErrorCode::Exists
                | ErrorCode::NotDir
                | ErrorCode::IsDir
                | ErrorCode::NotEmpty
                | ErrorCode::Access
                | ErrorCode::Perm
                | ErrorCode::Invalid
                | ErrorCode::NameTooLong
                | ErrorCode::FileTooBig
                | ErrorCode::TooManyLinks
                | ErrorCode::NotSupported
                | ErrorCode::Stale
                | ErrorCode::ReadOnly
                | ErrorCode::CrossDevice
                | ErrorCode::NoData
                | ErrorCode::WouldBlock
                | ErrorCode::Deadlock
                | ErrorCode::Interrupted
                | ErrorCode::QuotaExceeded
        )
    }

    /// A short human-readable description.
    pub fn describe(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not found",
            ErrorCode::Exists => "already exists",
            ErrorCode::NotDir => "not a directory",
            ErrorCode::IsDir => "is a directory",
            ErrorCode::NotEmpty => "directory not empty",
            ErrorCode::Access => "permission denied",
            ErrorCode::Perm => "operation not permitted",
            ErrorCode::Invalid => "invalid argument",
            ErrorCode::NameTooLong => "name too long",
            ErrorCode::NoSpace => "no space left on server",
            ErrorCode::Stale => "stale file handle",
            ErrorCode::WrongVolume => "wrong volume",
            ErrorCode::Grace => "server in lease grace period",
            ErrorCode::NoLease => "lease not held",
            ErrorCode::FileTooBig => "file too big",
            ErrorCode::TooManyLinks => "too many links",
            ErrorCode::NotSupported => "not supported",
            ErrorCode::Protocol => "protocol error",
            ErrorCode::Io => "I/O error",
            ErrorCode::Unavailable => "server unavailable",
            ErrorCode::NotOwner => "not the owner of that metadata range",
            ErrorCode::OutOfSync => "metadata copy out of sync",
            ErrorCode::ReadOnly => "read-only cache of a home",
            ErrorCode::UnknownBinding => "binding not known to this server",
            ErrorCode::CrossDevice => "cannot be moved there",
            ErrorCode::HomeDown => "home does not answer; changes wait for it",
            ErrorCode::Denied => "not allowed with this key",
            ErrorCode::Corrupt => "data failed its checksum",
            ErrorCode::TooManyLeases => "too many leases held",
            ErrorCode::NoData => "no such extended attribute",
            ErrorCode::WouldBlock => "a conflicting lock is held",
            ErrorCode::Deadlock => "waiting would deadlock",
            ErrorCode::Interrupted => "interrupted",
            ErrorCode::QuotaExceeded => "quota exceeded",
        }
    }
}

/// An error reply: a class plus a message for logs and users.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}", code.describe())]
pub struct WireError {
    /// The error class.
    pub code: ErrorCode,
    /// Detail for humans; never parsed.
    pub message: String,
}

impl WireError {
    /// Builds an error of class `code` with a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError {
            code,
            message: message.into(),
        }
    }
}
