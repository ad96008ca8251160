//! The status page a server serves at `/` of its metrics endpoint (issue
//! 20): the volume's health and every server's state as `morris status`
//! reports it (collected from every server at each view), and graphs of
//! this server's requests and bytes over the last hour, sampled every ten
//! seconds and kept in memory. Plain HTML with inline SVG: nothing to
//! fetch, no script.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use parking_lot::Mutex;

/// Time between samples.
pub(super) const EVERY: Duration = Duration::from_secs(10);
/// Samples kept: one hour.
const KEEP: usize = 360;

/// Counters a graph is drawn from: (requests, bytes read, bytes written),
/// each a running total.
pub type Counters = Arc<dyn Fn() -> (u64, u64, u64) + Send + Sync>;
/// The volume's health and the status text shown on the page (`morris
/// status`'s table), or why there is none.
pub type StatusText =
    Arc<dyn Fn() -> BoxFuture<'static, Result<(String, String), String>> + Send + Sync>;

/// One sample: when, and the rates since the one before.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Sample {
    pub at: SystemTime,
    pub ops: f64,
    pub read: f64,
    pub written: f64,
}

/// The last hour of samples.
#[derive(Default)]
pub(super) struct History {
    last: Option<(SystemTime, (u64, u64, u64))>,
    samples: VecDeque<Sample>,
}

impl History {
    /// Adds the rates between the previous totals and `now`'s.
    pub(super) fn add(&mut self, at: SystemTime, totals: (u64, u64, u64)) {
        if let Some((then, prev)) = self.last {
            let secs = at
                .duration_since(then)
                .unwrap_or(Duration::ZERO)
                .as_secs_f64();
            if secs > 0.0 {
                let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
                self.samples.push_back(Sample {
                    at,
                    ops: rate(prev.0, totals.0),
                    read: rate(prev.1, totals.1),
                    written: rate(prev.2, totals.2),
                });
                while self.samples.len() > KEEP {
                    self.samples.pop_front();
                }
            }
        }
        self.last = Some((at, totals));
    }
}

/// What the page is made of.
pub(super) struct Page {
    pub status: StatusText,
    pub history: Arc<Mutex<History>>,
    pub role: &'static str,
}

/// Samples `counters` every [`EVERY`] into `history`, for ever.
pub(super) async fn sample(counters: Counters, history: Arc<Mutex<History>>) {
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        history.lock().add(SystemTime::now(), counters());
    }
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// A line graph of `points` ((age in seconds, value), oldest first) as
/// SVG: from `span` seconds ago to now.
fn graph(title: &str, unit: &str, scale: f64, span: f64, points: &[(f64, f64)]) -> String {
    const W: f64 = 720.0;
    const H: f64 = 120.0;
    let max = points
        .iter()
        .map(|p| p.1 / scale)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let mut path = String::new();
    for (i, (age, v)) in points.iter().enumerate() {
        // x: 0 = `span` ago, W = now.
        let x = W * (1.0 - (age / span).clamp(0.0, 1.0));
        let y = H - H * (v / scale / max);
        let _ = write!(path, "{}{x:.1},{y:.1}", if i == 0 { "" } else { " " });
    }
    let last = points.last().map_or(0.0, |p| p.1 / scale);
    format!(
        "<figure><figcaption>{} — now {last:.1} {unit}, peak {max:.1} {unit} (last {} min)</figcaption>\
         <svg width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{}\">\
         <rect width=\"{W}\" height=\"{H}\" fill=\"#f6f6f6\"/>\
         <polyline fill=\"none\" stroke=\"#2060c0\" stroke-width=\"1.5\" points=\"{path}\"/>\
         </svg></figure>",
        escape(title),
        (span / 60.0).round(),
        escape(title)
    )
}

/// The page's HTML.
pub(super) async fn render(page: &Page) -> String {
    let status = (page.status)().await;
    let samples: Vec<Sample> = page.history.lock().samples.iter().copied().collect();
    let now = SystemTime::now();
    let pts = |f: fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        samples
            .iter()
            .map(|s| {
                let age = now
                    .duration_since(s.at)
                    .unwrap_or(Duration::ZERO)
                    .as_secs_f64();
                (age, f(s))
            })
            .collect()
    };
    let mib = 1024.0 * 1024.0;
    // From the oldest sample (five minutes at least) to now.
    let span = samples
        .first()
        .and_then(|s| now.duration_since(s.at).ok())
        .map_or(0.0, |d| d.as_secs_f64())
        .clamp(300.0, 3600.0);
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"10\"><title>morris</title>\
         <style>body{font-family:sans-serif;margin:1.5em}pre{background:#f6f6f6;padding:1em;\
         overflow-x:auto}figure{margin:1em 0}figcaption{font-size:90%}</style></head><body>",
    );
    let _ = write!(html, "<h1>morris {}</h1>", escape(page.role));
    match status {
        Ok((health, text)) => {
            let _ = write!(
                html,
                "<h2>Volume: {}</h2><pre>{}</pre>",
                escape(&health),
                escape(&text)
            );
        }
        Err(e) => {
            let _ = write!(
                html,
                "<h2>Volume</h2><p>The volume's state cannot be read now: {}</p>",
                escape(&e)
            );
        }
    }
    let _ = write!(
        html,
        "<h2>This server</h2><p>{} samples, one every {} s (the last hour is kept).</p>",
        samples.len(),
        EVERY.as_secs()
    );
    html += &graph("requests served", "/s", 1.0, span, &pts(|s| s.ops));
    html += &graph("block data read", "MiB/s", mib, span, &pts(|s| s.read));
    html += &graph(
        "block data written",
        "MiB/s",
        mib,
        span,
        &pts(|s| s.written),
    );
    html += "<p><a href=\"/metrics\">Prometheus metrics</a></p></body></html>\n";
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_an_hour_of_rates() {
        let mut h = History::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        h.add(t0, (0, 0, 0));
        assert!(h.samples.is_empty());
        h.add(t0 + Duration::from_secs(10), (100, 10 << 20, 0));
        assert_eq!(h.samples[0].ops, 10.0);
        assert_eq!(h.samples[0].read, f64::from(1 << 20));
        for i in 2..1000u64 {
            h.add(t0 + Duration::from_secs(10 * i), (100 * i, 0, 0));
        }
        assert_eq!(h.samples.len(), KEEP);
    }

    #[test]
    fn the_page_escapes_and_draws() {
        let page = Page {
            status: Arc::new(|| {
                Box::pin(async { Ok(("<ok>".to_string(), "volume x & y\n".to_string())) })
            }),
            history: Arc::new(Mutex::new(History::default())),
            role: "server",
        };
        let t = SystemTime::now();
        page.history
            .lock()
            .add(t - Duration::from_secs(20), (0, 0, 0));
        page.history
            .lock()
            .add(t - Duration::from_secs(10), (50, 0, 0));
        let html = futures::executor::block_on(render(&page));
        assert!(html.contains("Volume: &lt;ok&gt;"), "{html}");
        assert!(html.contains("volume x &amp; y"), "{html}");
        assert!(html.contains("<polyline"), "{html}");
        assert!(!html.contains("<ok>"), "{html}");
    }
}
