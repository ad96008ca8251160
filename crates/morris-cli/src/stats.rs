//! `morris stats ENDPOINT...`: a live view, one line per endpoint per
//! interval, of what servers, mounts and NFS gateways are doing — read from
//! their Prometheus endpoints (`--metrics`, issue 20), so it works on any
//! host that can reach them.
//!
//! Each line is the difference between two scrapes: operations per second
//! (FUSE requests of a mount, NFS calls of a gateway, requests served by a
//! server), their mean and 99th-percentile time (from the histograms'
//! buckets), MiB/s read and written (a client's payload bytes to and from
//! the servers; a server's block bytes), and state now (leases,
//! connections, bytes gathered for write-behind).

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use prometheus_parse::{Sample, Scrape, Value};
use serde::Serialize;

/// Arguments of `morris stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Metrics endpoints of servers, mounts or gateways: HOST:PORT (as
    /// given to --metrics, or printed by `morris up`), a full http:// URL,
    /// or the mount point of a mount started with --metrics.
    #[arg(required = true, value_name = "ENDPOINT")]
    pub endpoints: Vec<String>,
    /// Time between lines.
    #[arg(long, default_value = "1s", value_name = "DURATION",
          value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Print one line per endpoint (over one interval) and exit.
    #[arg(long)]
    pub once: bool,
    /// Print JSON objects, one per line and endpoint, instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The parts of one scrape that the view uses.
#[derive(Debug, Default, Clone)]
struct Sampled {
    role: String,
    /// Operations: (count, sum of seconds), and cumulative buckets (le → count).
    ops: f64,
    ops_seconds: f64,
    buckets: Vec<(f64, f64)>,
    read_bytes: f64,
    written_bytes: f64,
    /// Requests a client sent to the servers.
    requests: f64,
    leases: f64,
    connections: Option<f64>,
    behind: Option<f64>,
    /// Cache mode: reads answered from cached units, and fetched from home.
    cache_hits: f64,
    cache_misses: f64,
}

/// One line of the view.
#[derive(Debug, Serialize, PartialEq)]
pub struct Line {
    /// The endpoint.
    pub endpoint: String,
    /// `server`, `mount` or `nfs`.
    pub role: String,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Mean time of an operation, milliseconds.
    pub mean_ms: f64,
    /// 99th percentile of an operation's time, milliseconds (bucket bound).
    pub p99_ms: f64,
    /// Operations in the interval.
    pub ops: u64,
    /// Bytes read in the interval.
    pub read_bytes: u64,
    /// Bytes written in the interval.
    pub written_bytes: u64,
    /// MiB/s read.
    pub read_mib_s: f64,
    /// MiB/s written.
    pub write_mib_s: f64,
    /// A client's requests to servers per second (0 for a server).
    pub requests_per_s: f64,
    /// Leases held (a client) or granted (a server) now.
    pub leases: f64,
    /// Connections open now (a server).
    pub connections: Option<f64>,
    /// Bytes gathered for write-behind now (a client).
    pub write_behind_bytes: Option<f64>,
    /// Cache mode (a server): the share of reads of cached data answered
    /// without home in the interval, if there were any.
    pub cache_hit_ratio: Option<f64>,
}

/// The operation histogram of each role.
fn ops_metric(role: &str) -> &'static str {
    match role {
        "server" => "morris_server_request_duration_seconds",
        "nfs" => "morris_nfs_request_duration_seconds",
        _ => "morris_fuse_request_duration_seconds",
    }
}

fn value(s: &Sample) -> f64 {
    match &s.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        _ => 0.0,
    }
}

/// Sums the samples named `name`.
fn sum(scrape: &Scrape, name: &str) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .map(value)
        .sum()
}

fn find(scrape: &Scrape, name: &str) -> Option<f64> {
    scrape
        .samples
        .iter()
        .any(|s| s.metric == name)
        .then(|| sum(scrape, name))
}

