//! What each user and group stores in the volume (`morris quota`): every
//! server answers for the metadata ranges it serves (`Request::Usage`;
//! the servers keep the counts with the inodes, `store/usage.rs`), and
//! the client adds the ranges up, each once.

use std::collections::BTreeMap;
use std::time::Duration;

use morris_proto::{ErrorCode, Reply, Request, UsageRow};

use crate::pool::unexpected;
use crate::{Client, Error, Result};

/// How long a server may take to answer.
const USAGE_WAIT: Duration = Duration::from_secs(10);

impl Client {
    /// Inodes and bytes (of regular files, one copy) each user and each
    /// group stores in the whole volume, users first, by id. Fails if no
    /// server answers for some metadata range (its server and every copy
    /// down), rather than count it as empty.
    pub async fn usage(&self) -> Result<Vec<UsageRow>> {
        let k = self.layout.servers;
        let mut ranges = BTreeMap::new();
        let mut last_err = None;
        for r in self.ask_every_server(&Request::Usage, USAGE_WAIT).await {
            match r {
                Ok(Reply::Usage(list)) => {
                    for ru in list {
                        ranges.entry(ru.range).or_insert(ru.rows);
                    }
                }
                Ok(other) => return Err(unexpected(&other)),
                Err(e) => last_err = Some(e),
            }
        }
        if let Some(missing) = (0..k).find(|r| !ranges.contains_key(r)) {
            let why = last_err.map_or_else(String::new, |e| format!(": {e}"));
            return Err(Error::new(
                ErrorCode::Unavailable,
                format!("no server answered for metadata range {missing}{why}"),
            ));
        }
        Ok(sum(ranges.into_values().flatten()))
    }
}

/// Rows of several ranges added up per user and per group; rows that
/// count nothing left out.
fn sum(rows: impl IntoIterator<Item = UsageRow>) -> Vec<UsageRow> {
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
}
