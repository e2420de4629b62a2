//! Cluster membership as etcd's Cluster service shows and changes it.
//!
//! The voters, learners and peer URLs are openraft's membership (a node's `addr` holds its
//! comma-separated peer URLs); names and client URLs are what each member publishes through the
//! log when it starts. Changes (add, remove, update, promote) are made by the leader, one at a
//! time, with openraft's joint consensus; a follower forwards them. A member that sees itself
//! removed, or that peers refuse as removed, stops.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use prost::Message;

use super::route::Leader;
use super::RaftNode;
use crate::apply::{Command, Op};
use crate::error::{Error, Result};
use crate::pb::concordpb::member_change::Change;
use crate::pb::concordpb::{MemberAttributes, MemberChange, MembersRequest};
use crate::pb::etcdserverpb::Member;
use crate::storage::{meta_key, Space};

/// The text peers answer a removed member with, and etcd's log line when it stops.
pub const REMOVED_MESSAGE: &str = "the member has been permanently removed from the cluster";

/// etcd's rule for promoting a learner: its log matches at least this share of the leader's.
const PROMOTE_READY_SHARE: f64 = 0.9;

/// A peer that answered within this long counts as active (etcd's `HealthInterval`).
const HEALTH_INTERVAL: Duration = Duration::from_secs(5);

/// The most learners etcd 3.5 allows at once.
const MAX_LEARNERS: usize = 1;

/// The first of a node's comma-separated peer URLs: the one members dial.
pub fn first_url(addr: &str) -> &str {
    addr.split(',').next().unwrap_or(addr)
}

/// The voters among `members`.
fn voters(members: &[Member]) -> Vec<Member> {
    members.iter().filter(|m| !m.is_learner).cloned().collect()
}

/// Member `id` of `members`.
fn find(members: &[Member], id: u64) -> Result<Member> {
    members
        .iter()
        .find(|m| m.id == id)
        .cloned()
        .ok_or(Error::MemberNotFound)
}

/// Refuses peer URLs that another member (not `except`) already has.
fn check_urls_free(members: &[Member], urls: &[String], except: u64) -> Result<()> {
    let taken = members
        .iter()
        .filter(|m| m.id != except)
        .any(|m| m.peer_ur_ls.iter().any(|u| urls.contains(u)));
    if taken {
        return Err(Error::PeerUrlExists);
    }
    Ok(())
}

/// Checks peer URLs the way etcd does (`scheme://host:port`, http or https).
///
/// # Errors
/// [`Error::MemberBadUrls`].
fn validate_urls(urls: &[String]) -> Result<Vec<String>> {
    if urls.is_empty() {
        return Err(Error::MemberBadUrls);
    }
    for u in urls {
        if let Some(name) = crate::config::unix_socket(u) {
            if name.is_empty() {
                return Err(Error::MemberBadUrls);
            }
            continue;
        }
        let rest = u
            .strip_prefix("http://")
            .or_else(|| u.strip_prefix("https://"))
            .ok_or(Error::MemberBadUrls)?;
        let (host, port) = rest.rsplit_once(':').ok_or(Error::MemberBadUrls)?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(Error::MemberBadUrls);
        }
    }
    let mut sorted = urls.to_vec();
    sorted.sort();
    sorted.dedup();
    Ok(sorted)
}

fn change_error(e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> Error {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => Error::LeaderChanged,
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(_),
        )) => Error::Unhealthy,
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::LearnerNotFound(_),
        )) => Error::MemberNotFound,
        RaftError::APIError(ClientWriteError::ChangeMembershipError(_)) => Error::Unhealthy,
        RaftError::Fatal(_) => Error::Stopped,
    }
}

impl RaftNode {
    /// Every member as etcd lists it: ID, published name and client URLs, peer URLs, learner.
    pub fn member_list(&self) -> Vec<Member> {
        let membership = self.metrics_now().membership_config.clone();
        let m = membership.membership();
        let voters: BTreeSet<u64> = m.voter_ids().collect();
        let attrs = self.member_attributes();
        m.nodes()
            .map(|(id, node)| {
                let a = attrs.get(id);
                Member {
                    id: *id,
                    name: a.map(|a| a.name.clone()).unwrap_or_default(),
                    peer_ur_ls: node.addr.split(',').map(str::to_string).collect(),
                    client_ur_ls: a.map(|a| a.client_urls.clone()).unwrap_or_default(),
                    is_learner: !voters.contains(id),
                }
            })
            .collect()
    }

