//! Progress of a long command: an `indicatif` bar with a rate and an ETA
//! when stderr is a terminal; otherwise a plain line every ten seconds (and
//! at the end), so that logs of scripts and systemd units show it too.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::size::human;

/// Time between plain lines.
const EVERY: Duration = Duration::from_secs(10);

/// How the numbers read: counts, or bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Units {
    /// Plain numbers (files, blocks).
    Count,
    /// Bytes, shown as KiB/MiB/GiB.
    Bytes,
}

/// One long operation's progress.
pub struct Progress {
    what: String,
    units: Units,
    bar: Option<ProgressBar>,
    started: Instant,
    last_line: Option<Instant>,
    pos: u64,
    len: u64,
    msg: String,
}

impl Progress {
    /// Starts showing the progress of `what`.
    pub fn new(what: &str, units: Units) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let counts = match units {
                Units::Count => "{pos}/{len}",
                Units::Bytes => "{bytes}/{total_bytes} {bytes_per_sec}",
            };
            let b = ProgressBar::new(0);
            b.set_style(
                ProgressStyle::with_template(&format!(
                    "{what} [{{bar:30}}] {counts} eta {{eta}} {{msg}}"
                ))
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b
        });
        Progress {
            what: what.to_string(),
            units,
            bar,
            started: Instant::now(),
            last_line: None,
            pos: 0,
            len: 0,
            msg: String::new(),
        }
    }

    /// Sets where it is: `pos` of `len`, and a note.
    pub fn update(&mut self, pos: u64, len: u64, msg: String) {
        let len = len.max(pos);
        (self.pos, self.len) = (pos, len);
        if let Some(b) = &self.bar {
            b.set_length(len);
            b.set_position(pos);
            b.set_message(msg);
            return;
        }
        self.msg = msg;
        if self.last_line.is_none_or(|t| t.elapsed() >= EVERY) {
            self.last_line = Some(Instant::now());
            eprintln!("{}", self.line());
        }
    }

    fn amount(&self, n: u64) -> String {
        match self.units {
            Units::Count => n.to_string(),
            Units::Bytes => human(n),
        }
    }

    /// The plain line: where it is, how fast, how long to go.
    fn line(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64();
        let pct = if self.len > 0 {
            format!(" ({:.0} %)", self.pos as f64 * 100.0 / self.len as f64)
        } else {
            String::new()
        };
        let eta = if self.pos > 0 && self.len > self.pos && secs > 0.0 {
            let left = (self.len - self.pos) as f64 / (self.pos as f64 / secs);
            format!(
                ", about {} to go",
                humantime::format_duration(Duration::from_secs(left.ceil() as u64))
            )
        } else {
            String::new()
        };
        format!(
            "{}: {} of {}{pct}{eta}{}",
            self.what,
            self.amount(self.pos),
            self.amount(self.len),
            if self.msg.is_empty() {
                String::new()
            } else {
                format!("; {}", self.msg)
            }
        )
    }

    /// Stops showing it (a plain last line when there is no bar).
    pub fn finish(self) {
        match &self.bar {
            Some(b) => b.finish_and_clear(),
            None => eprintln!("{}", self.line()),
        }
    }
}

/// Plain progress lines for an `indicatif` bar that stderr cannot show
/// (not a terminal): a line every ten seconds while it lives, and one when
/// dropped. Nothing on a terminal, where the bar draws itself.
pub struct PlainLines {
    stop: Option<(
        std::sync::Arc<std::sync::atomic::AtomicBool>,
        std::thread::JoinHandle<()>,
    )>,
}

/// Follows `bar` (counting `units`) with plain lines named `what`.
pub fn plain_lines(bar: &ProgressBar, what: &str, units: Units) -> PlainLines {
    if std::io::stderr().is_terminal() {
        return PlainLines { stop: None };
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, bar, what) = (stop.clone(), bar.clone(), what.to_string());
    let thread = std::thread::spawn(move || {
        let mut p = Progress {
            what,
            units,
            bar: None,
            started: Instant::now(),
            last_line: Some(Instant::now()),
            pos: 0,
            len: 0,
            msg: String::new(),
        };
        loop {
            let stopping = flag.load(std::sync::atomic::Ordering::Relaxed);
            (p.pos, p.len) = (
                bar.position(),
                bar.length().unwrap_or(0).max(bar.position()),
            );
            if stopping {
                eprintln!("{}", p.line());
                return;
            }
            if p.last_line.is_none_or(|t| t.elapsed() >= EVERY) {
                p.last_line = Some(Instant::now());
                eprintln!("{}", p.line());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    PlainLines {
        stop: Some((stop, thread)),
    }
}

impl Drop for PlainLines {
    fn drop(&mut self) {
        if let Some((flag, thread)) = self.stop.take() {
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_line_says_how_far_and_how_long() {
        let mut p = Progress::new("rebuild", Units::Count);
        p.bar = None;
        p.started = Instant::now() - Duration::from_secs(10);
        p.update(25, 100, "copied 1 MiB".into());
        let l = p.line();
        assert!(
            l.starts_with("rebuild: 25 of 100 (25 %), about 3")
                && l.ends_with("s to go; copied 1 MiB"),
            "{l}"
        );
        let mut b = Progress::new("scrub", Units::Bytes);
        b.bar = None;
        b.update(1 << 20, 4 << 20, String::new());
        assert!(
            b.line().starts_with("scrub: 1 MiB of 4 MiB (25 %)"),
            "{}",
            b.line()
        );
    }
}
