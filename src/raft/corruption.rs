//! Corruption checks, as etcd's: before serving (`--experimental-initial-corrupt-check`) a
//! member compares its HashKV with its peers' and refuses to start on a mismatch; periodically
//! (`--experimental-corrupt-check-time`) the leader compares every member's at the current
//! revision, and (`--experimental-compact-hash-check-enabled`) at the last compaction's, and
//! raises the CORRUPT alarm.

use super::{first_url, RaftNode};

impl RaftNode {
    /// etcd's initial corruption check: this member's HashKV at its current revision against
    /// every reachable peer's at the same revision. A peer with the same compacted revision and
    /// another hash is a mismatch; unreachable, lagging or differently compacted peers are
    /// logged and skipped (as etcd does).
    ///
    /// # Errors
    /// `<member id> found data inconsistency with peers` on a mismatch (etcd's text).
    pub async fn initial_corruption_check(&self) -> Result<(), String> {
        tracing::info!(
            local_member_id = format!("{:x}", self.id),
            "starting initial corruption check"
        );
        let (hash, compacted, revision) = self.mvcc.hash_kv(0).map_err(|e| e.to_string())?;
        let mut mismatches = 0;
        for member in self.member_list().into_iter().filter(|m| m.id != self.id) {
            let peer_id = format!("{:x}", member.id);
            match self.peer_hash_kv(&member, revision).await {
                Ok(peer) if peer.hash == hash => {}
                Ok(peer) if peer.compact_revision == compacted => {
                    tracing::warn!(
                        remote_peer_id = %peer_id,
                        revision,
                        local_hash = hash,
                        remote_hash = peer.hash,
                        "found different hash values from remote peer"
                    );
                    mismatches += 1;
                }
                Ok(peer) => tracing::warn!(
                    remote_peer_id = %peer_id,
                    local_compact_revision = compacted,
                    remote_compact_revision = peer.compact_revision,
                    "found different compact revision values from remote peer"
                ),
                Err(error) => tracing::warn!(
                    remote_peer_id = %peer_id,
                    error,
                    "cannot fetch hash from remote peer"
                ),
            }
        }
        if mismatches > 0 {
            return Err(format!("{:x} found data inconsistency with peers", self.id));
        }
        tracing::info!("initial corruption checking passed; no corruption");
        Ok(())
    }

    /// etcd's periodic corruption check (`--experimental-corrupt-check-time`): every `every`,
    /// the leader compares its HashKV at its current revision with each member's; a member
    /// with the same compacted revision and another hash gets the CORRUPT alarm, which stops
    /// every read and write until an operator clears it. Members that have not applied the
    /// revision yet, or compacted differently, are skipped this round.
    pub fn spawn_corruption_check(
        self: &std::sync::Arc<Self>,
        every: std::time::Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        if every.is_zero() {
            return;
        }
        let node = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    _ = stop.changed() => return,
                }
                if node.leader() == Some(node.id) {
                    node.check_corruption().await;
                }
            }
        });
    }

    async fn check_corruption(&self) {
        let Ok((hash, compacted, revision)) = self.mvcc.hash_kv(0) else {
            return;
        };
        for member in self.member_list().into_iter().filter(|m| m.id != self.id) {
            let Ok(peer) = self.peer_hash_kv(&member, revision).await else {
                continue;
            };
            if peer.compact_revision != compacted || peer.hash == hash {
                continue;
            }
            tracing::error!(
                member_id = format!("{:x}", member.id),
                revision,
                leader_hash = hash,
                member_hash = peer.hash,
                "found data inconsistency with a member: raising CORRUPT"
            );
            self.raise_corrupt(member.id).await;
        }
    }

    /// etcd 3.5's compaction hash check (`--experimental-compact-hash-check-enabled`): every
    /// `every`, the leader compares its HashKV at the last compaction's revision with each
    /// member's that compacted there too. A mismatch raises CORRUPT for the whole cluster
    /// (member 0: it is not known whose copy is wrong, as etcd says). A compaction is checked
    /// once every member answered for it.
    pub fn spawn_compact_hash_check(
        self: &std::sync::Arc<Self>,
        every: std::time::Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let node = self.clone();
        let every = every.max(std::time::Duration::from_millis(10));
        tokio::spawn(async move {
            let mut checked = 0;
            loop {
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    _ = stop.changed() => return,
                }
                let compacted = node.mvcc.compacted_revision();
                if node.leader() == Some(node.id) && compacted > checked {
                    if let Some(done) = node.check_compaction_hash(compacted).await {
                        checked = done;
                    }
                }
            }
        });
    }

    /// Checks the hashes at compaction revision `at`; the revision once every peer agreed.
    async fn check_compaction_hash(&self, at: i64) -> Option<i64> {
        let (hash, compacted, _) = self.mvcc.hash_kv(at).ok()?;
        let peers: Vec<_> = self
            .member_list()
            .into_iter()
            .filter(|m| m.id != self.id)
            .collect();
        let mut agreed = 0;
        for member in &peers {
            let Ok(peer) = self.peer_hash_kv(member, at).await else {
                continue;
            };
            if peer.compact_revision != compacted {
                continue;
            }
            if peer.hash != hash {
                tracing::error!(
                    revision = at,
                    leader_hash = hash,
                    follower_hash = peer.hash,
                    follower_peer_id = format!("{:x}", member.id),
                    "failed compaction hash check: raising CORRUPT"
                );
                self.raise_corrupt(0).await;
                return None;
            }
            agreed += 1;
        }
        if agreed < peers.len() {
            tracing::warn!(
                revision = at,
                checked = agreed,
                peers = peers.len(),
                "skipped revision in compaction hash check; was not able to check all peers"
            );
            return None;
        }
        tracing::info!(revision = at, "successfully checked hash on whole cluster");
        Some(at)
    }

    /// A member's HashKV at `revision`, over the peer protocol.
    async fn peer_hash_kv(
        &self,
        member: &crate::pb::etcdserverpb::Member,
        revision: i64,
    ) -> Result<crate::pb::etcdserverpb::HashKvResponse, String> {
        let addr = member
            .peer_ur_ls
            .first()
            .map(|u| first_url(u).to_string())
            .ok_or("no peer URL")?;
        let mut client = self.peers.client(&addr).map_err(|e| e.to_string())?;
        let request = crate::pb::etcdserverpb::HashKvRequest { revision };
        match tokio::time::timeout(self.options.request_timeout, client.hash_kv(request)).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(status.message().to_string()),
            Err(_) => Err("timed out".into()),
        }
    }

    /// Proposes the CORRUPT alarm for `member` (0: the cluster).
    async fn raise_corrupt(&self, member: u64) {
        let raise = crate::apply::Command::new(crate::apply::Op::Alarm(
            crate::pb::etcdserverpb::AlarmRequest {
                action: crate::pb::etcdserverpb::alarm_request::AlarmAction::Activate as i32,
                member_id: member,
                alarm: crate::pb::etcdserverpb::AlarmType::Corrupt as i32,
            },
        ));
        if let Err(e) = self.propose(raise).await {
            tracing::warn!(error = %e, "raising CORRUPT failed");
        }
    }
}