    /// Whether this member is a learner (replicates, does not vote).
    pub fn is_learner(&self) -> bool {
        let membership = self.metrics_now().membership_config.clone();
        let m = membership.membership();
        m.get_node(&self.id).is_some() && !m.voter_ids().any(|v| v == self.id)
    }

    /// Names and client URLs the members published, by member ID.
    fn member_attributes(&self) -> BTreeMap<u64, MemberAttributes> {
        let entries = self
            .storage
            .scan_prefix(Space::Meta, meta_key::MEMBER_ATTRS)
            .unwrap_or_default();
        entries
            .iter()
            .filter_map(|(_, v)| MemberAttributes::decode(v.as_slice()).ok())
            .map(|a| (a.id, a))
            .collect()
    }

    /// Whether `id` was removed from the cluster (it may never come back).
    pub fn was_removed(&self, id: u64) -> bool {
        let mut key = meta_key::REMOVED.to_vec();
        key.extend(id.to_be_bytes());
        matches!(self.storage.get(Space::Meta, &key), Ok(Some(_)))
    }

    /// Becomes true when this member learns it was removed; the server then stops.
    pub fn removed(&self) -> tokio::sync::watch::Receiver<bool> {
        self.links.removed.subscribe()
    }

    /// Publishes this member's name and client URLs through the log, once it is a member and
    /// until the log holds them (etcd's `publish`). Runs in the background.
    pub fn publish_attributes(self: &std::sync::Arc<Self>, name: String, client_urls: Vec<String>) {
        let node = self.clone();
        tokio::spawn(async move {
            let wanted = MemberAttributes {
                id: node.id,
                name,
                client_urls,
            };
            loop {
                if *node.links.removed.borrow() {
                    return;
                }
                let present = node.member_list().iter().any(|m| m.id == node.id);
                if present && node.member_attributes().get(&node.id) == Some(&wanted) {
                    return;
                }
                if present {
                    let cmd = Command::new(Op::MemberAttributes(wanted.clone()));
                    match node.propose(cmd).await {
                        Ok(_) => {
                            tracing::info!(
                                member_id = format!("{:x}", node.id),
                                "published member attributes"
                            );
                            return;
                        }
                        Err(e) => tracing::debug!(error = %e, "publishing member attributes"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }

    /// Makes a membership change (on the leader, forwarding it there from a follower) and
    /// returns the member it concerns and the members after it.
    ///
    /// # Errors
    /// etcd's membership errors, [`Error::NoLeader`], [`Error::Timeout`].
    pub async fn change_members(&self, change: MemberChange) -> Result<(Member, Vec<Member>)> {
        let deadline = tokio::time::Instant::now() + self.options.request_timeout * 2;
        let routed = async {
            loop {
                match self.live_leader(deadline).await? {
                    Leader::Local => return self.change_members_local(change).await,
                    Leader::Remote(l) => {
                        let reply = match self.leader_client(l) {
                            Ok(mut client) => {
                                self.on_leader(l, client.change_members(change.clone()))
                                    .await
                            }
                            Err(e) => Err(e),
                        };
                        match reply {
                            Err(Error::NoLeader) => {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Err(e) => return Err(e),
                            Ok(reply) if reply.error != 0 => {
                                return Err(Error::from_code(reply.error))
                            }
                            Ok(reply) => {
                                return Ok((reply.member.unwrap_or_default(), reply.members))
                            }
                        }
                    }
                }
            }
        };
        tokio::time::timeout_at(deadline, routed)
            .await
            .map_err(|_| Error::Timeout)?
    }

    /// Makes a membership change on this member, which must lead.
    pub(super) async fn change_members_local(
        &self,
        change: MemberChange,
    ) -> Result<(Member, Vec<Member>)> {
        if self.leader() != Some(self.id) {
            return Err(Error::LeaderChanged);
        }
        let _one_at_a_time = self.membership_lock.lock().await;
        // One read of the membership for all the checks of this change.
        let now = self.member_list();
        let id = match change.change {
            Some(Change::Add(req)) => {
                self.add_member(&now, req.peer_ur_ls, req.is_learner)
                    .await?
            }
            Some(Change::Remove(req)) => self.remove_member(&now, req.id).await?,
            Some(Change::Update(req)) => self.update_member(&now, req.id, req.peer_ur_ls).await?,
            Some(Change::Promote(req)) => self.promote_member(&now, req.id).await?,
            None => return Err(Error::Storage),
        };
        let members = self.member_list();
        let member = members
            .iter()
            .find(|m| m.id == id)
            .cloned()
            .unwrap_or(Member {
                id,
                ..Default::default()
            });
        Ok((member, members))
    }

    /// etcd's strict reconfiguration check (`--strict-reconfig-check`, on by default): a change
    /// may not leave the voters (`voters` after the change) with fewer started members than a
    /// quorum.
    fn check_started(&self, voters_after: &[Member]) -> Result<()> {
        if !self.options.strict_reconfig_check {
            return Ok(());
        }
        // Started: published its name (this member, making the change, surely is).
        let started = voters_after
            .iter()
            .filter(|m| !m.name.is_empty() || m.id == self.id)
            .count();
        let total = voters_after.len();
        // Growing a single member to two is allowed (etcd: restoring a cluster's data).
        if started == 1 && total == 2 {
            return Ok(());
        }
        if started < total / 2 + 1 {
            return Err(Error::MemberNotEnoughStarted);
        }
        Ok(())
    }

    /// Whether this member or peer `id` is active (answered within etcd's health interval).
    fn is_active(&self, id: u64) -> bool {
        id == self.id || self.links.reached_within(id, HEALTH_INTERVAL)
    }

    /// etcd refuses to reconfigure while any voter is out of touch (`unhealthy cluster`).
    fn check_all_voters_active(&self, members: &[Member]) -> Result<()> {
        if !self.options.strict_reconfig_check {
            return Ok(());
        }
        if !voters(members).iter().all(|m| self.is_active(m.id)) {
            return Err(Error::Unhealthy);
        }
        Ok(())
    }

    /// A fresh member ID: a hash of the peer URLs, the cluster and the time, as etcd makes it,
    /// never one in use or ever removed.
    fn new_member_id(&self, members: &[Member], urls: &[String]) -> u64 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mut seed = format!("{}{}{nanos}", urls.concat(), self.cluster_id);
        loop {
            let id = crate::config::member_id(&[seed.clone()], "");
            if id != 0 && !self.was_removed(id) && find(members, id).is_err() {
                return id;
            }
            seed.push('+');
        }
    }

    async fn add_member(
        &self,
        members: &[Member],
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<u64> {
        let urls = validate_urls(&peer_urls)?;
        check_urls_free(members, &urls, 0)?;
        let learners = members.iter().filter(|m| m.is_learner).count();
        if is_learner && learners >= MAX_LEARNERS {
            return Err(Error::TooManyLearners);
        }
        if !is_learner {
            let mut after = voters(members);
            after.push(Member::default());
            self.check_started(&after)?;
        }
        self.check_all_voters_active(members)?;
        let id = self.new_member_id(members, &urls);
        // First as a learner: that entry commits with the current voters alone.
        self.raft
            .add_learner(id, BasicNode::new(urls.join(",")), false)
            .await
            .map_err(change_error)?;
        tracing::info!(
            member_id = format!("{id:x}"),
            ?urls,
            is_learner,
            "added member"
        );
        if is_learner {
            return Ok(id);
        }
        // Then a voter. When the new member is needed for a quorum of the new configuration
        // (one voter growing to two) this cannot commit until it starts, exactly as in etcd; the
        // answer comes as soon as the configuration naming it a voter is in the log.
        let raft = self.raft.clone();
        let change = tokio::spawn(async move {
            raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true)
                .await
        });
        let settle = tokio::time::timeout(self.options.election * 2, change).await;
        match settle {
            Ok(Ok(Ok(_))) => Ok(id),
            Ok(Ok(Err(e))) => Err(change_error(e)),
            Ok(Err(_)) => Err(Error::Stopped),
            Err(_) if find(&self.member_list(), id).is_ok_and(|m| !m.is_learner) => Ok(id),
            Err(_) => Err(Error::Timeout),
        }
    }

    async fn remove_member(&self, members: &[Member], id: u64) -> Result<u64> {
        let member = find(members, id)?;
        if !member.is_learner {
            let after: Vec<Member> = voters(members).into_iter().filter(|m| m.id != id).collect();
            self.check_started(&after)?;
            // Removing a member that is down is safe; otherwise the rest must be a quorum.
            if self.options.strict_reconfig_check && self.is_active(id) {
                let active = after.iter().filter(|m| self.is_active(m.id)).count();
                if active < after.len() / 2 + 1 {
                    return Err(Error::Unhealthy);
                }
            }
        }
        let change = if member.is_learner {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(change_error)?;
        tracing::info!(member_id = format!("{id:x}"), "removed member");
        Ok(id)
    }

    async fn update_member(
        &self,
        members: &[Member],
        id: u64,
        peer_urls: Vec<String>,
    ) -> Result<u64> {
        let urls = validate_urls(&peer_urls)?;
        find(members, id)?;
        check_urls_free(members, &urls, id)?;
        let nodes = BTreeMap::from([(id, BasicNode::new(urls.join(",")))]);
        self.raft
            .change_membership(ChangeMembers::SetNodes(nodes), true)
            .await
            .map_err(change_error)?;
        tracing::info!(member_id = format!("{id:x}"), ?urls, "updated member");
        Ok(id)
    }

    async fn promote_member(&self, members: &[Member], id: u64) -> Result<u64> {
        let learner = find(members, id)?;
        if !learner.is_learner {
            return Err(Error::MemberNotLearner);
        }
        let mut after = voters(members);
        after.push(learner);
        self.check_started(&after)?;
        let metrics = self.metrics_now().clone();
        let leader_match = metrics.last_log_index.unwrap_or(0);
        let learner_match = metrics
            .replication
            .as_ref()
            .and_then(|r| r.get(&id).cloned().flatten())
            .map_or(0, |l| l.index);
        if (learner_match as f64) < (leader_match as f64) * PROMOTE_READY_SHARE {
            return Err(Error::LearnerNotReady);
        }
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true)
            .await
            .map_err(change_error)?;
        tracing::info!(member_id = format!("{id:x}"), "promoted learner");
        Ok(id)
    }
}

/// For a member started with `--initial-cluster-state new` and an empty data dir, as etcd
/// checks: whether a peer that answers within `patience` lists member `id` as having run (its
/// client URLs published). Bootstrapping it again would start it with an empty log and no
/// memory of its votes, which Raft's safety does not survive. No answer: false.
pub async fn bootstrapped_elsewhere(
    peer_urls: &[String],
    id: u64,
    patience: Duration,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> bool {
    let asks = peer_urls.iter().map(|url| {
        let tls = tls.clone();
        async move {
            let reply = peer_members(url, tls).await.ok()?;
            Some(
                reply
                    .members
                    .iter()
                    .any(|m| m.id == id && !m.client_ur_ls.is_empty()),
            )
        }
    });
    let mut answers: futures::stream::FuturesUnordered<_> = asks.collect();
    let any_ran = async {
        while let Some(answer) = futures::StreamExt::next(&mut answers).await {
            if answer == Some(true) {
                return true;
            }
        }
        false
    };
    tokio::time::timeout(patience, any_ran)
        .await
        .unwrap_or(false)
}

/// The membership as the peer at `url` knows it (its `members` RPC).
async fn peer_members(
    url: &str,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> std::result::Result<crate::pb::concordpb::MembersReply, String> {
    let ch = super::network::peer_channel(url, super::network::UNACKED, tls)
        .map_err(|e| e.to_string())?;
    super::network::peer_client(ch)
        .members(MembersRequest {})
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| s.message().to_string())
}

/// For a member started with `--initial-cluster-state existing` and an empty data dir: asks the
/// other members, at `peer_urls`, for the membership and finds the member whose peer URLs are
/// `own_urls` (added beforehand with `member add`). Returns (member ID, cluster ID).
///
/// # Errors
/// When no peer answers, or none lists this member.
pub async fn discover_identity(
    peer_urls: &[String],
    own_urls: &[String],
    patience: Duration,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> std::result::Result<(u64, u64), String> {
    let own: BTreeSet<&String> = own_urls.iter().collect();
    let deadline = tokio::time::Instant::now() + patience;
    let mut last_error = String::from("no peer URLs to ask");
    loop {
        for url in peer_urls {
            match peer_members(url, tls.clone()).await {
                Ok(r) => {
                    let found = r
                        .members
                        .iter()
                        .find(|m| m.peer_ur_ls.iter().collect::<BTreeSet<_>>() == own);
                    // A peer that has not applied the `member add` yet: ask again.
                    match found {
                        Some(m) => return Ok((m.id, r.cluster_id)),
                        None => {
                            last_error = format!(
                                "no member with peer URLs {own_urls:?} in the cluster at {url}: add it first with `etcdctl member add`"
                            );
                        }
                    }
                }
                Err(e) => last_error = format!("{url}: {e}"),
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("cannot fetch the cluster's members: {last_error}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
