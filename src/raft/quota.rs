//! [`QuotaMeter`]: the backend size that etcd's space quota compares with `--quota-backend-bytes`,
//! measured in the background so that no request waits for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use crate::storage::Storage;

/// How old a measurement may get before the next write starts a new one.
const MEASURE_EVERY_MS: u64 = 100;

/// The last measured backend size plus what growing proposals admitted since then may add.
///
/// Measuring walks every table of the state keyspaces and takes fjall's version locks, which a
/// memtable flush holds through its fsyncs: a request thread must never do it. A write that
/// finds the measurement stale starts one on a blocking thread and goes on with the last value
/// plus every byte admitted since that measurement began, so a burst cannot run past the quota.
pub struct QuotaMeter {
    storage: Storage,
    started: Instant,
    /// The last measured size.
    size: AtomicU64,
    /// When the last measurement began, in ms since `started` (0: never, or invalidated).
    measured_ms: AtomicU64,
    /// Bytes admitted since the last measurement began.
    pending: AtomicU64,
    /// Whether a background measurement is running.
    measuring: AtomicBool,
}

impl QuotaMeter {
    /// A meter over `storage`'s state keyspaces; the first write measures.
    pub fn new(storage: Storage) -> Arc<Self> {
        Arc::new(QuotaMeter {
            storage,
            started: Instant::now(),
            size: AtomicU64::new(0),
            measured_ms: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            measuring: AtomicBool::new(false),
        })
    }

    /// The backend size as far as the quota is concerned: the last measurement plus the bytes
    /// admitted since. Starts a background measurement when the last one is stale; measures in
    /// place only when there is none yet (start-up, or after [`QuotaMeter::invalidate`]).
    pub fn size(self: &Arc<Self>) -> u64 {
        let now = self.now_ms();
        let measured = self.measured_ms.load(Relaxed);
        let stale = measured == 0 || now.saturating_sub(measured) >= MEASURE_EVERY_MS;
        // One measurement at a time: two would both subtract the same admitted bytes.
        if stale && !self.measuring.swap(true, Relaxed) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) if measured != 0 => {
                    let meter = Arc::clone(self);
                    runtime.spawn_blocking(move || meter.measure());
                }
                // The first measurement (or one outside a runtime) is taken in place.
                _ => self.measure(),
            }
        }
        self.size.load(Relaxed) + self.pending.load(Relaxed)
    }

    /// Counts `bytes` of an admitted proposal until the next measurement.
    pub fn admit(&self, bytes: u64) {
        self.pending.fetch_add(bytes, Relaxed);
    }

    /// Makes the measurement stale (after a defragment): the next write starts a new one in
    /// the background and goes on with the old size meanwhile, which errs towards refusing (a
    /// defragment only shrinks the state). Measuring in place there held a request's worker
    /// behind fjall's version lock, which the defragment's last table change holds through its
    /// fsyncs.
    pub fn invalidate(&self) {
        // 1, not 0: 0 means "never measured", which the next write measures in place.
        self.measured_ms.store(1, Relaxed);
    }

    /// Takes a measurement and ends the one in flight. Until it is stored, readers keep seeing
    /// the old size plus every admitted byte; bytes admitted while it runs stay counted (perhaps
    /// twice: the quota errs towards refusing, never towards passing).
    fn measure(&self) {
        self.measured_ms.store(self.now_ms().max(1), Relaxed);
        let counted = self.pending.load(Relaxed);
        self.size.store(self.storage.state_size(), Relaxed);
        self.pending.fetch_sub(counted, Relaxed);
        self.measuring.store(false, Relaxed);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StorageResult;

    #[test]
    fn admitted_bytes_count_until_the_next_measurement() -> StorageResult<()> {
        let dir = tempfile::tempdir().map_err(|e| crate::storage::StorageError(e.to_string()))?;
        let storage = Storage::open(dir.path())?;
        let meter = QuotaMeter::new(storage.clone());
        let measured = meter.size();
        assert_eq!(measured, storage.state_size());
        meter.admit(1000);
        meter.admit(24);
        assert_eq!(meter.pending.load(Relaxed), 1024);
        // Invalidated, the next call measures again (in place here, outside a runtime): the
        // admitted bytes are in the measurement (nothing was written, so they are simply gone).
        std::thread::sleep(std::time::Duration::from_millis(MEASURE_EVERY_MS + 10));
        meter.invalidate();
        assert_eq!(meter.size(), storage.state_size());
        Ok(())
    }

    #[test]
    fn a_write_after_a_defragment_does_not_measure_in_place() -> StorageResult<()> {
        let failed = |e: std::io::Error| crate::storage::StorageError(e.to_string());
        let dir = tempfile::tempdir().map_err(failed)?;
        let storage = Storage::open(dir.path())?;
        // One blocking thread, kept busy until released: a measurement started in the
        // background cannot have run when `size` returns.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .enable_time()
            .build()
            .map_err(failed)?;
        runtime.block_on(async {
            let meter = QuotaMeter::new(storage.clone());
            let measured = meter.size();
            meter.admit(500);
            let (release, held) = std::sync::mpsc::channel::<()>();
            let blocker = tokio::task::spawn_blocking(move || held.recv().is_ok());
            tokio::time::sleep(std::time::Duration::from_millis(MEASURE_EVERY_MS + 10)).await;
            meter.invalidate();
            // The old size and the admitted bytes: the measurement waits for the thread.
            assert_eq!(meter.size(), measured + 500);
            assert!(meter.measuring.load(Relaxed));
            let _ = release.send(());
            let _ = blocker.await;
            while meter.measuring.load(Relaxed) {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            assert_eq!(meter.pending.load(Relaxed), 0);
            assert_eq!(meter.size(), storage.state_size());
        });
        Ok(())
    }

    #[test]
    fn a_measurement_in_flight_is_not_doubled() -> StorageResult<()> {
        let dir = tempfile::tempdir().map_err(|e| crate::storage::StorageError(e.to_string()))?;
        let storage = Storage::open(dir.path())?;
        let meter = QuotaMeter::new(storage.clone());
        let measured = meter.size();
        meter.admit(500);
        // A background measurement is running; an invalidation (a defragment) must not start a
        // second one, which would subtract the same admitted bytes again.
        meter.measuring.store(true, Relaxed);
        meter.invalidate();
        assert_eq!(meter.size(), measured + 500);
        assert_eq!(meter.pending.load(Relaxed), 500);
        // The running one finishes and counts the admitted bytes as measured.
        meter.measure();
        assert_eq!(meter.pending.load(Relaxed), 0);
        assert!(!meter.measuring.load(Relaxed));
        Ok(())
    }
}
