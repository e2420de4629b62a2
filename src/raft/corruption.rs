//! Corruption checks, as etcd's: before serving (`--experimental-initial-corrupt-check`) a
//! member compares its HashKV with its peers' and refuses to start on a mismatch; periodically
//! (`--experimental-corrupt-check-time`) the leader compares every member's and raises the
//! CORRUPT alarm.

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
            let Some(addr) = member.peer_ur_ls.first().map(|u| first_url(u).to_string()) else {
                continue;
            };
            let peer_id = format!("{:x}", member.id);
            let Ok(mut client) = self.peers.client(&addr) else {
                continue;
            };
            let request = crate::pb::etcdserverpb::HashKvRequest { revision };
            let answer =
                tokio::time::timeout(self.options.request_timeout, client.hash_kv(request));
            match answer.await.map(|r| r.map(tonic::Response::into_inner)) {
                Ok(Ok(peer)) if peer.hash == hash => {}
                Ok(Ok(peer)) if peer.compact_revision == compacted => {
                    tracing::warn!(
                        remote_peer_id = %peer_id,
                        revision,
                        local_hash = hash,
                        remote_hash = peer.hash,
                        "found different hash values from remote peer"
                    );
                    mismatches += 1;
                }
                Ok(Ok(peer)) => tracing::warn!(
                    remote_peer_id = %peer_id,
                    local_compact_revision = compacted,
                    remote_compact_revision = peer.compact_revision,
                    "found different compact revision values from remote peer"
                ),
                Ok(Err(status)) => tracing::warn!(
                    remote_peer_id = %peer_id,
                    error = %status.message(),
                    "cannot fetch hash from remote peer"
                ),
                Err(_) => {
                    tracing::warn!(remote_peer_id = %peer_id, "cannot fetch hash from remote peer: timed out")
                }
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
            let Some(addr) = member.peer_ur_ls.first().map(|u| first_url(u).to_string()) else {
                continue;
            };
            let Ok(mut client) = self.peers.client(&addr) else {
                continue;
            };
            let request = crate::pb::etcdserverpb::HashKvRequest { revision };
            let answer =
                tokio::time::timeout(self.options.request_timeout, client.hash_kv(request));
            let Ok(Ok(peer)) = answer.await.map(|r| r.map(tonic::Response::into_inner)) else {
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
            let raise = crate::apply::Command::new(crate::apply::Op::Alarm(
                crate::pb::etcdserverpb::AlarmRequest {
                    action: crate::pb::etcdserverpb::alarm_request::AlarmAction::Activate as i32,
                    member_id: member.id,
                    alarm: crate::pb::etcdserverpb::AlarmType::Corrupt as i32,
                },
            ));
            if let Err(e) = self.propose(raise).await {
                tracing::warn!(error = %e, "raising CORRUPT failed");
            }
        }
    }
}
