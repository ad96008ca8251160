//! Which bytes of a file one NLM lock owner holds locked, as the gateway
//! needs to know to keep the file open while any lock lasts.

/// Disjoint, sorted, inclusive byte ranges.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    /// Nothing held.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds `start..=end`, merging what it touches.
    pub(crate) fn add(&mut self, start: u64, end: u64) {
        let mut s = start;
        let mut e = end;
        let mut out = Vec::with_capacity(self.0.len() + 1);
        for &(a, b) in &self.0 {
            // Overlapping or adjacent: merge.
            if b.saturating_add(1) < s || e.saturating_add(1) < a {
                out.push((a, b));
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        out.push((s, e));
        out.sort_unstable();
        self.0 = out;
    }

    /// Removes `start..=end`, splitting a range it falls inside.
    pub(crate) fn remove(&mut self, start: u64, end: u64) {
        let mut out = Vec::with_capacity(self.0.len() + 1);
        for &(a, b) in &self.0 {
            if b < start || a > end {
                out.push((a, b));
                continue;
            }
            if a < start {
                out.push((a, start - 1));
            }
            if b > end {
                out.push((end + 1, b));
            }
        }
        self.0 = out;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_split_and_empty() {
        let mut r = Ranges::default();
        r.add(10, 19);
        r.add(20, 29); // adjacent: one range
        r.add(100, 199);
        assert_eq!(r.0, vec![(10, 29), (100, 199)]);
        r.add(25, 120); // bridges both
        assert_eq!(r.0, vec![(10, 199)]);
        r.remove(50, 59); // a hole
        assert_eq!(r.0, vec![(10, 49), (60, 199)]);
        r.remove(0, 10);
        assert_eq!(r.0, vec![(11, 49), (60, 199)]);
        r.add(0, u64::MAX);
        assert_eq!(r.0, vec![(0, u64::MAX)]);
        r.remove(5, u64::MAX);
        assert_eq!(r.0, vec![(0, 4)]);
        r.remove(0, u64::MAX);
        assert!(r.is_empty());
    }
}
