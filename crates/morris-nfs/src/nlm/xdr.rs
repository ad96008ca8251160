//! The NLM v4 and NSM v1 messages the gateway decodes and answers (the
//! Open Group's XNFS, "Network Lock Manager Protocol", version 4; NSM's
//! `SM_NOTIFY`), as XDR types. Signed XDR `int`s (`svid`, `state`) are
//! carried as `u32`: the bits are the same and no arithmetic is done on them.

#![allow(non_camel_case_types)]

use std::io::{Read, Write};

use nfs3_types::xdr_codec::{Opaque, Pack, Result as XdrResult, Unpack, XdrCodec};

/// NLM's RPC program number.
pub(crate) const NLM_PROGRAM: u32 = 100_021;
/// The NLM version NFSv3 clients use.
pub(crate) const NLM_V4: u32 = 4;
/// NSM (status monitor) program number.
pub(crate) const NSM_PROGRAM: u32 = 100_024;
/// NSM's version.
pub(crate) const NSM_V1: u32 = 1;

/// NLM v4 procedures the gateway knows.
pub(crate) mod proc4 {
    pub(crate) const NULL: u32 = 0;
    pub(crate) const TEST: u32 = 1;
    pub(crate) const LOCK: u32 = 2;
    pub(crate) const CANCEL: u32 = 3;
    pub(crate) const UNLOCK: u32 = 4;
    pub(crate) const GRANTED: u32 = 5;
    pub(crate) const FREE_ALL: u32 = 23;
}

/// NSM procedures the gateway knows.
pub(crate) mod nsm_proc {
    pub(crate) const NULL: u32 = 0;
    pub(crate) const NOTIFY: u32 = 6;
}

/// `nlm4_stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, XdrCodec)]
#[repr(u32)]
pub(crate) enum nlm4_stats {
    NLM4_GRANTED = 0,
    NLM4_DENIED = 1,
    NLM4_DENIED_NOLOCKS = 2,
    NLM4_BLOCKED = 3,
    NLM4_DENIED_GRACE_PERIOD = 4,
    NLM4_DEADLCK = 5,
    NLM4_ROFS = 6,
    NLM4_STALE_FH = 7,
    NLM4_FBIG = 8,
    NLM4_FAILED = 9,
}

/// `nlm4_lock`: who locks which bytes of which file.
#[derive(Debug, Clone, XdrCodec)]
pub(crate) struct nlm4_lock {
    /// The client host's name (as its NSM knows it).
    pub caller_name: Opaque<'static>,
    /// The NFS file handle.
    pub fh: Opaque<'static>,
    /// The owner handle (opaque to the server).
    pub oh: Opaque<'static>,
    /// The owner's id on its host (a process id, for Linux).
    pub svid: u32,
    pub l_offset: u64,
    /// 0: to the end of the file, however far it grows.
    pub l_len: u64,
}

/// `nlm4_lockargs`.
#[derive(Debug, Clone, XdrCodec)]
pub(crate) struct nlm4_lockargs {
    pub cookie: Opaque<'static>,
    pub block: bool,
    pub exclusive: bool,
    pub alock: nlm4_lock,
    pub reclaim: bool,
    pub state: u32,
}

/// `nlm4_cancargs`.
#[derive(Debug, Clone, XdrCodec)]
pub(crate) struct nlm4_cancargs {
    pub cookie: Opaque<'static>,
    pub block: bool,
    pub exclusive: bool,
    pub alock: nlm4_lock,
}

/// `nlm4_testargs` (also the arguments of the `GRANTED` callback).
#[derive(Debug, Clone, XdrCodec)]
pub(crate) struct nlm4_testargs {
    pub cookie: Opaque<'static>,
    pub exclusive: bool,
    pub alock: nlm4_lock,
}

/// `nlm4_unlockargs`.
#[derive(Debug, Clone, XdrCodec)]
pub(crate) struct nlm4_unlockargs {
    pub cookie: Opaque<'static>,
    pub alock: nlm4_lock,
}

/// `nlm4_res`: the answer to LOCK, CANCEL, UNLOCK and GRANTED.
#[derive(Debug, Clone, XdrCodec)]
pub(crate) struct nlm4_res {
    pub cookie: Opaque<'static>,
    pub stat: nlm4_stats,
}

/// `nlm4_holder`: the lock a TEST ran into.
#[derive(Debug, Clone, XdrCodec)]
pub(crate) struct nlm4_holder {
    pub exclusive: bool,
    pub svid: u32,
    pub oh: Opaque<'static>,
    pub l_offset: u64,
    pub l_len: u64,
}

