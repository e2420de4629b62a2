//! Store reads that may wait for the disk, kept from stalling the runtime.
//!
//! A range reads its values synchronously from fjall. While they are in the page cache that takes
//! microseconds, and the read runs right on the runtime worker that polled the request. On a cold
//! cache (after a restart, or with more data than memory) each value can wait milliseconds for
//! the disk, and with one worker per core a few such reads block every worker, so that no other
//! request (a put's answer included) is served until they end: measured as multi-second put
//! stalls at 32 GiB (benches/RESULTS.md, "a cold cache after restart").
//!
//! Moving a read off the worker (`block_in_place`: the worker's other tasks go to another
//! thread) costs a thread hand-off, about a third of the throughput of cached single-key reads
//! on two cores (measured), so it is done only while reads wait for the disk. Reads run in place
//! until one is slow ([`SLOW`]) on a thread that has read from the disk since its last slow read
//! (the kernel's per-thread `read_bytes`: a slow read that was only preempted, or only waited
//! for a lock, does not count); then, for [`OFF_WORKER_FOR`] after the last such read, every
//! read runs off the worker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::runtime::{Handle, RuntimeFlavor};

/// A read taking at least this long, on a thread that read from the disk, waited for the disk:
/// reads go off the workers for a while.
pub const SLOW: Duration = Duration::from_millis(2);

/// How long after the last slow read reads keep running off the workers.
pub const OFF_WORKER_FOR: Duration = Duration::from_secs(2);

/// Where reads run: in place, or off the worker until a moment it keeps.
pub struct Placement {
    /// The reference instant of `off_until_ms`.
    epoch: Instant,
    /// Milliseconds from `epoch` until which reads run off the workers (0: not yet).
    off_until_ms: AtomicU64,
    /// Whether the calling thread has read from the disk since it was last asked.
    read_from_disk: fn() -> bool,
}

impl Placement {
    /// Reads in place until one is slow on a thread that `read_from_disk` says has read from
    /// the disk.
    pub fn new(read_from_disk: fn() -> bool) -> Self {
        Placement {
            epoch: Instant::now(),
            off_until_ms: AtomicU64::new(0),
            read_from_disk,
        }
    }

    /// Milliseconds from `epoch` to `at`.
    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether reads run off the workers at `now`.
    pub fn off_worker_at(&self, now: Instant) -> bool {
        self.millis(now) < self.off_until_ms.load(Ordering::Relaxed)
    }

    /// Runs `read`, a read of the store: in place while reads are quick, off the runtime's
    /// worker (when there is a multi-threaded runtime to hand the worker's tasks to) while they
    /// are slow. `read` is told which: while reads are slow, a read should not hold the state's
    /// lock while it waits for the disk.
    pub fn run<T>(&self, read: impl FnOnce(bool) -> T) -> T {
        let started = Instant::now();
        let off_worker = self.off_worker_at(started)
            && Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
        let out = if off_worker {
            crate::metrics::READS_OFF_WORKER.fetch_add(1, Ordering::Relaxed);
            tokio::task::block_in_place(|| read(true))
        } else {
            read(false)
        };
        let ended = Instant::now();
        if ended.duration_since(started) >= SLOW && (self.read_from_disk)() {
            self.off_until_ms
                .fetch_max(self.millis(ended + OFF_WORKER_FOR), Ordering::Relaxed);
        }
        out
    }
}

/// Runs `read` with the process's placement: the page cache and the disk are the machine's.
pub fn run<T>(read: impl FnOnce(bool) -> T) -> T {
    static PROCESS: OnceLock<Placement> = OnceLock::new();
    PROCESS
        .get_or_init(|| Placement::new(thread_read_from_disk))
        .run(read)
}

