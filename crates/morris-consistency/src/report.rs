//! What runs report: [`Violation`]s (a broken promise, with who, where,
//! what and expected vs got), per-worker counters ([`WorkerReport`]) and the
//! per-workload [`Summary`] printed as one JSON line.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::access::FsError;

/// Most violations a worker keeps in full (all are counted).
pub const KEEP_VIOLATIONS: usize = 200;
/// Violations printed per workload.
pub const PRINT_VIOLATIONS: usize = 20;

/// A broken promise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    /// Short class, e.g. `open-enoent`, `zero-read`, `duplicate-name`.
    pub kind: String,
    /// The process that saw it, e.g. `reader#2 (pid 4242)`, or `coordinator`.
    pub worker: String,
    /// The target (mount, NFS export) it went through.
    pub target: String,
    /// The operation, e.g. `read target`.
    pub op: String,
    /// Expected vs got.
    pub detail: String,
    /// Seconds since the workload started.
    pub t: f64,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{}] t={:.3}s {} via {}: {}: {}",
            self.kind, self.t, self.worker, self.target, self.op, self.detail
        )
    }
}

/// Operation and error counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// Operations done, by kind (`open`, `read`, `rename`, ...).
    pub ops: BTreeMap<String, u64>,
    /// Errors seen, by errno name, allowed or not.
    pub errors: BTreeMap<String, u64>,
    /// Errors or outcomes that the promise allows, by what they were.
    pub allowed: BTreeMap<String, u64>,
}

impl Counters {
    /// Adds `other` into these counters.
    pub fn merge(&mut self, other: &Counters) {
        for (k, v) in &other.ops {
            *self.ops.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.allowed {
            *self.allowed.entry(k.clone()).or_default() += v;
        }
    }

    /// Total operations.
    pub fn total_ops(&self) -> u64 {
        self.ops.values().sum()
    }
}

/// What one worker process did and saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Who it was, e.g. `reader#2 (pid 4242)`.
    pub worker: String,
    /// Its target's label.
    pub target: String,
    /// Its counters.
    pub counters: Counters,
    /// The first [`KEEP_VIOLATIONS`] violations it saw.
    pub violations: Vec<Violation>,
    /// How many it saw.
    pub violation_count: u64,
    /// How many of each kind.
    pub violations_by_kind: BTreeMap<String, u64>,
    /// Workload-specific facts the coordinator checks afterwards.
    pub data: serde_json::Value,
}

impl WorkerReport {
    /// Counts one operation of `kind`.
    pub fn op(&mut self, kind: &str) {
        *self.counters.ops.entry(kind.to_string()).or_default() += 1;
    }

    /// Counts an error by its errno name.
    pub fn error(&mut self, e: &FsError) {
        *self.counters.errors.entry(e.code.name.clone()).or_default() += 1;
    }

    /// Counts an allowed outcome.
    pub fn allowed(&mut self, what: &str) {
        *self.counters.allowed.entry(what.to_string()).or_default() += 1;
    }

    /// Records a violation.
    pub fn violation(&mut self, v: Violation) {
        self.violation_count += 1;
        *self.violations_by_kind.entry(v.kind.clone()).or_default() += 1;
        if self.violations.len() < KEEP_VIOLATIONS {
            self.violations.push(v);
        }
    }
}

/// One workload's outcome: the JSON line printed for it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    /// The workload's name.
    pub workload: String,
    /// The seed.
    pub seed: u64,
    /// The duration asked for, in seconds.
    pub seconds: f64,
    /// Worker processes asked for.
    pub procs: usize,
    /// The targets it ran on.
    pub targets: Vec<String>,
    /// Targets left out, and why (e.g. POSIX-only over NFS).
    pub not_applicable: Vec<String>,
    /// Why the workload did not run at all, if it did not.
    pub skipped: Option<String>,
    /// Something to know when reading the numbers.
    pub note: Option<String>,
    /// Worker processes run.
    pub workers: usize,
    /// Total operations.
    pub ops: u64,
    /// Operations by kind.
    pub ops_by_kind: BTreeMap<String, u64>,
    /// Errors by errno name (allowed or not).
    pub errors: BTreeMap<String, u64>,
    /// Allowed errors and outcomes, by what they were.
    pub allowed: BTreeMap<String, u64>,
    /// Number of violations.
    pub violations: u64,
    /// Violations by kind.
    pub violations_by_kind: BTreeMap<String, u64>,
    /// Up to 20 violations as text, in time order: the first of each kind,
    /// then the earliest others.
    pub first_violations: Vec<String>,
    /// Cleaning the run directory up failed (not a violation).
    pub cleanup_error: Option<String>,
    /// Wall-clock seconds the workload took, setup and checks included.
    pub elapsed_s: f64,
    /// The command that replays this workload with the same seed.
    pub replay: String,
}

