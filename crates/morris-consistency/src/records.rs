//! Fixed-size, self-describing, newline-terminated records for the append
//! workload, and the pure verifier of a file full of them.
//!
//! * An *append record* is 64 bytes: `A <writer> <seq> <file> <check> ....\n`.
//!   The check value is a hash of (run seed, writer, seq, file), so a record
//!   that was torn, overwritten, zero-filled or invented is recognised.
//! * A *turn line* is 48 bytes: `T <i> <target> <check> ....\n`, written by
//!   the turn-taking variant (`echo a >> M1/f; echo b >> M2/f`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::rng::derive;

/// Length of an append record, newline included.
pub const RECORD_LEN: usize = 64;
/// Length of a turn line, newline included.
pub const TURN_LEN: usize = 48;

fn check(run_seed: u64, parts: &[u64]) -> u64 {
    derive(run_seed, parts)
}

fn padded(mut s: String, len: usize) -> Vec<u8> {
    while s.len() < len - 1 {
        s.push('.');
    }
    s.push('\n');
    s.into_bytes()
}

/// The append record `seq` of `writer`, destined for file `file`.
pub fn record(run_seed: u64, writer: u32, seq: u64, file: u32) -> Vec<u8> {
    let c = check(run_seed, &[1, u64::from(writer), seq, u64::from(file)]);
    padded(
        format!("A {writer:04} {seq:010} {file:04} {c:016x} "),
        RECORD_LEN,
    )
}

/// Turn line `i`, appended through target `target`.
pub fn turn_line(run_seed: u64, i: u64, target: u32) -> Vec<u8> {
    let c = check(run_seed, &[2, i, u64::from(target)]);
    padded(format!("T {i:010} {target:02} {c:016x} "), TURN_LEN)
}

/// One thing wrong with a file of records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Short class: `corrupt-record`, `missing`, `duplicate`, ...
    pub kind: &'static str,
    /// File offset concerned, when there is one.
    pub offset: Option<u64>,
    /// Expected vs got, in words.
    pub detail: String,
}

/// What a writer did to one file: the sequence numbers whose write
/// succeeded (each must be there exactly once) and those whose write
/// failed (each may be there at most once).
#[derive(Debug, Clone, Default)]
pub struct WriterExpect {
    /// Sequence numbers written successfully.
    pub written: BTreeSet<u64>,
    /// Sequence numbers whose write returned an error.
    pub uncertain: BTreeSet<u64>,
}

/// Describes a bad line for a message: its length and a printable excerpt.
fn describe_line(line: &[u8]) -> String {
    if line.iter().all(|b| *b == 0) {
        return format!("{} zero bytes", line.len());
    }
    let text: String = line
        .iter()
        .take(70)
        .map(|b| {
            if b.is_ascii_graphic() || *b == b' ' {
                char::from(*b)
            } else {
                '?'
            }
        })
        .collect();
    let zeros = line.iter().filter(|b| **b == 0).count();
    format!("{} bytes ({zeros} zero bytes): {text:?}", line.len())
}

/// Parses one record line (without its newline): (writer, seq, file).
fn parse_record(run_seed: u64, line: &[u8]) -> Option<(u32, u64, u32)> {
    if line.len() != RECORD_LEN - 1 {
        return None;
    }
    let text = std::str::from_utf8(line).ok()?;
    let mut f = text.split(' ');
    if f.next()? != "A" {
        return None;
    }
    let w: u32 = f.next()?.parse().ok()?;
    let seq: u64 = f.next()?.parse().ok()?;
    let file: u32 = f.next()?.parse().ok()?;
    let c = u64::from_str_radix(f.next()?, 16).ok()?;
    let rest = f.next()?;
    if f.next().is_some() || !rest.bytes().all(|b| b == b'.') {
        return None;
    }
    (c == check(run_seed, &[1, u64::from(w), seq, u64::from(file)])).then_some((w, seq, file))
}

/// A line and its file offset.
type Line<'a> = (u64, &'a [u8]);

/// Splits `data` into lines with their offsets; a last piece without a
/// newline is returned separately.
fn lines(data: &[u8]) -> (Vec<Line<'_>>, Option<Line<'_>>) {
    let mut out = Vec::new();
    let mut start = 0usize;
    for (i, b) in data.iter().enumerate() {
        if *b == b'\n' {
            out.push((start as u64, &data[start..i]));
            start = i + 1;
        }
    }
    let tail = (start < data.len()).then(|| (start as u64, &data[start..]));
    (out, tail)
}

