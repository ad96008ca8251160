//! The morris consistency checker, as a library (the `morris-consistency`
//! binary is a thin CLI over it).
//!
//! A *workload* runs several worker processes (the same binary, hidden
//! `worker` subcommand) against one directory seen through one or more
//! *targets*: local paths (a FUSE mount of a volume, or a plain local
//! directory as the reference) or an NFSv3 export reached with a real NFS
//! client. Workers do real file-system operations for a bounded time, check
//! each result against what POSIX (or NFSv3) promises and report *violations*;
//! the coordinator then checks what needs every worker's view (final file
//! contents, freshness of reads against the writer's renames) and prints one
//! JSON summary line per workload.
//!
//! Module map: [`access`] (one trait, POSIX and NFSv3 implementations),
//! [`content`] and [`records`] (self-verifying data formats and their pure
//! verifiers), [`report`] (violations, counters, summaries), [`runner`]
//! (coordinator and worker processes), [`workloads`] (what is run and what
//! each checks), [`clock`] and [`rng`] (shared monotonic time, seeded
//! randomness).

#![warn(missing_docs)]

pub mod access;
pub mod clock;
pub mod content;
pub mod records;
pub mod report;
pub mod rng;
pub mod runner;
pub mod workloads;
