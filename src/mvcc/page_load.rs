//! Reading the values of a range's keys. A page of a large list (Kubernetes asks for 500
//! objects at a time) is hundreds of point reads, each a key-index lookup in the LSM tree and
//! often a blob-file read; they are independent, so a large page spreads them over the
//! machine's cores while its client waits, instead of leaving all but one idle (as long as
//! other requests do not keep those cores busy already).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::store::load_from_disk;
use super::KeyRevision;
use crate::error::Result;
use crate::pb::mvccpb::KeyValue;
use crate::storage::Storage;

/// Pages with fewer keys than this are read on the calling thread alone: below it, starting a
/// thread costs about as much as it saves.
const PARALLEL_FROM: usize = 128;
/// At most this many threads read one page.
const MAX_THREADS: usize = 4;

/// Helper threads reading pages now, across all requests: at most one fewer than the cores, so
/// that concurrent large ranges on a busy member read on their own threads as before rather
/// than crowd the cores with more threads.
static HELPERS: AtomicUsize = AtomicUsize::new(0);

/// The key-values of `keys`, in order, read on up to [`MAX_THREADS`] threads.
///
/// # Errors
/// The first read failure.
pub(super) fn load_page(
    storage: &Storage,
    keys: &[(Vec<u8>, KeyRevision)],
) -> Result<Vec<KeyValue>> {
    let wanted = threads_for(keys.len()).saturating_sub(1);
    let Some(helpers) = Helpers::take(&HELPERS, cores().saturating_sub(1), wanted) else {
        return load_sequential(storage, keys);
    };
    let threads = helpers.count + 1;
    let chunk = keys.len().div_ceil(threads);
    let mut parts = keys.chunks(chunk);
    let first = parts.next().unwrap_or_default();
    std::thread::scope(|scope| {
        let others: Vec<_> = parts
            .map(|part| scope.spawn(move || load_sequential(storage, part)))
            .collect();
        let mut out = load_sequential(storage, first)?;
        out.reserve(keys.len() - out.len());
        for handle in others {
            // A reader that panicked is a bug, not a client's doing; report it as a failed read.
            let part = handle.join().map_err(|_| crate::error::Error::Storage)??;
            out.extend(part);
        }
        Ok(out)
    })
}

fn load_sequential(storage: &Storage, keys: &[(Vec<u8>, KeyRevision)]) -> Result<Vec<KeyValue>> {
    keys.iter()
        .map(|(key, change)| load_from_disk(storage, key, change))
        .collect()
}

/// Helper threads taken from a counter (in the server, [`HELPERS`]), given back when dropped.
struct Helpers<'a> {
    busy: &'a AtomicUsize,
    count: usize,
}

impl<'a> Helpers<'a> {
    /// `wanted` helpers (fewer if fewer are free) from `busy`, which may reach `limit`; `None`
    /// if none is free.
    fn take(busy: &'a AtomicUsize, limit: usize, wanted: usize) -> Option<Helpers<'a>> {
        let mut taken = 0;
        let _ = busy.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            taken = limit.saturating_sub(now).min(wanted);
            (taken > 0).then_some(now + taken)
        });
        (taken > 0).then_some(Helpers { busy, count: taken })
    }
}

impl Drop for Helpers<'_> {
    fn drop(&mut self) {
        self.busy.fetch_sub(self.count, Ordering::AcqRel);
    }
}

fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// How many threads read a page of `len` keys.
fn threads_for(len: usize) -> usize {
    if len < PARALLEL_FROM {
        1
    } else {
        cores()
            .min(MAX_THREADS)
            .min(len / (PARALLEL_FROM / 2))
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_pages_stay_on_the_calling_thread() {
        assert_eq!(threads_for(0), 1);
        assert_eq!(threads_for(PARALLEL_FROM - 1), 1);
        assert!(threads_for(10_000) <= MAX_THREADS);
        assert!(threads_for(PARALLEL_FROM) <= 2);
    }

    #[test]
    fn helpers_are_bounded_and_given_back() {
        let busy = AtomicUsize::new(0);
        let three = Helpers::take(&busy, 3, 5);
        assert_eq!(
            three.as_ref().map(|h| h.count),
            Some(3),
            "no more than the limit"
        );
        assert!(
            Helpers::take(&busy, 3, 1).is_none(),
            "none left while all are taken"
        );
        drop(three);
        let one = Helpers::take(&busy, 3, 1);
        assert_eq!(one.as_ref().map(|h| h.count), Some(1));
        assert_eq!(Helpers::take(&busy, 3, 5).map(|h| h.count), Some(2));
        drop(one);
        assert_eq!(busy.load(Ordering::Acquire), 0, "all given back");
        assert!(Helpers::take(&busy, 0, 1).is_none(), "one core: no helper");
    }
}
