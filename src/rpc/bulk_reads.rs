//! Ranges that read many values, on threads of their own at a lower CPU priority.
//!
//! A Kubernetes list page reads hundreds of values (about 6 ms of CPU for 500 values of 2–8 KiB,
//! benches/RESULTS.md). On a member whose cores are all busy, the writes' path (the Raft log
//! thread, the apply, a put's answer) then waits for a core behind such reads. Here they run on
//! a few threads whose nice value is raised ([`NICE`]; on Linux a thread's own attribute), so
//! the scheduler hands a core to the writes' threads first; on idle cores they run at full
//! speed. The reads take no lock: they read a view of the store taken with the key index.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

/// Ranges reading at least this many values go to the bulk threads; smaller ones are answered
/// in place. The hand-off and the view cost about 30 µs of CPU a range: measured with 100 values
/// of 256 B, 15-22 % fewer ranges/s on a saturated member; a list page of 500 values takes
/// milliseconds.
pub const BULK_VALUES: usize = 256;

/// The bulk threads' nice value (0 is the default, 19 the lowest priority).
pub const NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// Runs `work` on a bulk thread and waits for its answer; `None` if it panicked. Work whose
/// caller has gone away (its request cancelled) is skipped. Where the bulk threads could not be
/// started, `work` runs on the runtime's blocking threads instead.
pub async fn run<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        if !tx.is_closed() {
            let _ = tx.send(work());
        }
    });
    let unsent = match pool() {
        Some(jobs) => jobs.send(job).err().map(|mpsc::SendError(job)| job),
        None => Some(job),
    };
    if let Some(job) = unsent {
        drop(tokio::task::spawn_blocking(job));
    }
    rx.await.ok()
}

/// The bulk threads' queue, started on first use (one thread per CPU); `None` if no thread
/// could be started.
fn pool() -> Option<&'static mpsc::Sender<Job>> {
    static POOL: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let started = (0..threads)
            .filter(|i| {
                let rx = Arc::clone(&rx);
                std::thread::Builder::new()
                    .name(format!("bulk-read-{i}"))
                    .spawn(move || serve(&rx))
                    .is_ok()
            })
            .count();
        (started > 0).then_some(tx)
    })
    .as_ref()
}

/// A bulk thread: lowers its priority, then runs jobs until the queue is gone. A job that
/// panics loses its answer (its caller sees `None`), not the thread.
fn serve(jobs: &Mutex<mpsc::Receiver<Job>>) {
    if let Err(e) = lower_priority() {
        tracing::debug!(error = %e, "bulk read thread keeps the default priority");
    }
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

/// Raises the calling thread's nice value to [`NICE`] (a process already nicer keeps its own:
/// lowering it back would need a privilege).
#[cfg(target_os = "linux")]
fn lower_priority() -> std::io::Result<()> {
    let me = Some(rustix::thread::gettid());
    let current = rustix::process::getpriority_process(me)?;
    rustix::process::setpriority_process(me, current.max(NICE))?;
    Ok(())
}

/// Elsewhere a thread's priority is the process's: the bulk threads keep it.
#[cfg(not(target_os = "linux"))]
fn lower_priority() -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use super::*;

    /// The calling thread's nice value.
    fn nice() -> Option<i32> {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).ok()
    }

    fn on_a_bulk_thread() -> bool {
        std::thread::current()
            .name()
            .is_some_and(|name| name.starts_with("bulk-read-"))
    }

    #[tokio::test]
    async fn work_runs_on_a_bulk_thread_of_lower_priority_and_the_caller_keeps_its_own() {
        let caller = nice();
        let got = run(|| (on_a_bulk_thread(), nice())).await;
        assert_eq!(got.map(|(bulk, _)| bulk), Some(true));
        let bulk_nice = got.and_then(|(_, n)| n);
        assert!(bulk_nice.is_some_and(|n| n >= NICE), "{bulk_nice:?}");
        assert!(
            bulk_nice > caller || caller.is_some_and(|n| n >= NICE),
            "bulk {bulk_nice:?}, caller {caller:?}"
        );
        assert_eq!(nice(), caller, "the calling thread keeps its priority");
    }

    #[tokio::test]
    async fn jobs_that_panic_answer_none_and_every_bulk_thread_goes_on() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        for _ in 0..=threads {
            assert_eq!(run(|| -> u32 { panic!("a failing read") }).await, None);
        }
        for i in 0..8u32 {
            assert_eq!(
                run(move || (on_a_bulk_thread(), i * 2)).await,
                Some((true, i * 2))
            );
        }
    }
}
