//! Results: latency histograms, throughput, and the servers' resources from `/proc`.

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::Args;

/// What a workload measured.
pub struct Measured {
    /// Latencies in microseconds.
    pub latency: Histogram<u64>,
    /// Completed operations (for watch: delivered events).
    pub ops: u64,
    /// Failed operations.
    pub errors: u64,
    /// Measured time.
    pub elapsed: Duration,
    /// The servers' CPU seconds and disk writes over the measured time alone (not the
    /// connection set-up, prefill and warm-up), when sampled.
    pub server_usage: Option<ProcStats>,
    /// This load generator's own CPU seconds over the same time, when sampled (on a machine
    /// it shares with the server, what it spends per operation is taken from the server).
    pub client_cpu: Option<f64>,
}

impl Measured {
    /// An empty measurement (latencies 1 µs to 1 min, 3 significant digits).
    pub fn new() -> anyhow::Result<Self> {
        Ok(Measured {
            latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            ops: 0,
            errors: 0,
            elapsed: Duration::ZERO,
            server_usage: None,
            client_cpu: None,
        })
    }

    /// Adds another client's measurement.
    pub fn merge(&mut self, other: &Measured) -> anyhow::Result<()> {
        self.latency.add(&other.latency)?;
        self.ops += other.ops;
        self.errors += other.errors;
        Ok(())
    }

    /// Records one operation that took `d`.
    pub fn record(&mut self, d: Duration) {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        let _ = self.latency.record(micros.min(60_000_000));
        self.ops += 1;
    }
}

/// Peak resident memory, CPU time and disk writes of the server processes, from `/proc`.
#[derive(Default, Clone, Copy)]
pub struct ProcStats {
    /// Sum over the servers of VmHWM, bytes.
    pub peak_rss: u64,
    /// Sum over the servers of user + system CPU, seconds.
    pub cpu: f64,
    /// Sum over the servers of the bytes they caused to be written to storage (`write_bytes`
    /// of `/proc/<pid>/io`: charged when a page is dirtied, so another process's writeback is
    /// not counted; readable by the processes' owner or root, else zero).
    pub written: u64,
}

impl ProcStats {
    /// Reads the stats of `pids` (missing processes count as zero).
    pub fn read(pids: &[u32]) -> Self {
        let mut s = ProcStats::default();
        for pid in pids {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                let hwm = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok());
                s.peak_rss += hwm.unwrap_or(0) * 1024;
            }
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                // Fields after the command (which may contain spaces): utime is 14th, stime 15th.
                let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
                let f: Vec<&str> = rest.split_whitespace().collect();
                let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                s.cpu += (ticks(11) + ticks(12)) / 100.0;
            }
            if let Ok(io) = std::fs::read_to_string(format!("/proc/{pid}/io")) {
                let written = io
                    .lines()
                    .find_map(|l| l.strip_prefix("write_bytes:"))
                    .and_then(|v| v.trim().parse::<u64>().ok());
                s.written += written.unwrap_or(0);
            }
        }
        s
    }
}

/// The CPU seconds the processes `pids` use and the bytes they write between `from` and `to`
/// (peak memory as at `to`), and this process's own CPU seconds, sampled by a task.
pub fn server_usage(
    pids: &[u32],
    from: std::time::Instant,
    to: std::time::Instant,
) -> tokio::task::JoinHandle<(ProcStats, f64)> {
    let pids = pids.to_vec();
    let me = [std::process::id()];
    tokio::spawn(async move {
        tokio::time::sleep_until(from.into()).await;
        let (before, me_before) = (ProcStats::read(&pids), ProcStats::read(&me));
        tokio::time::sleep_until(to.into()).await;
        let (after, me_after) = (ProcStats::read(&pids), ProcStats::read(&me));
        let usage = ProcStats {
            peak_rss: after.peak_rss,
            cpu: after.cpu - before.cpu,
            written: after.written.saturating_sub(before.written),
        };
        (usage, me_after.cpu - me_before.cpu)
    })
}

/// One line of results.
pub struct Report {
    workload: String,
    clients: usize,
    rate: u64,
    ops_per_sec: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    /// The slowest request (a stall shows here first).
    max: f64,
    ops: u64,
    errors: u64,
    peak_rss: u64,
    cpu: f64,
    written: u64,
    client_cpu: Option<f64>,
}

impl Report {
    /// The report of `m`, with the servers' resources between `before` and `after`.
    pub fn new(args: &Args, m: Measured, before: ProcStats, after: ProcStats) -> Self {
        let ms = |q: f64| m.latency.value_at_quantile(q) as f64 / 1000.0;
        let secs = m.elapsed.as_secs_f64().max(1e-9);
        Report {
            workload: format!("{:?}", args.workload).to_lowercase(),
            clients: args.clients,
            rate: args.rate,
            ops_per_sec: m.ops as f64 / secs,
            p50: ms(0.5),
            p90: ms(0.9),
            p99: ms(0.99),
            p999: ms(0.999),
            max: m.latency.max() as f64 / 1000.0,
            ops: m.ops,
            errors: m.errors,
            peak_rss: after.peak_rss,
            cpu: m.server_usage.map_or(after.cpu - before.cpu, |u| u.cpu),
            written: m
                .server_usage
                .map_or(after.written.saturating_sub(before.written), |u| u.written),
            client_cpu: m.client_cpu,
        }
    }

    /// Human-readable.
    pub fn text(&self) -> String {
        format!(
            "{}: {:.0} ops/s ({} ops, {} errors, {} clients{}), latency ms p50 {:.3} p90 {:.3} p99 {:.3} p99.9 {:.3}{}",
            self.workload,
            self.ops_per_sec,
            self.ops,
            self.errors,
            self.clients,
            if self.rate > 0 { format!(", offered {}/s", self.rate) } else { String::new() },
            self.p50,
            self.p90,
            self.p99,
            self.p999,
            if self.peak_rss > 0 {
                format!(", server peak RSS {:.1} MiB, CPU {:.2} s", self.peak_rss as f64 / 1048576.0, self.cpu)
            } else {
                String::new()
            }
        )
    }

    /// One JSON object.
    pub fn json(&self) -> String {
        serde_json::json!({
            "workload": self.workload,
            "clients": self.clients,
            "rate": self.rate,
            "ops_per_sec": self.ops_per_sec,
            "ops": self.ops,
            "errors": self.errors,
            "p50_ms": self.p50,
            "p90_ms": self.p90,
            "p99_ms": self.p99,
            "p999_ms": self.p999,
            "max_ms": self.max,
            "server_peak_rss_bytes": self.peak_rss,
            "server_cpu_seconds": self.cpu,
            "server_write_bytes": self.written,
            "client_cpu_seconds": self.client_cpu,
        })
        .to_string()
    }
}
