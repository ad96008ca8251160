//! One clock for every process of a run: `CLOCK_MONOTONIC`, which on Linux
//! is system-wide, so times taken by different worker processes on one
//! machine can be compared (a reader's open against a writer's rename).

/// Nanoseconds of `CLOCK_MONOTONIC`.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass; CLOCK_MONOTONIC
    // always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Seconds from `start_ns` to `t_ns`, for messages.
pub fn secs_since(start_ns: u64, t_ns: u64) -> f64 {
    (t_ns.saturating_sub(start_ns)) as f64 / 1e9
}

/// Spaces loop iterations at least `min_interval_ns` apart, so that a fast
/// file system (tmpfs) does not produce unbounded data or burn the CPU.
#[derive(Debug)]
pub struct Pacer {
    min_interval_ns: u64,
    next_ns: u64,
}

impl Pacer {
    /// At most `per_sec` iterations per second (0: no limit).
    pub fn per_sec(per_sec: u64) -> Pacer {
        Pacer {
            min_interval_ns: 1_000_000_000u64.checked_div(per_sec).unwrap_or(0),
            next_ns: 0,
        }
    }

    /// Sleeps until the next iteration may start.
    pub fn wait(&mut self) {
        let now = now_ns();
        if self.next_ns > now {
            std::thread::sleep(std::time::Duration::from_nanos(self.next_ns - now));
        }
        self.next_ns = self.next_ns.max(now) + self.min_interval_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_forward() {
        let a = now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(now_ns() > a);
    }
}
