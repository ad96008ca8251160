//! The workloads: what each runs, on which targets, and the promise it
//! checks (each module's doc comment states it precisely).
//!
//! | workload | module | over NFS |
//! |---|---|---|
//! | `append` | [`append`] | no: O_APPEND has no NFSv3 meaning |
//! | `rename-replace` | [`rename_replace`] | yes (writer and readers) |
//! | `create-unlink` | [`create_unlink`] | yes (creator and observers) |
//! | `open-unlinked` | [`open_unlinked`] | as the unlinker/renamer only: holders need an open descriptor |
//! | `listing` | [`listing`] | yes (renamers and listers, READDIRPLUS) |
//! | `sqlite` | [`sqlite`] | no: needs POSIX locks |

pub mod append;
pub mod create_unlink;
pub mod listing;
pub mod open_unlinked;
pub mod rename_replace;
pub mod sqlite;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::access::{Access, FsError, TargetSpec};
use crate::runner::{CoordCtx, RolePlan, WorkerCtx};

/// Knobs shared by the workloads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Params {
    /// Worker processes of the main role (readers, observers, listers,
    /// appenders, SQLite clients).
    pub procs: usize,
    /// `sqlite`: spread the processes over every mount (needs POSIX locks
    /// that work across mounts), instead of all on the first.
    pub sqlite_all_mounts: bool,
    /// `listing`: names that always exist in the directory, untouched.
    pub stable_names: usize,
    /// `listing`: names that always exist but are renamed over.
    pub replaced_names: usize,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            procs: 4,
            sqlite_all_mounts: false,
            stable_names: 200,
            replaced_names: 100,
        }
    }
}

/// One workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Concurrent and turn-taking O_APPEND writers on one file.
    Append,
    /// Write a temporary file, rename it over `target`; readers read `target`.
    RenameReplace,
    /// Create/unlink loops with concurrent stat/open/read.
    CreateUnlink,
    /// Files unlinked or renamed over while open elsewhere.
    OpenUnlinked,
    /// Listing a directory while names in it are replaced and churned.
    Listing,
    /// SQLite transactions from several processes (rollback journal).
    Sqlite,
}

