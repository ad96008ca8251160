//! Quotas: limits on what a user or a group stores (`morris quota set`),
//! checked by every client before it adds an inode or grows a file.
//!
//! The servers count what each user and group stores with every inode
//! change (`store/usage.rs`); the limits are kept with the root
//! directory's range (`Request::Quotas`). A client holds a verdict — who
//! is at or over an inode limit, who over a byte limit — made from both,
//! and refreshes it in the background once it is [`FRESH`] old (or, with
//! no limit set, [`FRESH_WITHOUT_LIMITS`]); only the first check of a
//! client waits for it. So a user over a limit gets `EDQUOT` from every
//! mount and gateway within a few seconds, as CephFS and JuiceFS clients
//! enforce their quotas, and may overshoot by what it writes meanwhile (or
//! what a mount still keeps under its write lease, which the servers count
//! once it is stored).
//!
//! | change | refused (`EDQUOT`) when the owner or the group |
//! |---|---|
//! | a new inode (create, mkdir, symlink, mknod, `O_TMPFILE`) | has reached its inode limit |
//! | a write or allocation past the end of a file | is over its byte limit |
//!
//! Root's own changes are not exempt (as on CephFS; ext4 exempts
//! `CAP_SYS_RESOURCE`): a limit on uid 0 holds for root too.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use morris_proto::quota::Over;
use morris_proto::{ErrorCode, QuotaLimit, Reply, Request, ROOT_ID};
use parking_lot::Mutex;

use crate::pool::unexpected;
use crate::{Client, Error, Result};

/// How old a verdict may be while some limit is set.
pub(crate) const FRESH: Duration = Duration::from_secs(2);
/// How old it may be while none is.
pub(crate) const FRESH_WITHOUT_LIMITS: Duration = Duration::from_secs(10);

pub(crate) use morris_proto::quota::Charge;

/// Who is over a limit, as of `at`.
#[derive(Debug, Default)]
struct Verdict {
    at: Option<Instant>,
    limits: bool,
    over: Over,
    /// (group, id) with an inode limit set.
    inode_limited: HashSet<(bool, i64)>,
}

/// A client's view of the quotas.
#[derive(Debug, Default)]
pub(crate) struct QuotaState {
    verdict: Mutex<Verdict>,
    refreshing: AtomicBool,
}

impl QuotaState {
    /// `Some(stale)` if a verdict exists, `None` before the first.
    fn stale(&self) -> Option<bool> {
        let v = self.verdict.lock();
        let at = v.at?;
        let fresh = if v.limits {
            FRESH
        } else {
            FRESH_WITHOUT_LIMITS
        };
        Some(at.elapsed() > fresh)
    }

    /// True if `uid` or `gid` has an inode limit: its new inodes are then
    /// made before the create answers, not after (`fs/reserved.rs`), so
    /// that a server's refusal (its verdict may be newer than this
    /// client's) reaches the caller as `EDQUOT` from the create itself.
    fn inode_limited(&self, uid: u32, gid: u32) -> bool {
        let v = self.verdict.lock();
        v.inode_limited.contains(&(false, i64::from(uid)))
            || v.inode_limited.contains(&(true, i64::from(gid)))
    }

    /// Refuses `charge` for an object of `uid` and `gid` if either is over.
    fn check(&self, uid: u32, gid: u32, charge: Charge) -> Result<()> {
        let v = self.verdict.lock();
        if !v.limits {
            return Ok(());
        }
        match v.over.refusal(uid, gid, charge) {
            Some(why) => Err(Error::new(ErrorCode::QuotaExceeded, why)),
            None => Ok(()),
        }
    }
}

/// Who `limits` put over, given `usage`.
fn verdict(limits: &[QuotaLimit], usage: &[morris_proto::UsageRow]) -> Verdict {
    Verdict {
        at: Some(Instant::now()),
        limits: !limits.is_empty(),
        over: Over::of(limits, usage),
        inode_limited: limits
            .iter()
            .filter(|l| l.inodes != 0)
            .map(|l| (l.group, l.id))
            .collect(),
    }
}