/// Collapses sorted numbers into `a..=b` ranges for messages.
fn ranges(v: &[u64]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() && parts.len() < 8 {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}..={}", v[i], v[j])
        });
        i = j + 1;
    }
    if i < v.len() {
        parts.push("...".into());
    }
    parts.join(", ")
}

/// The outcome of checking a file of append records.
#[derive(Debug, Default)]
pub struct AppendCheck {
    /// Valid records found.
    pub records: u64,
    /// Everything wrong, in file order, then per writer.
    pub findings: Vec<Finding>,
}

/// Checks a file of append records against what each writer did to it:
/// every record intact, every successful one there exactly once, failed
/// ones at most once, nothing else, and each writer's records in its order.
pub fn verify_append(
    run_seed: u64,
    file: u32,
    data: &[u8],
    expect: &BTreeMap<u32, WriterExpect>,
) -> AppendCheck {
    let mut out = AppendCheck::default();
    let (ls, tail) = lines(data);
    let mut seen: HashMap<(u32, u64), u32> = HashMap::new();
    let mut last: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for (off, line) in ls {
        let Some((w, seq, f)) = parse_record(run_seed, line) else {
            out.findings.push(Finding {
                kind: "corrupt-record",
                offset: Some(off),
                detail: format!(
                    "expected a {RECORD_LEN}-byte record, got {}",
                    describe_line(line)
                ),
            });
            continue;
        };
        out.records += 1;
        if f != file {
            out.findings.push(Finding {
                kind: "wrong-file",
                offset: Some(off),
                detail: format!(
                    "record of writer {w} seq {seq} was written to file {f}, found in file {file}"
                ),
            });
        }
        *seen.entry((w, seq)).or_default() += 1;
        if let Some((prev, prev_off)) = last.get(&w) {
            if seq < *prev {
                out.findings.push(Finding {
                    kind: "out-of-order",
                    offset: Some(off),
                    detail: format!(
                        "writer {w}: seq {seq} after seq {prev} (at offset {prev_off}); each writer appends in order"
                    ),
                });
            }
        }
        last.insert(w, (seq, off));
    }
    if let Some((off, t)) = tail {
        out.findings.push(Finding {
            kind: "torn-tail",
            offset: Some(off),
            detail: format!("the file ends inside a record: {}", describe_line(t)),
        });
    }
    for (w, e) in expect {
        let mut missing = Vec::new();
        let mut dups = Vec::new();
        for s in &e.written {
            match seen.get(&(*w, *s)).copied().unwrap_or(0) {
                0 => missing.push(*s),
                1 => {}
                _ => dups.push(*s),
            }
        }
        for s in &e.uncertain {
            if seen.get(&(*w, *s)).copied().unwrap_or(0) > 1 {
                dups.push(*s);
            }
        }
        if !missing.is_empty() {
            out.findings.push(Finding {
                kind: "missing",
                offset: None,
                detail: format!(
                    "writer {w}: {} of its {} successfully appended records are not in the file: seq {}",
                    missing.len(),
                    e.written.len(),
                    ranges(&missing)
                ),
            });
        }
        if !dups.is_empty() {
            dups.sort_unstable();
            out.findings.push(Finding {
                kind: "duplicate",
                offset: None,
                detail: format!(
                    "writer {w}: {} records appear more than once: seq {}",
                    dups.len(),
                    ranges(&dups)
                ),
            });
        }
    }
    let mut phantom: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (w, s) in seen.keys() {
        let known = expect
            .get(w)
            .is_some_and(|e| e.written.contains(s) || e.uncertain.contains(s));
        if !known {
            phantom.entry(*w).or_default().push(*s);
        }
    }
    for (w, mut v) in phantom {
        v.sort_unstable();
        out.findings.push(Finding {
            kind: "phantom",
            offset: None,
            detail: format!(
                "writer {w}: {} records in the file were never appended to it: seq {}",
                v.len(),
                ranges(&v)
            ),
        });
    }
    out
}

/// Parses one turn line (without its newline): (i, target).
fn parse_turn(run_seed: u64, line: &[u8]) -> Option<(u64, u32)> {
    if line.len() != TURN_LEN - 1 {
        return None;
    }
    let text = std::str::from_utf8(line).ok()?;
    let mut f = text.split(' ');
    if f.next()? != "T" {
        return None;
    }
    let i: u64 = f.next()?.parse().ok()?;
    let m: u32 = f.next()?.parse().ok()?;
    let c = u64::from_str_radix(f.next()?, 16).ok()?;
    let rest = f.next()?;
    if f.next().is_some() || !rest.bytes().all(|b| b == b'.') {
        return None;
    }
    (c == check(run_seed, &[2, i, u64::from(m)])).then_some((i, m))
}