impl Workload {
    /// Every workload, in the order `all` runs them.
    pub const ALL: [Workload; 6] = [
        Workload::Append,
        Workload::RenameReplace,
        Workload::CreateUnlink,
        Workload::OpenUnlinked,
        Workload::Listing,
        Workload::Sqlite,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Append => "append",
            Workload::RenameReplace => "rename-replace",
            Workload::CreateUnlink => "create-unlink",
            Workload::OpenUnlinked => "open-unlinked",
            Workload::Listing => "listing",
            Workload::Sqlite => "sqlite",
        }
    }

    /// Why this workload cannot use target `t`, if it cannot.
    pub fn not_on(self, t: &TargetSpec) -> Option<String> {
        match (self, t.is_nfs()) {
            (Workload::Append, true) => {
                Some("append is POSIX-only (O_APPEND has no NFSv3 meaning)".into())
            }
            (Workload::Sqlite, true) => {
                Some("sqlite is POSIX-only (it needs POSIX locks; NFSv3 has none)".into())
            }
            _ => None,
        }
    }

    /// Why the workload cannot run on these (applicable) targets at all.
    pub fn needs(self, targets: &[&TargetSpec]) -> Option<String> {
        if targets.is_empty() {
            return Some(format!("{}: no target it can use", self.name()));
        }
        if self == Workload::OpenUnlinked && targets.iter().all(|t| t.is_nfs()) {
            return Some(
                "open-unlinked needs a POSIX target: the file is held open by a descriptor".into(),
            );
        }
        None
    }

    /// A remark printed with the summary.
    pub fn note(self, ctx: &CoordCtx) -> Option<String> {
        match self {
            Workload::Sqlite => Some(sqlite::note(ctx)),
            Workload::OpenUnlinked if ctx.targets.iter().any(TargetSpec::is_nfs) => {
                Some("NFS targets only unlink/rename (NFSv3 has no open state to hold)".into())
            }
            _ => None,
        }
    }

    /// Creates the files the workers start from (through the first target).
    pub fn setup(
        self,
        ctx: &mut CoordCtx,
        home: &mut dyn Access,
    ) -> Result<serde_json::Value, FsError> {
        match self {
            Workload::Append => Ok(serde_json::Value::Null),
            Workload::RenameReplace => rename_replace::setup(ctx, home),
            Workload::CreateUnlink => Ok(serde_json::Value::Null),
            Workload::OpenUnlinked => Ok(serde_json::Value::Null),
            Workload::Listing => listing::setup(ctx, home),
            Workload::Sqlite => sqlite::setup(ctx, home),
        }
    }

    /// The workers: role, index and target of each.
    pub fn plan(self, ctx: &CoordCtx) -> Vec<RolePlan> {
        match self {
            Workload::Append => append::plan(ctx),
            Workload::RenameReplace => rename_replace::plan(ctx),
            Workload::CreateUnlink => create_unlink::plan(ctx),
            Workload::OpenUnlinked => open_unlinked::plan(ctx),
            Workload::Listing => listing::plan(ctx),
            Workload::Sqlite => sqlite::plan(ctx),
        }
    }

    /// Runs one worker (in its own process).
    pub fn work(self, w: &mut WorkerCtx) -> anyhow::Result<()> {
        match self {
            Workload::Append => append::work(w),
            Workload::RenameReplace => rename_replace::work(w),
            Workload::CreateUnlink => create_unlink::work(w),
            Workload::OpenUnlinked => open_unlinked::work(w),
            Workload::Listing => listing::work(w),
            Workload::Sqlite => sqlite::work(w),
        }
    }

    /// The checks that need every worker's report (and the final state).
    pub fn verify(
        self,
        ctx: &mut CoordCtx,
        reports: &[crate::report::WorkerReport],
        home: &mut dyn Access,
    ) {
        match self {
            Workload::Append => append::verify(ctx, reports),
            Workload::RenameReplace => rename_replace::verify(ctx, reports),
            Workload::CreateUnlink => create_unlink::verify(ctx, reports),
            Workload::OpenUnlinked => {}
            Workload::Listing => listing::verify(ctx, reports),
            Workload::Sqlite => sqlite::verify(ctx, reports, home),
        }
    }
}

/// Workers of `role`, `n` of them, spread round-robin over `targets`
/// starting at `first`.
pub(crate) fn spread(role: &str, n: usize, targets: &[usize], first: usize) -> Vec<RolePlan> {
    (0..n)
        .map(|i| RolePlan {
            role: role.to_string(),
            index: i,
            target: targets
                .get((first + i) % targets.len().max(1))
                .copied()
                .unwrap_or(0),
        })
        .collect()
}

/// Sorted numbers as inclusive ranges (compact JSON for sequence numbers).
pub(crate) fn to_ranges(set: &BTreeSet<u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &x in set {
        match out.last_mut() {
            Some((_, hi)) if *hi + 1 == x => *hi = x,
            _ => out.push((x, x)),
        }
    }
    out
}

/// The numbers of inclusive ranges.
pub(crate) fn from_ranges(r: &[(u64, u64)]) -> BTreeSet<u64> {
    r.iter().flat_map(|(a, b)| *a..=*b).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_trip() {
        let s: BTreeSet<u64> = [1, 2, 3, 7, 9, 10].into_iter().collect();
        let r = to_ranges(&s);
        assert_eq!(r, vec![(1, 3), (7, 7), (9, 10)]);
        assert_eq!(from_ranges(&r), s);
    }

    #[test]
    fn names_match_the_command_line() {
        use clap::ValueEnum;
        for w in Workload::ALL {
            let pv = w.to_possible_value().expect("a value");
            assert_eq!(pv.get_name(), w.name());
        }
    }
}
