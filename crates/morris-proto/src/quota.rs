//! Who is over a quota: what every client and every server decides from
//! the limits (`morris quota set`, [`QuotaLimit`]) and the counts the
//! metadata ranges keep ([`RangeUsage`]), so that both decide alike.

use std::collections::{BTreeMap, HashSet};

use crate::{QuotaLimit, RangeUsage, UsageRow};

/// What a change adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// An inode.
    Inode,
    /// Bytes past a file's end.
    Bytes,
}

/// The users and groups a set of limits puts over, as `(group, id)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Over {
    /// At or over their inode limit: may not add an inode.
    pub inodes: HashSet<(bool, i64)>,
    /// Over their byte limit: may not grow a file.
    pub bytes: HashSet<(bool, i64)>,
}

impl Over {
    /// Who `limits` put over, given the volume's `usage` (summed).
    pub fn of(limits: &[QuotaLimit], usage: &[UsageRow]) -> Over {
        let mut v = Over::default();
        for l in limits {
            let used = usage.iter().find(|u| u.group == l.group && u.id == l.id);
            let (inodes, bytes) =
                used.map_or((0, 0), |u| (u.inodes.max(0) as u64, u.bytes.max(0) as u64));
            if l.inodes != 0 && inodes >= l.inodes {
                v.inodes.insert((l.group, l.id));
            }
            if l.bytes != 0 && bytes > l.bytes {
                v.bytes.insert((l.group, l.id));
            }
        }
        v
    }

    /// Why `charge` for an object of `uid` and `gid` is refused, if it is.
    pub fn refusal(&self, uid: u32, gid: u32, charge: Charge) -> Option<String> {
        self.refusal_of(false, uid, charge)
            .or_else(|| self.refusal_of(true, gid, charge))
    }

    /// Why `charge` for the user (`group` false) or group `id` alone is
    /// refused, if it is.
    pub fn refusal_of(&self, group: bool, id: u32, charge: Charge) -> Option<String> {
        let (over, what) = match charge {
            Charge::Inode => (&self.inodes, "inode"),
            Charge::Bytes => (&self.bytes, "byte"),
        };
        let who = if group { "group" } else { "user" };
        over.contains(&(group, i64::from(id)))
            .then(|| format!("{who} {id} is over its {what} quota"))
    }
}

/// The volume's counts from what servers answered for their ranges, each
/// of the `k` ranges counted once; `Err(range)` names a range nobody
/// answered for (the volume's counts are then unknown, not smaller).
pub fn volume_usage(
    k: u32,
    answers: impl IntoIterator<Item = RangeUsage>,
) -> Result<Vec<UsageRow>, u32> {
    let mut ranges = BTreeMap::new();
    for ru in answers {
        ranges.entry(ru.range).or_insert(ru.rows);
    }
    if let Some(missing) = (0..k).find(|r| !ranges.contains_key(r)) {
        return Err(missing);
    }
    Ok(sum(ranges.into_values().flatten()))
}

/// Rows of several ranges added up per user and per group; rows that
/// count nothing left out.
pub fn sum(rows: impl IntoIterator<Item = UsageRow>) -> Vec<UsageRow> {
    let mut total: BTreeMap<(bool, i64), (i64, i64)> = BTreeMap::new();
    for r in rows {
        let t = total.entry((r.group, r.id)).or_default();
        t.0 += r.inodes;
        t.1 += r.bytes;
    }
    total
        .into_iter()
        .filter(|(_, (inodes, bytes))| *inodes != 0 || *bytes != 0)
        .map(|((group, id), (inodes, bytes))| UsageRow {
            group,
            id,
            inodes,
            bytes,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(group: bool, id: i64, inodes: i64, bytes: i64) -> UsageRow {
        UsageRow {
            group,
            id,
            inodes,
            bytes,
        }
    }

    #[test]
    fn ranges_add_up_per_user_and_group() {
        let got = sum([
            row(true, 100, 1, 10),
            row(false, 1000, 2, 4096),
            row(false, 1000, 3, 8192),
            row(false, 0, 1, 0),
            row(false, 7, 0, 0),
        ]);
        assert_eq!(
            got,
            [
                row(false, 0, 1, 0),
                row(false, 1000, 5, 12_288),
                row(true, 100, 1, 10)
            ]
        );
    }

    #[test]
    fn each_range_counts_once_and_a_missing_one_is_named() {
        let ru = |range, rows| RangeUsage { range, rows };
        let got = volume_usage(
            2,
            [
                ru(0, vec![row(false, 1, 1, 0)]),
                ru(0, vec![row(false, 1, 1, 0)]),
                ru(1, vec![row(false, 1, 2, 0)]),
            ],
        );
        assert_eq!(got, Ok(vec![row(false, 1, 3, 0)]));
        assert_eq!(volume_usage(3, [ru(0, vec![]), ru(2, vec![])]), Err(1));
    }

    #[test]
    fn who_reached_a_limit_is_over() {
        let limit = |group, id, inodes, bytes| QuotaLimit {
            group,
            id,
            inodes,
            bytes,
        };
        let limits = [
            limit(false, 1000, 3, 0),
            limit(true, 100, 0, 4096),
            limit(false, 1001, 10, 10),
        ];
        let usage = [row(false, 1000, 3, 1 << 30), row(true, 100, 1, 8192)];
        let v = Over::of(&limits, &usage);
        assert!(
            v.refusal(1000, 1, Charge::Inode).is_some(),
            "at its inode limit"
        );
        assert!(v.refusal(1000, 1, Charge::Bytes).is_none(), "no byte limit");
        assert!(
            v.refusal(5, 100, Charge::Bytes).is_some(),
            "its group is over"
        );
        assert!(v.refusal(5, 100, Charge::Inode).is_none());
        assert!(
            v.refusal(1001, 1, Charge::Inode).is_none(),
            "nothing stored yet"
        );
        assert!(Over::default().refusal(1000, 100, Charge::Inode).is_none());
        assert!(v.refusal_of(true, 100, Charge::Bytes).is_some());
        assert!(
            v.refusal_of(false, 100, Charge::Bytes).is_none(),
            "user 100 is not group 100"
        );
    }
}