/// Whether the calling thread has had bytes read from the disk for it since it last asked
/// (Linux's `/proc/thread-self/io`, `read_bytes`). Where that cannot be read, every slow read
/// is taken for a disk read.
pub fn thread_read_from_disk() -> bool {
    thread_local! {
        static LAST: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    let Some(now) = std::fs::read_to_string("/proc/thread-self/io")
        .ok()
        .and_then(|io| read_bytes(&io))
    else {
        return true;
    };
    LAST.with(|last| now > last.replace(now))
}

/// The `read_bytes` counter of a `/proc/*/io` text.
fn read_bytes(io: &str) -> Option<u64> {
    io.lines()
        .find_map(|line| line.strip_prefix("read_bytes:"))
        .and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow_read(_: bool) {
        std::thread::sleep(SLOW + Duration::from_millis(1));
    }

    fn disk() -> bool {
        true
    }

    fn no_disk() -> bool {
        false
    }

    #[test]
    fn a_slow_read_sends_the_next_reads_off_the_worker_for_a_while() {
        let placement = Placement::new(disk);
        let started = Instant::now();
        assert_eq!(placement.run(|_| 7), 7);
        // Checked only when the read was quick in fact (a preempted thread makes it slow).
        if started.elapsed() < SLOW {
            assert!(
                !placement.off_worker_at(Instant::now()),
                "a quick read moved reads"
            );
        }
        placement.run(slow_read);
        let now = Instant::now();
        assert!(placement.off_worker_at(now));
        assert!(!placement.off_worker_at(now + OFF_WORKER_FOR + Duration::from_millis(10)));
    }

    #[test]
    fn a_slow_read_without_the_disk_leaves_reads_in_place() {
        let placement = Placement::new(no_disk);
        placement.run(slow_read);
        assert!(!placement.off_worker_at(Instant::now()));
    }

    #[test]
    fn the_disk_counter_is_read_from_the_kernels_text() {
        let io = "rchar: 6976\nwchar: 0\nsyscr: 10\nsyscw: 0\nread_bytes: 40960\nwrite_bytes: 0\n";
        assert_eq!(read_bytes(io), Some(40960));
        assert_eq!(read_bytes("rchar: 1\n"), None);
        // A thread that reads nothing more from the disk is not taken to have read from it
        // twice (the first answer may count what it read before).
        let _ = thread_read_from_disk();
        let again = std::thread::spawn(|| {
            let _ = thread_read_from_disk();
            thread_read_from_disk()
        });
        // Where the counter cannot be read, every slow read counts as a disk read.
        let readable = std::fs::read_to_string("/proc/thread-self/io").is_ok();
        assert_eq!(again.join().ok(), Some(!readable));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn while_reads_are_slow_a_blocked_read_leaves_the_worker_to_other_tasks() {
        let placement = std::sync::Arc::new(Placement::new(disk));
        placement.run(slow_read);
        // One worker: the task below blocks it in a read until a task it spawned has run, which
        // can only happen if the read handed the worker over.
        let on_worker = placement.clone();
        let reader = tokio::spawn(async move {
            let (tx, rx) = std::sync::mpsc::channel();
            let sender = tokio::spawn(async move {
                let _ = tx.send(());
            });
            let got = on_worker.run(|_| rx.recv_timeout(Duration::from_secs(5)).is_ok());
            (got, sender.await.is_ok())
        });
        let (got, sender_ended) = reader.await.unwrap_or((false, false));
        assert!(got, "the other task did not run while the read blocked");
        assert!(sender_ended);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn while_reads_are_quick_they_stay_on_the_worker() {
        let placement = std::sync::Arc::new(Placement::new(disk));
        let on_worker = placement.clone();
        let reader = tokio::spawn(async move {
            let (tx, rx) = std::sync::mpsc::channel();
            let sender = tokio::spawn(async move {
                let _ = tx.send(());
            });
            // Quick reads keep the worker: the spawned task has not run while this one holds it.
            let got = on_worker.run(|_| rx.try_recv().is_ok());
            let _ = sender.await;
            got
        });
        assert_eq!(reader.await.ok(), Some(false));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn on_a_current_thread_runtime_reads_run_in_place() {
        let placement = Placement::new(disk);
        placement.run(slow_read);
        assert_eq!(placement.run(|_| 3), 3);
    }
}
