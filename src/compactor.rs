//! Auto compaction (`--auto-compaction-mode`, `--auto-compaction-retention`), as etcd 3.5 does
//! it. The leader proposes the compactions; other members keep sampling so that a new leader
//! continues where the old one stopped.
//!
//! - revision mode keeps the last `retention` revisions: every five minutes it compacts to
//!   `current - retention`.
//! - periodic mode keeps `retention` of history: it samples the revision every tenth of the
//!   retention (at most every hour) and compacts to the revision it saw `retention` ago.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::apply::{Command, Op};
use crate::config::Retention;
use crate::pb::etcdserverpb::CompactionRequest;
use crate::raft::RaftNode;

/// How often revision mode looks (etcd: five minutes).
const REVISION_CHECK: Duration = Duration::from_secs(300);

/// Starts auto compaction for `retention` on `node` (nothing when off).
pub fn spawn(
    node: Arc<RaftNode>,
    retention: Retention,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let (every, keep) = match retention {
        Retention::Off => return,
        Retention::Revisions(_) => (REVISION_CHECK, Duration::ZERO),
        Retention::Period(p) => (
            (p / 10)
                .min(Duration::from_secs(3600))
                .max(Duration::from_millis(100)),
            p,
        ),
    };
    tokio::spawn(async move {
        let mut samples: VecDeque<(Instant, i64)> = VecDeque::new();
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.changed() => return,
            }
            let now = Instant::now();
            let current = node.mvcc().current_revision();
            samples.push_back((now, current));
            let target = match retention {
                Retention::Revisions(n) => current - n,
                _ => {
                    // The newest sample at least `keep` old.
                    let mut target = None;
                    while let Some(&(at, rev)) = samples.front() {
                        if now.duration_since(at) < keep {
                            break;
                        }
                        target = Some(rev);
                        samples.pop_front();
                    }
                    match target {
                        Some(t) => t,
                        None => continue,
                    }
                }
            };
            if node.leader() != Some(node.id)
                || target <= node.mvcc().compacted_revision()
                || target <= 0
            {
                continue;
            }
            let cmd = Command::new(Op::Compaction(CompactionRequest {
                revision: target,
                physical: false,
            }));
            match node.propose(cmd).await {
                Ok(_) => tracing::info!(revision = target, "auto compaction"),
                Err(e) => tracing::warn!(revision = target, error = %e, "auto compaction failed"),
            }
        }
    });
}