/// Checks the turn-taking file: line `i` (appended through target
/// `i % targets`) is there exactly once for every append that succeeded
/// (`count` of them, one at a time), in order, intact, and nothing else;
/// `uncertain`: the append after them failed, so it may be there too.
pub fn verify_turns(
    run_seed: u64,
    data: &[u8],
    count: u64,
    targets: u32,
    uncertain: bool,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let (ls, tail) = lines(data);
    let targets = u64::from(targets.max(1));
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    let mut prev: Option<(u64, u64)> = None;
    let mut corrupt = 0usize;
    for (off, line) in &ls {
        let Some((i, m)) = parse_turn(run_seed, line) else {
            corrupt += 1;
            if corrupt <= 20 {
                out.push(Finding {
                    kind: "corrupt-line",
                    offset: Some(*off),
                    detail: format!(
                        "expected a {TURN_LEN}-byte line, got {}",
                        describe_line(line)
                    ),
                });
            }
            continue;
        };
        if u64::from(m) != i % targets {
            out.push(Finding {
                kind: "wrong-line",
                offset: Some(*off),
                detail: format!("line {i} says it went through target {m}, but it was appended through target {}", i % targets),
            });
        }
        *seen.entry(i).or_default() += 1;
        if let Some((p, p_off)) = prev {
            if i < p {
                out.push(Finding {
                    kind: "out-of-order",
                    offset: Some(*off),
                    detail: format!("line {i} comes after line {p} (at offset {p_off}); the appends were one at a time"),
                });
            }
        }
        prev = Some((i, *off));
    }
    if corrupt > 20 {
        out.push(Finding {
            kind: "corrupt-line",
            offset: None,
            detail: format!("{} more corrupt lines", corrupt - 20),
        });
    }
    if let Some((off, t)) = tail {
        out.push(Finding {
            kind: "torn-tail",
            offset: Some(off),
            detail: format!("the file ends inside a line: {}", describe_line(t)),
        });
    }
    let missing: Vec<u64> = (0..count).filter(|i| !seen.contains_key(i)).collect();
    if !missing.is_empty() {
        let mut by_target: BTreeMap<u64, usize> = BTreeMap::new();
        for i in &missing {
            *by_target.entry(i % targets).or_default() += 1;
        }
        let per: Vec<String> = by_target
            .iter()
            .map(|(t, n)| format!("{n} appended through target {t}"))
            .collect();
        out.push(Finding {
            kind: "lost-append",
            offset: None,
            detail: format!(
                "{} of the {count} appends that succeeded are not in the file ({}): lines {}",
                missing.len(),
                per.join(", "),
                ranges(&missing)
            ),
        });
    }
    let dups: Vec<u64> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(i, _)| *i)
        .collect();
    if !dups.is_empty() {
        out.push(Finding {
            kind: "duplicate",
            offset: None,
            detail: format!(
                "{} lines appear more than once: {}",
                dups.len(),
                ranges(&dups)
            ),
        });
    }
    let limit = count + u64::from(uncertain);
    let phantom: Vec<u64> = seen.keys().copied().filter(|i| *i >= limit).collect();
    if !phantom.is_empty() {
        out.push(Finding {
            kind: "phantom",
            offset: None,
            detail: format!("lines never appended: {}", ranges(&phantom)),
        });
    }
    let n = ls.len() as u64;
    if n != count && !(uncertain && n == count + 1) {
        out.push(Finding {
            kind: "line-count",
            offset: None,
            detail: format!(
                "{count} appends succeeded (one at a time, taking turns), the file has {n} lines"
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expect(spec: &[(u32, std::ops::Range<u64>)]) -> BTreeMap<u32, WriterExpect> {
        spec.iter()
            .map(|(w, r)| {
                (
                    *w,
                    WriterExpect {
                        written: r.clone().collect(),
                        uncertain: BTreeSet::new(),
                    },
                )
            })
            .collect()
    }

    fn file(recs: &[(u32, u64)]) -> Vec<u8> {
        recs.iter()
            .flat_map(|(w, s)| record(5, *w, *s, 0))
            .collect()
    }

    #[test]
    fn records_have_the_fixed_length() {
        assert_eq!(record(1, 3, 99, 2).len(), RECORD_LEN);
        assert_eq!(turn_line(1, 99, 1).len(), TURN_LEN);
    }

    #[test]
    fn an_interleaved_complete_file_is_clean() {
        let d = file(&[(0, 0), (1, 0), (0, 1), (1, 1), (1, 2)]);
        let c = verify_append(5, 0, &d, &expect(&[(0, 0..2), (1, 0..3)]));
        assert_eq!(c.records, 5);
        assert!(c.findings.is_empty(), "{:?}", c.findings);
    }

    #[test]
    fn a_lost_record_is_missing() {
        let d = file(&[(0, 0), (1, 0), (1, 1)]);
        let c = verify_append(5, 0, &d, &expect(&[(0, 0..2), (1, 0..2)]));
        assert_eq!(c.findings.len(), 1);
        assert_eq!(c.findings[0].kind, "missing");
        assert!(c.findings[0].detail.contains("seq 1"), "{:?}", c.findings);
    }

    #[test]
    fn an_overwritten_record_is_corrupt_and_missing() {
        let mut d = file(&[(0, 0), (1, 0), (0, 1)]);
        // Writer 1's record overwritten by zeros (a lost O_APPEND offset).
        for b in &mut d[64..127] {
            *b = 0;
        }
        let c = verify_append(5, 0, &d, &expect(&[(0, 0..2), (1, 0..1)]));
        let kinds: Vec<_> = c.findings.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, ["corrupt-record", "missing"], "{:?}", c.findings);
        assert_eq!(c.findings[0].offset, Some(64));
        assert!(c.findings[0].detail.contains("63 zero bytes"));
    }

    #[test]
    fn duplicates_reordering_phantoms_and_torn_tails_are_found() {
        let mut d = file(&[(0, 1), (0, 0), (0, 1), (7, 3)]);
        d.extend_from_slice(b"A 0000 000");
        let c = verify_append(5, 0, &d, &expect(&[(0, 0..2)]));
        let kinds: BTreeSet<_> = c.findings.iter().map(|f| f.kind).collect();
        for k in ["out-of-order", "duplicate", "phantom", "torn-tail"] {
            assert!(kinds.contains(k), "{k} not in {:?}", c.findings);
        }
    }

    #[test]
    fn a_failed_append_may_be_there_once() {
        let d = file(&[(0, 0), (0, 1)]);
        let mut e = expect(&[(0, 0..1)]);
        e.get_mut(&0).expect("writer 0").uncertain.insert(1);
        assert!(verify_append(5, 0, &d, &e).findings.is_empty());
        let d2 = file(&[(0, 0)]);
        assert!(verify_append(5, 0, &d2, &e).findings.is_empty());
    }

    #[test]
    fn a_flipped_check_byte_is_corrupt() {
        let mut d = file(&[(0, 0)]);
        d[30] = if d[30] == b'0' { b'1' } else { b'0' };
        let c = verify_append(5, 0, &d, &expect(&[(0, 0..1)]));
        assert_eq!(c.findings[0].kind, "corrupt-record");
    }

    #[test]
    fn turns_must_all_be_there_in_order() {
        let good: Vec<u8> = (0..6)
            .flat_map(|i| turn_line(3, i, (i % 2) as u32))
            .collect();
        assert!(verify_turns(3, &good, 6, 2, false).is_empty());
        // One append lost: the count is off and every later line is shifted.
        let lost: Vec<u8> = (0..6)
            .filter(|i| *i != 3)
            .flat_map(|i| turn_line(3, i, (i % 2) as u32))
            .collect();
        let f = verify_turns(3, &lost, 6, 2, false);
        let kinds: Vec<_> = f.iter().map(|x| x.kind).collect();
        assert_eq!(kinds, ["lost-append", "line-count"], "{f:?}");
        assert!(f[0].detail.contains("1 appended through target 1"), "{f:?}");
        assert!(f[0].detail.contains("lines 3"), "{f:?}");
        // A line written over by another (two mounts appending at one offset).
        let mut clobbered = good.clone();
        clobbered[TURN_LEN..2 * TURN_LEN].copy_from_slice(&turn_line(3, 2, 0));
        let f = verify_turns(3, &clobbered, 6, 2, false);
        let kinds: BTreeSet<_> = f.iter().map(|x| x.kind).collect();
        assert!(
            kinds.contains("lost-append") && kinds.contains("duplicate"),
            "{f:?}"
        );
        // The last append failed: one more line is accepted.
        assert!(verify_turns(3, &good, 5, 2, true).is_empty());
    }
}
