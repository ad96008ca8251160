//! `listing`: a directory listed over and over while names in it are
//! replaced by rename and other names come and go.
//!
//! Set-up creates the *stable* names `s.0000..` (200 by default), which
//! nobody touches afterwards, and the *replaced* names `r.0000..` (100),
//! which always exist but are constantly renamed over. Renamers (one; two
//! from 4 procs on) loop: write a new file `t.W.N` and rename it over a
//! random replaced name, or create / unlink one of their own churn names
//! `c.W.J`. Listers on every mount list the directory (one
//! opendir..closedir pass; NFS: READDIRPLUS from cookie 0 to eof, in small
//! replies so that one listing takes several calls) again and again.
//!
//! **Promises**:
//! * every stable name appears in every listing, exactly once
//!   (`stable-name-missing`, `duplicate-name`): nothing happened to them,
//!   so POSIX leaves no room;
//! * every replaced name appears in every listing exactly once
//!   (`replaced-name-missing`, `duplicate-name`): rename(2) keeps the name
//!   visible throughout, and ext4 (and tmpfs, for a listing that is one
//!   getdents call — the default sizes) never show it twice or not at all.
//!   This is stronger than POSIX's letter, which leaves unspecified whether
//!   a file removed or added during the listing is returned: Linux 6.18's
//!   tmpfs does show such names twice or not at all once a listing takes
//!   several getdents calls (a few thousand names); the check stands as the
//!   behaviour users rely on (`ls` during config-file replacement);
//! * churn and temporary names may be missing, and a churn name unlinked
//!   and created again during the listing may appear twice (two different
//!   files: allowed, counted); no name appears that nobody made
//!   (`unknown-name`);
//! * listing never fails (NFS3ERR_BAD_COOKIE is allowed: the client starts
//!   over); renames, creates and unlinks never fail;
//! * after the run every mount lists exactly the same names: the stable
//!   and replaced ones and the churn names the renamers left.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::spread;
use crate::access::{Access, FsError};
use crate::clock::Pacer;
use crate::report::WorkerReport;
use crate::runner::{CoordCtx, RolePlan, WorkerCtx};

/// Churn names per renamer.
const CHURN: usize = 8;
/// Most renamer steps per second.
const STEPS_PER_SEC: u64 = 200;
/// Most listings per second per lister.
const LISTS_PER_SEC: u64 = 50;

/// Stable name `i` (never touched).
pub fn stable(i: usize) -> String {
    format!("s.{i:04}")
}

/// Replaced name `i` (always there, constantly renamed over).
pub fn replaced(i: usize) -> String {
    format!("r.{i:04}")
}

fn renamers(procs: usize) -> usize {
    if procs >= 4 {
        2
    } else {
        1
    }
}

/// The kinds of names in the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stable,
    Replaced,
    Churn,
    Unknown,
}

/// What kind of name `n` is, given the set-up sizes.
fn kind(n: &str, stable_names: usize, replaced_names: usize) -> Kind {
    let mut p = n.split('.');
    let (a, b, c, d) = (p.next(), p.next(), p.next(), p.next());
    let num =
        |s: Option<&str>| s.is_some_and(|s| !s.is_empty() && s.bytes().all(|x| x.is_ascii_digit()));
    let idx = |b: Option<&str>, max: usize| {
        c.is_none() && b.is_some_and(|b| b.len() == 4 && b.parse::<usize>().is_ok_and(|i| i < max))
    };
    match (a, d) {
        (Some("s"), None) if idx(b, stable_names) => Kind::Stable,
        (Some("r"), None) if idx(b, replaced_names) => Kind::Replaced,
        (Some("t"), None) | (Some("c"), None) if num(b) && num(c) => Kind::Churn,
        _ => Kind::Unknown,
    }
}