/// What the view needs from a scrape's text.
fn digest(text: &str) -> Result<Sampled> {
    let scrape =
        Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).context("not Prometheus text")?;
    let role = scrape
        .samples
        .iter()
        .find(|s| s.metric == "morris_build_info")
        .and_then(|s| s.labels.get("role").map(str::to_string))
        .context("not a morris metrics endpoint (no morris_build_info)")?;
    let ops = ops_metric(&role);
    let mut buckets: HashMap<u64, (f64, f64)> = HashMap::new();
    for s in scrape.samples.iter().filter(|s| s.metric == ops) {
        if let Value::Histogram(hs) = &s.value {
            for h in hs {
                let e = buckets
                    .entry(h.less_than.to_bits())
                    .or_insert((h.less_than, 0.0));
                e.1 += h.count;
            }
        }
    }
    let mut buckets: Vec<(f64, f64)> = buckets.into_values().collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (read, written) = if role == "server" {
        (
            "morris_server_read_bytes_total",
            "morris_server_written_bytes_total",
        )
    } else {
        (
            "morris_client_received_bytes_total",
            "morris_client_sent_bytes_total",
        )
    };
    let (requests, leases, behind) = if role == "server" {
        (0.0, sum(&scrape, "morris_server_leases"), None)
    } else {
        (
            sum(&scrape, "morris_client_request_duration_seconds_count"),
            sum(&scrape, "morris_client_leases"),
            find(&scrape, "morris_client_write_behind_gathered_bytes"),
        )
    };
    Ok(Sampled {
        ops: sum(&scrape, &format!("{ops}_count")),
        ops_seconds: sum(&scrape, &format!("{ops}_sum")),
        buckets,
        read_bytes: sum(&scrape, read),
        written_bytes: sum(&scrape, written),
        requests,
        leases,
        connections: find(&scrape, "morris_server_connections"),
        behind,
        cache_hits: sum(&scrape, "morris_server_cache_hits_total"),
        cache_misses: sum(&scrape, "morris_server_cache_misses_total"),
        role,
    })
}

/// The `q` quantile's bucket bound of the operations between two scrapes.
fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let old: HashMap<u64, f64> = before.iter().map(|(le, c)| (le.to_bits(), *c)).collect();
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, c)| (*le, c - old.get(&le.to_bits()).copied().unwrap_or(0.0)))
        .collect();
    let Some(total) = delta.last().map(|d| d.1) else {
        return 0.0;
    };
    if total <= 0.0 {
        return 0.0;
    }
    let want = total * q;
    delta
        .iter()
        .find(|(_, c)| *c >= want)
        .map_or(0.0, |(le, _)| *le)
}

/// The line for `endpoint` between scrapes `a` and `b`, `secs` apart.
fn line(endpoint: &str, a: &Sampled, b: &Sampled, secs: f64) -> Line {
    let rate = |x: f64, y: f64| ((y - x) / secs).max(0.0);
    let ops = (b.ops - a.ops).max(0.0);
    let mib = 1024.0 * 1024.0;
    Line {
        endpoint: endpoint.to_string(),
        role: b.role.clone(),
        ops_per_s: ops / secs,
        mean_ms: if ops > 0.0 {
            (b.ops_seconds - a.ops_seconds) / ops * 1000.0
        } else {
            0.0
        },
        p99_ms: quantile(&a.buckets, &b.buckets, 0.99) * 1000.0,
        ops: ops as u64,
        read_bytes: (b.read_bytes - a.read_bytes).max(0.0) as u64,
        written_bytes: (b.written_bytes - a.written_bytes).max(0.0) as u64,
        read_mib_s: rate(a.read_bytes, b.read_bytes) / mib,
        write_mib_s: rate(a.written_bytes, b.written_bytes) / mib,
        requests_per_s: rate(a.requests, b.requests),
        leases: b.leases,
        connections: b.connections,
        write_behind_bytes: b.behind,
        cache_hit_ratio: {
            let hits = (b.cache_hits - a.cache_hits).max(0.0);
            let all = hits + (b.cache_misses - a.cache_misses).max(0.0);
            (all > 0.0).then(|| hits / all)
        },
    }
}

/// The URL of an endpoint given as HOST:PORT or a URL.
fn url_of(endpoint: &str) -> String {
    if endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}/metrics")
    }
}

fn fetch(agent: &ureq::Agent, endpoint: &str) -> Result<Sampled> {
    let url = url_of(endpoint);
    let text = agent
        .get(&url)
        .call()
        .with_context(|| format!("cannot read {url}"))?
        .body_mut()
        .read_to_string()
        .with_context(|| format!("cannot read {url}"))?;
    digest(&text).with_context(|| url.clone())
}

fn header() -> String {
    format!(
        "{:<8}  {:<22} {:<6} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>7} {:>6} {:>9} {:>5}",
        "time",
        "endpoint",
        "role",
        "ops/s",
        "mean ms",
        "p99 ms",
        "read MB/s",
        "write MB/s",
        "req/s",
        "leases",
        "conns",
        "behind",
        "hit%"
    )
}