impl Client {
    /// Every limit set on the volume.
    pub async fn quotas(&self) -> Result<Vec<QuotaLimit>> {
        match self.call_owner_now(ROOT_ID, Request::Quotas).await? {
            Reply::Quotas(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    /// Sets a user's or a group's limits (both 0: removes them); needs the
    /// volume key. Every client applies them within `FRESH` or
    /// `FRESH_WITHOUT_LIMITS` (2 s, 10 s).
    pub async fn set_quota(&self, limit: QuotaLimit) -> Result<()> {
        match self
            .call_owner_now(ROOT_ID, Request::SetQuota { limit })
            .await?
        {
            Reply::Ok => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Refuses `charge` for an object owned by `uid` and `gid` if either is
    /// over its quota (see the module's table).
    pub(crate) async fn check_quota(&self, uid: u32, gid: u32, charge: Charge) -> Result<()> {
        self.verdict_fresh().await;
        self.quota.check(uid, gid, charge)
    }

    /// Makes sure a verdict is there and refreshing when stale.
    async fn verdict_fresh(&self) {
        match self.quota.stale() {
            None => {
                // A client's first check waits for the verdict, once: if
                // it cannot be had (a range unanswered), nothing is
                // refused until a background refresh gets one, rather
                // than every change waiting for the servers again.
                if let Err(e) = self.refresh_quotas().await {
                    tracing::warn!(error = %e, "quotas not known yet; not checked until they are");
                }
            }
            Some(true) => self.refresh_quotas_later(),
            Some(false) => {}
        }
    }

    /// Whether any quota limit is set on the volume (as of the verdict):
    /// without one, [`Client::check_chown_quota`] refuses nothing, so a
    /// caller need not gather what it checks.
    pub(crate) async fn quota_limits_set(&self) -> bool {
        self.verdict_fresh().await;
        self.quota.verdict.lock().limits
    }

    /// A change of owner or group charges the new one with the object (as
    /// ext4's `chown` does): refused if a new owner or group is at its
    /// inode limit, or over its byte limit while the object holds bytes.
    pub(crate) async fn check_chown_quota(
        &self,
        cur: &morris_proto::Inode,
        set: &morris_proto::SetAttr,
    ) -> Result<()> {
        let new_uid = set.uid.filter(|&u| u != cur.attr.uid);
        let new_gid = set.gid.filter(|&g| g != cur.attr.gid);
        if new_uid.is_none() && new_gid.is_none() {
            return Ok(());
        }
        self.verdict_fresh().await;
        let holds_bytes = cur.attr.size > 0 || cur.alloc.is_some_and(|a| a > 0);
        let v = self.quota.verdict.lock();
        if !v.limits {
            return Ok(());
        }
        for (group, id) in [(false, new_uid), (true, new_gid)] {
            let Some(id) = id else { continue };
            let why = v.over.refusal_of(group, id, Charge::Inode).or_else(|| {
                holds_bytes
                    .then(|| v.over.refusal_of(group, id, Charge::Bytes))
                    .flatten()
            });
            if let Some(why) = why {
                return Err(Error::new(ErrorCode::QuotaExceeded, why));
            }
        }
        Ok(())
    }

    /// See [`QuotaState::inode_limited`].
    pub(crate) fn inode_limited(&self, uid: u32, gid: u32) -> bool {
        self.quota.inode_limited(uid, gid)
    }

    fn refresh_quotas_later(&self) {
        if self.quota.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(me) = self.me.get().and_then(std::sync::Weak::upgrade) else {
            self.quota.refreshing.store(false, Ordering::Release);
            return;
        };
        tokio::spawn(async move {
            if let Err(e) = me.refresh_quotas().await {
                tracing::debug!(error = %e, "quotas not refreshed; the last verdict stands");
            }
            me.quota.refreshing.store(false, Ordering::Release);
        });
    }

    /// Makes a new verdict; if that fails, the last one stands (or none:
    /// nothing refused) until the next try, a refresh interval later.
    async fn refresh_quotas(&self) -> Result<()> {
        let got = async {
            let limits = self.quotas().await?;
            let usage = if limits.is_empty() {
                Vec::new()
            } else {
                self.usage().await?
            };
            Ok::<_, Error>(verdict(&limits, &usage))
        }
        .await;
        let mut v = self.quota.verdict.lock();
        match got {
            Ok(new) => {
                *v = new;
                Ok(())
            }
            Err(e) => {
                v.at = Some(Instant::now());
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use morris_proto::UsageRow;

    #[test]
    fn a_client_refuses_only_while_a_limit_is_set() {
        let limits = [QuotaLimit {
            group: false,
            id: 1000,
            inodes: 3,
            bytes: 0,
        }];
        let usage = [UsageRow {
            group: false,
            id: 1000,
            inodes: 3,
            bytes: 0,
        }];
        let s = QuotaState {
            verdict: Mutex::new(verdict(&limits, &usage)),
            refreshing: AtomicBool::new(false),
        };
        let e = s.check(1000, 1, Charge::Inode).unwrap_err();
        assert_eq!(e.code, ErrorCode::QuotaExceeded);
        assert!(s.check(1001, 1, Charge::Inode).is_ok());
        assert!(QuotaState::default().check(1000, 1, Charge::Inode).is_ok());
    }
}