/// One listing's problems: (kind, detail) per kind of violation. Churn
/// names listed twice are not among them (see [`churn_duplicates`]).
pub fn check_listing(
    names: &[String],
    stable_names: usize,
    replaced_names: usize,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for n in names {
        *count.entry(n.as_str()).or_default() += 1;
    }
    let dups: Vec<String> = count
        .iter()
        .filter(|(n, c)| **c > 1 && kind(n, stable_names, replaced_names) != Kind::Churn)
        .map(|(n, c)| format!("{n} x{c}"))
        .collect();
    if !dups.is_empty() {
        out.push((
            "duplicate-name",
            format!(
                "{} names listed more than once in one listing of {} entries: {}",
                dups.len(),
                names.len(),
                dups.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    for (what, total, name_of, k) in [
        (
            "stable-name-missing",
            stable_names,
            stable as fn(usize) -> String,
            "untouched names",
        ),
        (
            "replaced-name-missing",
            replaced_names,
            replaced,
            "names always there but renamed over",
        ),
    ] {
        let missing: Vec<String> = (0..total)
            .map(name_of)
            .filter(|s| !count.contains_key(s.as_str()))
            .collect();
        if !missing.is_empty() {
            out.push((
                what,
                format!(
                    "{} of the {total} {k} are missing from a listing of {} entries: {}",
                    missing.len(),
                    names.len(),
                    missing
                        .iter()
                        .take(10)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    let unknown: Vec<&str> = count
        .keys()
        .copied()
        .filter(|n| kind(n, stable_names, replaced_names) == Kind::Unknown)
        .collect();
    if !unknown.is_empty() {
        out.push((
            "unknown-name",
            format!(
                "names nobody made: {}",
                unknown
                    .iter()
                    .take(10)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    out
}

/// How many churn names appear more than once in one listing (allowed:
/// unlinked and created again while the listing ran).
pub fn churn_duplicates(names: &[String], stable_names: usize, replaced_names: usize) -> usize {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for n in names {
        *count.entry(n.as_str()).or_default() += 1;
    }
    count
        .iter()
        .filter(|(n, c)| **c > 1 && kind(n, stable_names, replaced_names) == Kind::Churn)
        .count()
}

/// Creates the stable and the replaced names.
pub fn setup(ctx: &mut CoordCtx, home: &mut dyn Access) -> Result<serde_json::Value, FsError> {
    let names = (0..ctx.params.stable_names)
        .map(stable)
        .chain((0..ctx.params.replaced_names).map(replaced));
    for n in names {
        let mut h = home.create_excl(&n)?;
        home.write_at(&mut h, 0, format!("{n}\n").as_bytes())?;
        home.close(h)?;
    }
    Ok(serde_json::Value::Null)
}

/// Renamers from the first target, `procs` listers from the second.
pub fn plan(ctx: &CoordCtx) -> Vec<RolePlan> {
    let all: Vec<usize> = (0..ctx.targets.len()).collect();
    let mut v = spread("renamer", renamers(ctx.params.procs), &all, 0);
    v.extend(spread("lister", ctx.params.procs.max(1), &all, 1));
    v
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct RenamerFacts {
    /// Churn and temporary names it left behind.
    left: Vec<String>,
}

/// Runs a renamer or a lister.
pub fn work(w: &mut WorkerCtx) -> anyhow::Result<()> {
    let Some(mut a) = w.connect(w.spec.target) else {
        return Ok(());
    };
    match w.spec.role.as_str() {
        "renamer" => renamer(w, a.as_mut()),
        "lister" => lister(w, a.as_mut()),
        r => anyhow::bail!("listing has no role {r}"),
    }
}

fn renamer(w: &mut WorkerCtx, a: &mut dyn Access) -> anyhow::Result<()> {
    let label = a.label().to_string();
    let me = w.spec.index;
    let replaced_names = w.spec.params.replaced_names.max(1);
    let mut left: BTreeSet<String> = BTreeSet::new();
    let mut pacer = Pacer::per_sec(STEPS_PER_SEC);
    let mut n = 0u64;
    while w.running() {
        pacer.wait();
        if w.rng.chance(3, 5) {
            let s = replaced(w.rng.index(replaced_names));
            let tmp = format!("t.{me}.{n}");
            n += 1;
            let made = a.create_excl(&tmp).and_then(|mut h| {
                a.write_at(&mut h, 0, format!("{tmp}\n").as_bytes())?;
                a.close(h)
            });
            if let Err(e) = made {
                w.fs_violation("create-failed", &label, &format!("create {tmp}"), &e);
                left.insert(tmp);
                continue;
            }
            match a.rename(&tmp, &s) {
                Ok(()) => w.report.op("rename-replace"),
                Err(e) => {
                    w.fs_violation("rename-failed", &label, &format!("rename {tmp} -> {s}"), &e);
                    left.insert(tmp);
                }
            }
        } else {
            let c = format!("c.{me}.{}", w.rng.index(CHURN));
            if left.contains(&c) {
                match a.remove(&c) {
                    Ok(()) => {
                        left.remove(&c);
                        w.report.op("unlink");
                    }
                    Err(e) => w.fs_violation("unlink-failed", &label, &format!("unlink {c}"), &e),
                }
            } else {
                match a.create_excl(&c).and_then(|h| a.close(h)) {
                    Ok(()) => {
                        left.insert(c);
                        w.report.op("create");
                    }
                    Err(e) => w.fs_violation("create-failed", &label, &format!("create {c}"), &e),
                }
            }
        }
    }
    w.report.data = serde_json::to_value(RenamerFacts {
        left: left.into_iter().collect(),
    })?;
    Ok(())
}

fn lister(w: &mut WorkerCtx, a: &mut dyn Access) -> anyhow::Result<()> {
    let label = a.label().to_string();
    let (stable_names, replaced_names) = (w.spec.params.stable_names, w.spec.params.replaced_names);
    let mut pacer = Pacer::per_sec(LISTS_PER_SEC);
    while w.running() {
        pacer.wait();
        let names = match a.list() {
            Ok(n) => n,
            Err(e) if a.is_nfs() && e.code.name == "NFS3ERR_BAD_COOKIE" => {
                w.report.error(&e);
                w.report
                    .allowed("NFS3ERR_BAD_COOKIE (the listing starts over)");
                continue;
            }
            Err(e) => {
                w.fs_violation("list-failed", &label, "list the directory", &e);
                continue;
            }
        };
        w.report.op("list");
        for (kind, detail) in check_listing(&names, stable_names, replaced_names) {
            w.violation(kind, &label, "list the directory", detail);
        }
        for _ in 0..churn_duplicates(&names, stable_names, replaced_names) {
            w.report.allowed(
                "a churn name unlinked and created again during the listing appeared twice",
            );
        }
    }
    Ok(())
}

/// After the run, every mount lists the same, expected names.
pub fn verify(ctx: &mut CoordCtx, reports: &[WorkerReport]) {
    let mut want: BTreeSet<String> = (0..ctx.params.stable_names)
        .map(stable)
        .chain((0..ctx.params.replaced_names).map(replaced))
        .collect();
    for r in reports {
        if let Ok(f) = serde_json::from_value::<RenamerFacts>(r.data.clone()) {
            want.extend(f.left);
        }
    }
    for k in 0..ctx.targets.len() {
        let label = ctx.labels[k].clone();
        let Some(mut a) = ctx.connect(k) else {
            continue;
        };
        match a.list() {
            Err(e) => ctx.violation(
                "list-failed",
                &label,
                "list the directory after the run",
                e.to_string(),
            ),
            Ok(names) => {
                ctx.report.op("final-list");
                for (kind, detail) in
                    check_listing(&names, ctx.params.stable_names, ctx.params.replaced_names)
                {
                    ctx.violation(kind, &label, "list the directory after the run", detail);
                }
                let got: BTreeSet<String> = names.into_iter().collect();
                let extra: Vec<&String> = got.difference(&want).take(10).collect();
                let missing: Vec<&String> = want.difference(&got).take(10).collect();
                if !extra.is_empty() || !missing.is_empty() {
                    ctx.violation(
                        "final-listing",
                        &label,
                        "list the directory after the run",
                        format!(
                            "names that should not be there: {extra:?}; names missing: {missing:?}"
                        ),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(s: usize, r: usize) -> Vec<String> {
        (0..s).map(stable).chain((0..r).map(replaced)).collect()
    }

    #[test]
    fn a_clean_listing_passes() {
        let mut l = base(5, 3);
        l.extend(["t.0.17".to_string(), "c.1.3".to_string()]);
        assert!(check_listing(&l, 5, 3).is_empty());
    }

    #[test]
    fn duplicates_missing_and_unknown_names_are_found() {
        let mut l = base(5, 3);
        l.push(replaced(2));
        l.retain(|n| n != "s.0004" && n != "r.0001");
        l.push("garbage".into());
        l.push("s.0009".into());
        let found = check_listing(&l, 5, 3);
        let kinds: Vec<&str> = found.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [
                "duplicate-name",
                "stable-name-missing",
                "replaced-name-missing",
                "unknown-name"
            ]
        );
        assert!(found[0].1.contains("r.0002 x2"), "{}", found[0].1);
        assert!(found[1].1.contains("s.0004"), "{}", found[1].1);
        assert!(found[2].1.contains("r.0001"), "{}", found[2].1);
    }

    #[test]
    fn a_churn_name_twice_is_allowed_but_counted() {
        let mut l = base(2, 2);
        l.extend(["c.0.1".to_string(), "c.0.1".to_string()]);
        assert!(check_listing(&l, 2, 2).is_empty());
        assert_eq!(churn_duplicates(&l, 2, 2), 1);
    }
}