fn row(l: &Line) -> String {
    let opt = |v: Option<f64>, w: usize| match v {
        Some(x) => format!("{x:>w$.0}"),
        None => format!("{:>w$}", "-"),
    };
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let clock = now.get(11..19).unwrap_or("");
    format!(
        "{clock:<8}  {:<22} {:<6} {:>9.0} {:>8.3} {:>8.3} {:>9.1} {:>10.1} {:>9.0} {:>7.0} {} {} {}",
        l.endpoint,
        l.role,
        l.ops_per_s,
        l.mean_ms,
        l.p99_ms,
        l.read_mib_s,
        l.write_mib_s,
        l.requests_per_s,
        l.leases,
        opt(l.connections, 6),
        opt(l.write_behind_bytes, 9),
        opt(l.cache_hit_ratio.map(|r| r * 100.0), 5),
    )
}

/// Runs `morris stats`.
pub fn run(args: StatsArgs) -> Result<ExitCode> {
    if args.interval.is_zero() {
        bail!("--interval must be more than 0");
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    // A mount point stands for the endpoint its mount noted.
    let endpoints: Vec<String> = args
        .endpoints
        .iter()
        .map(|e| {
            if e.starts_with('/') || e.starts_with('.') || std::path::Path::new(e).is_dir() {
                crate::exporter::noted_metrics(std::path::Path::new(e))
            } else {
                Ok(e.clone())
            }
        })
        .collect::<Result<_>>()?;
    let args = StatsArgs { endpoints, ..args };
    let mut last: Vec<(Instant, Sampled)> = Vec::new();
    for e in &args.endpoints {
        last.push((Instant::now(), fetch(&agent, e)?));
    }
    let mut out = std::io::stdout().lock();
    let mut printed = 0u64;
    loop {
        std::thread::sleep(args.interval);
        if !args.json && printed.is_multiple_of(20) {
            writeln!(out, "{}", header())?;
        }
        for (i, e) in args.endpoints.iter().enumerate() {
            let now = Instant::now();
            let s = match fetch(&agent, e) {
                Ok(s) => s,
                Err(err) if !args.once => {
                    writeln!(out, "{e}: {err:#}")?;
                    continue;
                }
                Err(err) => return Err(err),
            };
            let secs = now.duration_since(last[i].0).as_secs_f64().max(1e-3);
            let l = line(e, &last[i].1, &s, secs);
            if args.json {
                writeln!(out, "{}", serde_json::to_string(&l)?)?;
            } else {
                writeln!(out, "{}", row(&l))?;
            }
            last[i] = (now, s);
        }
        out.flush()?;
        printed += 1;
        if args.once {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# TYPE morris_build_info gauge
morris_build_info{version=\"0.1.0\",role=\"server\"} 1
# TYPE morris_server_request_duration_seconds histogram
morris_server_request_duration_seconds_bucket{op=\"Read\",le=\"0.001\"} 90
morris_server_request_duration_seconds_bucket{op=\"Read\",le=\"0.01\"} 99
morris_server_request_duration_seconds_bucket{op=\"Read\",le=\"+Inf\"} 100
morris_server_request_duration_seconds_sum{op=\"Read\"} 0.2
morris_server_request_duration_seconds_count{op=\"Read\"} 100
morris_server_request_duration_seconds_bucket{op=\"Write\",le=\"0.001\"} 0
morris_server_request_duration_seconds_bucket{op=\"Write\",le=\"0.01\"} 0
morris_server_request_duration_seconds_bucket{op=\"Write\",le=\"+Inf\"} 100
morris_server_request_duration_seconds_sum{op=\"Write\"} 3
morris_server_request_duration_seconds_count{op=\"Write\"} 100
# TYPE morris_server_read_bytes_total counter
morris_server_read_bytes_total{copy=\"0\"} 1048576
morris_server_read_bytes_total{copy=\"1\"} 1048576
# TYPE morris_server_connections gauge
morris_server_connections 7
";

    #[test]
    fn a_line_is_the_difference_of_two_scrapes() {
        let b = digest(TEXT).unwrap();
        assert_eq!(b.role, "server");
        assert_eq!(b.ops, 200.0);
        let a = Sampled {
            role: "server".into(),
            ..Sampled::default()
        };
        let l = line("h:1", &a, &b, 2.0);
        assert_eq!(l.ops_per_s, 100.0);
        assert!((l.mean_ms - 16.0).abs() < 1e-9, "{}", l.mean_ms);
        assert_eq!(l.read_mib_s, 1.0);
        assert_eq!(l.connections, Some(7.0));
        // 90 + 99 of 200 within 10 ms; the 99th percentile is past it.
        assert!(l.p99_ms.is_infinite(), "{}", l.p99_ms);
        assert_eq!(quantile(&[], &b.buckets, 0.4), 0.001);
    }

    #[test]
    fn other_endpoints_are_refused() {
        assert!(digest("# TYPE x counter\nx 1\n").is_err());
        assert!(digest("garbage{").is_err());
    }
}
