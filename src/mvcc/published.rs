//! [`Published`]: what the store makes readable without its state lock, which an apply holds
//! through its disk write and a snapshot install for its whole length: the revision counters
//! (every response header carries the current revision), the raised alarms, and whether the
//! state can be read at all.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};

use super::records::alarm_bits;
use super::store::State;

/// Whether the keyspaces hold a readable state (see [`Published::readable`]).
const READABLE: u8 = 0;
/// A snapshot install is replacing the keyspaces.
const INSTALLING: u8 = 1;
/// An install failed half-way: the keyspaces hold neither state.
const FAILED: u8 = 2;

/// The store's counters and flags as of its last commit.
#[derive(Debug, Default)]
pub(super) struct Published {
    /// The raised alarm types as a bit set (bit `t` for type `t`).
    raised: AtomicU64,
    current: AtomicI64,
    compacted: AtomicI64,
    condition: AtomicU8,
}

/// Why the state cannot be read now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unreadable {
    /// A snapshot is being installed: the state will be readable again when it ends.
    Installing,
    /// An install failed, or a write batch was dropped uncommitted: the member can no longer
    /// serve.
    Failed,
}

impl Published {
    /// Publishes `state`'s counters and alarms.
    pub(super) fn publish(&self, state: &State) {
        self.publish_counters(state);
        self.raised
            .store(alarm_bits(&state.alarms), Ordering::Release);
    }

    /// Publishes `state`'s revision counters.
    pub(super) fn publish_counters(&self, state: &State) {
        self.current.store(state.current, Ordering::Release);
        self.compacted.store(state.compacted, Ordering::Release);
    }

    /// The current main revision.
    pub(super) fn current(&self) -> i64 {
        self.current.load(Ordering::Acquire)
    }

    /// The last compacted main revision.
    pub(super) fn compacted(&self) -> i64 {
        self.compacted.load(Ordering::Acquire)
    }

    /// The raised alarm types as a bit set.
    pub(super) fn raised(&self) -> u64 {
        self.raised.load(Ordering::Acquire)
    }

    /// Marks the start of an install; [`Published::installed`] or [`Published::failed`] ends it.
    pub(super) fn installing(&self) {
        self.condition.store(INSTALLING, Ordering::Release);
    }

    /// Marks an install done: the state is readable again.
    pub(super) fn installed(&self) {
        self.condition.store(READABLE, Ordering::Release);
    }

    /// Marks the state unreadable for good: an install failed half-way, or a write batch was
    /// dropped uncommitted.
    pub(super) fn failed(&self) {
        self.condition.store(FAILED, Ordering::Release);
    }

    /// `Ok` when the state can be read.
    pub(super) fn readable(&self) -> Result<(), Unreadable> {
        match self.condition.load(Ordering::Acquire) {
            READABLE => Ok(()),
            INSTALLING => Err(Unreadable::Installing),
            _ => Err(Unreadable::Failed),
        }
    }
}