impl Summary {
    /// Folds the reports (workers' and the coordinator's) in.
    pub fn absorb(&mut self, reports: &[WorkerReport]) {
        let mut counters = Counters::default();
        let mut all: Vec<&Violation> = Vec::new();
        for r in reports {
            counters.merge(&r.counters);
            self.violations += r.violation_count;
            for (k, v) in &r.violations_by_kind {
                *self.violations_by_kind.entry(k.clone()).or_default() += v;
            }
            all.extend(r.violations.iter());
        }
        all.sort_by(|a, b| a.t.total_cmp(&b.t));
        // The earliest of each kind first (so that every kind has an
        // example), then the earliest others; printed in time order.
        let mut pick: Vec<usize> = Vec::new();
        let mut kinds = std::collections::BTreeSet::new();
        for (i, v) in all.iter().enumerate() {
            if pick.len() < PRINT_VIOLATIONS && kinds.insert(v.kind.as_str()) {
                pick.push(i);
            }
        }
        for i in 0..all.len() {
            if pick.len() >= PRINT_VIOLATIONS {
                break;
            }
            if !pick.contains(&i) {
                pick.push(i);
            }
        }
        pick.sort_unstable();
        self.first_violations = pick.iter().map(|i| all[*i].to_string()).collect();
        self.ops = counters.total_ops();
        self.ops_by_kind = counters.ops;
        self.errors = counters.errors;
        self.allowed = counters.allowed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(kind: &str, t: f64) -> Violation {
        Violation {
            kind: kind.into(),
            worker: "w".into(),
            target: "mount#0 /x".into(),
            op: "op".into(),
            detail: "d".into(),
            t,
        }
    }

    fn s_reports() -> WorkerReport {
        let mut a = WorkerReport::default();
        for i in 0..50 {
            a.violation(v("zero-read", i as f64));
        }
        a
    }

    #[test]
    fn summaries_count_everything_and_print_the_earliest() {
        let mut a = WorkerReport::default();
        a.op("read");
        a.op("read");
        for i in 0..(KEEP_VIOLATIONS + 5) {
            a.violation(v("zero-read", 10.0 + i as f64));
        }
        let mut b = WorkerReport::default();
        b.op("rename");
        b.violation(v("rename-failed", 1.0));
        let mut c = WorkerReport::default();
        c.violation(v("stale-read", 0.5));
        let mut s = Summary::default();
        s.absorb(&[a, b, c]);
        assert_eq!(s.ops, 3);
        assert_eq!(s.violations, KEEP_VIOLATIONS as u64 + 7);
        assert_eq!(
            s.violations_by_kind["zero-read"],
            KEEP_VIOLATIONS as u64 + 5
        );
        assert_eq!(s.first_violations.len(), PRINT_VIOLATIONS);
        assert!(s.first_violations[0].starts_with("[stale-read]"));
        assert!(s.first_violations[1].starts_with("[rename-failed]"));
        // A late kind still gets its example.
        let mut d = WorkerReport::default();
        d.violation(v("late-kind", 1000.0));
        let mut s2 = Summary::default();
        s2.absorb(&[s_reports(), d]);
        assert!(s2
            .first_violations
            .iter()
            .any(|x| x.starts_with("[late-kind]")));
        assert_eq!(s2.first_violations.len(), PRINT_VIOLATIONS);
    }
}