/// `nlm4_testres`: `stat` with the holder when it is `NLM4_DENIED`.
#[derive(Debug, Clone)]
pub(crate) struct nlm4_testres {
    pub cookie: Opaque<'static>,
    pub stat: nlm4_stats,
    /// Present exactly when `stat` is `NLM4_DENIED`.
    pub holder: Option<nlm4_holder>,
}

impl Pack for nlm4_testres {
    fn packed_size(&self) -> usize {
        self.cookie.packed_size()
            + self.stat.packed_size()
            + self.holder.as_ref().map_or(0, Pack::packed_size)
    }

    fn pack(&self, out: &mut impl Write) -> XdrResult<usize> {
        let mut n = self.cookie.pack(out)? + self.stat.pack(out)?;
        if self.stat == nlm4_stats::NLM4_DENIED {
            let h = self.holder.clone().unwrap_or(nlm4_holder {
                exclusive: true,
                svid: 0,
                oh: Opaque::owned(Vec::new()),
                l_offset: 0,
                l_len: 0,
            });
            n += h.pack(out)?;
        }
        Ok(n)
    }
}

impl Unpack for nlm4_testres {
    fn unpack(input: &mut impl Read) -> XdrResult<(Self, usize)> {
        let (cookie, a) = Opaque::unpack(input)?;
        let (stat, b) = nlm4_stats::unpack(input)?;
        let (holder, c) = if stat == nlm4_stats::NLM4_DENIED {
            let (h, c) = nlm4_holder::unpack(input)?;
            (Some(h), c)
        } else {
            (None, 0)
        };
        Ok((
            nlm4_testres {
                cookie,
                stat,
                holder,
            },
            a + b + c,
        ))
    }
}

/// `nlm4_notify` (FREE_ALL) and NSM's `stat_chge` (SM_NOTIFY): host `name`
/// restarted, its NSM state is now `state`.
#[derive(Debug, Clone, XdrCodec)]
pub(crate) struct host_state {
    pub name: Opaque<'static>,
    pub state: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn a_test_reply_carries_the_holder_only_when_denied() {
        let denied = nlm4_testres {
            cookie: Opaque::owned(vec![1, 2, 3]),
            stat: nlm4_stats::NLM4_DENIED,
            holder: Some(nlm4_holder {
                exclusive: true,
                svid: 77,
                oh: Opaque::owned(Vec::new()),
                l_offset: 10,
                l_len: 5,
            }),
        };
        let mut buf = Vec::new();
        let n = denied.pack(&mut buf).unwrap();
        // cookie (4 + 4), stat 4, exclusive 4, svid 4, oh 4, offset 8, len 8.
        assert_eq!((n, buf.len(), denied.packed_size()), (40, 40, 40));
        let (back, m) = nlm4_testres::unpack(&mut Cursor::new(&buf)).unwrap();
        assert_eq!(m, 40);
        let h = back.holder.unwrap();
        assert_eq!(
            (h.svid, h.l_offset, h.l_len, h.exclusive),
            (77, 10, 5, true)
        );

        let granted = nlm4_testres {
            cookie: Opaque::owned(vec![]),
            stat: nlm4_stats::NLM4_GRANTED,
            holder: None,
        };
        let mut buf = Vec::new();
        assert_eq!(granted.pack(&mut buf).unwrap(), 8);
    }

    #[test]
    fn lock_arguments_decode_as_a_client_sends_them() {
        let mut b = Vec::new();
        let word = |b: &mut Vec<u8>, w: u32| b.extend_from_slice(&w.to_be_bytes());
        word(&mut b, 4);
        b.extend_from_slice(b"ck01"); // cookie
        word(&mut b, 1); // block
        word(&mut b, 1); // exclusive
        word(&mut b, 5);
        b.extend_from_slice(b"hosts\0\0\0"); // caller_name, padded to 8
        word(&mut b, 2);
        b.extend_from_slice(&[9, 9, 0, 0]); // fh
        word(&mut b, 0); // oh
        word(&mut b, 1234); // svid
        b.extend_from_slice(&100u64.to_be_bytes());
        b.extend_from_slice(&0u64.to_be_bytes());
        word(&mut b, 0); // reclaim
        word(&mut b, 3); // state
        let (a, n) = nlm4_lockargs::unpack(&mut Cursor::new(&b)).unwrap();
        assert_eq!(n, b.len());
        assert!(a.block && a.exclusive && !a.reclaim);
        assert_eq!(a.alock.caller_name.as_ref(), b"hosts");
        assert_eq!(a.alock.fh.as_ref(), &[9, 9]);
        assert_eq!(
            (a.alock.svid, a.alock.l_offset, a.alock.l_len, a.state),
            (1234, 100, 0, 3)
        );
        // Cut short anywhere: an error, never a panic.
        for cut in 0..b.len() {
            assert!(nlm4_lockargs::unpack(&mut Cursor::new(&b[..cut])).is_err());
        }
    }
}
