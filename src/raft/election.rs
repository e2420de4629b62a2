//! Elections the way etcd runs them (PreVote and CheckQuorum), on top of openraft 0.9.
//!
//! Why not openraft's own timer: as configured before, a follower campaigned only after
//! openraft's leader lease (`election_timeout_max`, twice the election timeout) *plus* its
//! election timeout (drawn once per process in `[E, 2E)`), so 3–4 s after a leader went silent
//! with etcd's defaults, and voters refused every vote for the lease after their last heartbeat.
//! A candidate rejected for a shorter log then waited another `2 × election_timeout_max` (4 s),
//! which under load (followers' logs differ by the entries in flight) often outlasted the whole
//! fault: a paused or cut-off leader was not replaced before it came back. And a member that
//! could not win still raised its term with every try, so on its return it deposed the healthy
//! leader.
//!
//! So openraft's timer is off (`enable_elect: false`) and its lease is 0 (a vendored one-field
//! patch), and this module decides when a member campaigns:
//! - A voter that has not heard from a leader for a randomized election timeout (`[E, 1.5E)`,
//!   drawn anew for every attempt; etcd: `[E, 2E)`) first asks the voters whether they would vote for it
//!   ([`RaftNode::pre_vote_reply`]): a voter says yes only if its own leader has been silent for
//!   an election timeout and the candidate's log is at least as up to date as its own. With a
//!   majority of yeses it campaigns through openraft; otherwise it waits another timeout and its
//!   term stays where it was. A silent leader is replaced within about two election timeouts,
//!   and a member back from a partition never wins a PreVote against a healthy leader, so it
//!   cannot depose it.
//! - CheckQuorum: a leader that has not heard from a majority of voters within an election
//!   timeout reports no leader ([`RaftNode::leader`] is `None`), so its clients wait for a real
//!   leader (or get `etcdserver: no leader` with `hasleader`) instead of hanging on writes that
//!   cannot commit. It serves again as soon as a majority answers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use openraft::ServerState;

use super::{first_url, RaftNode};
use crate::pb::concordpb::{PreVoteReply, PreVoteRequest};

/// `leader_heard` of a member restarted on its own data before it hears any leader (see
/// [`Elector::mark_restarted`]): it grants PreVotes at once (etcd: a member with no leader is
/// in no lease). Only `mark_restarted` sets it.
const NEVER: u64 = u64::MAX;

/// One member's election clock and CheckQuorum state.
pub struct Elector {
    /// When the member started: the origin of the times below.
    origin: Instant,
    /// Milliseconds after `origin` when this member last heard from a leader it follows.
    leader_heard: AtomicU64,
    /// Milliseconds after `origin` when the election timer last restarted: a leader was heard,
    /// a vote granted, or an attempt started (as in etcd).
    timer: AtomicU64,
    /// Set while this member leads but has not heard from a majority within an election timeout.
    quorum_lost: AtomicBool,
    election: Duration,
    heartbeat: Duration,
}

impl Elector {
    /// A clock that starts now, for a member that waits a whole timeout before its first
    /// campaign, as a fresh cluster needs (openraft's bootstrap campaigns at once) and a joining
    /// member should (its leader is about to call). See [`Elector::mark_restarted`] for a
    /// member restarted on its own data.
    pub fn new(election: Duration, heartbeat: Duration) -> Self {
        Elector {
            origin: Instant::now(),
            leader_heard: AtomicU64::new(0),
            timer: AtomicU64::new(0),
            quorum_lost: AtomicBool::new(false),
            election,
            heartbeat,
        }
    }

    /// Makes this the clock of a member restarted on its own data with etcd's
    /// `initial-election-tick-advance`: it treats itself as having heard no leader, so it grants
    /// PreVotes at once and its first timeout is fast-forwarded; after a full restart a leader is
    /// elected within about a heartbeat. Called once, before the election timer starts.
    pub fn mark_restarted(&self) {
        self.leader_heard.store(NEVER, Ordering::Relaxed);
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    fn since(&self, at: &AtomicU64) -> Duration {
        match at.load(Ordering::Relaxed) {
            NEVER => Duration::MAX,
            t => Duration::from_millis(self.now().saturating_sub(t)),
        }
    }

    /// A leader this member follows was heard: it accepted the leader's append or snapshot, or
    /// the leader itself refused this member's append as its successor (see `network.rs`).
    pub fn heard_leader(&self) {
        let now = self.now();
        let _ = self
            .leader_heard
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                (t == NEVER || t < now).then_some(now)
            });
        self.timer.fetch_max(now, Ordering::Relaxed);
    }

    /// Restarts the election timer (a vote granted, an attempt started).
    pub fn restart_timer(&self) {
        self.timer.fetch_max(self.now(), Ordering::Relaxed);
    }

    /// Time since the election timer last restarted.
    fn timer_elapsed(&self) -> Duration {
        self.since(&self.timer)
    }

    /// Whether this member was restarted on its own data and has heard no leader since: after
    /// a full restart its peers may come up a moment later, so a lost PreVote is retried after
    /// about a heartbeat rather than a whole election timeout (etcd's tick advance waits for
    /// its peers to connect for the same reason).
    fn restarting(&self) -> bool {
        self.leader_heard.load(Ordering::Relaxed) == NEVER
    }

    /// A retry delay in `[H, 2H)` for a restarting member's lost PreVote (the jitter keeps two
    /// restarting members from asking at the same instant over and over).
    fn restart_retry(&self, seed: &mut u64) -> Duration {
        let h = self.heartbeat.as_millis().max(1) as u64;
        Duration::from_millis(h + random(seed) % h)
    }

    /// The timeout after an attempt: a whole randomized election timeout, or a short retry for
    /// a restarting member whose PreVote was lost (see [`Elector::restarting`]).
    fn next_timeout(&self, attempt: Attempt, seed: &mut u64) -> Option<Duration> {
        match attempt {
            Attempt::None => None,
            Attempt::Lost if self.restarting() => Some(self.restart_retry(seed)),
            Attempt::Lost | Attempt::Made => Some(self.random_timeout(seed)),
        }
    }

    /// Time since this member last heard from a leader it follows.
    fn leader_silence(&self) -> Duration {
        self.since(&self.leader_heard)
    }

    /// Whether a follower's leader has been silent for an election timeout: the member then
    /// reports no leader, as an etcd follower does once it turns pre-candidate, and grants
    /// PreVotes. Half a heartbeat of slack: the followers heard the leader's last heartbeat at
    /// slightly different times, and the first candidate must not be refused for that.
    pub fn leader_lost(&self) -> bool {
        self.leader_silence().saturating_add(self.heartbeat / 2) >= self.election
    }

    /// Whether this member, as leader, has lost touch with a majority.
    pub fn quorum_lost(&self) -> bool {
        self.quorum_lost.load(Ordering::Relaxed)
    }

    /// Whether a follower's leader counts as alive for routing: heard within three heartbeats
    /// (or one election timeout, if shorter). Requests wait rather than go to a silent leader.
    pub fn leader_alive(&self) -> bool {
        self.leader_silence() <= (self.heartbeat * 3).min(self.election)
    }

    /// A fresh randomized election timeout in `[E, 1.5E)`. etcd draws from `[E, 2E)`; the
    /// narrower spread replaces a silent leader sooner (the first of the followers' timers
    /// decides), and PreVote keeps split votes rare: two candidates collide only if their timers
    /// fire within one PreVote and vote round trip of each other.
    fn random_timeout(&self, seed: &mut u64) -> Duration {
        let e = self.election.as_millis().max(2) as u64;
        Duration::from_millis(e + random(seed) % (e / 2))
    }
}

/// The next number of an xorshift64* sequence: enough to spread members' timers apart.
fn random(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32
}

/// What one tick of the election timer did.
enum Attempt {
    /// Nothing: leading, not a voter, or the timeout has not passed.
    None,
    /// Campaigned (or, as the only voter, asked openraft to).
    Made,
    /// Asked for PreVotes and did not get a majority.
    Lost,
}

impl RaftNode {
    /// Starts the election timer task (every voter runs one; it does nothing while leading).
    pub(super) fn start_elections(self: &Arc<Self>) {
        let node = Arc::downgrade(self);
        let tick = (self.options.heartbeat / 4).max(Duration::from_millis(5));
        let mut seed = self.id ^ (self.elector.origin.elapsed().as_nanos() as u64) | 1;
        tokio::spawn(async move {
            // A restarted member's first timeout is fast-forwarded, as etcd's
            // `initial-election-tick-advance`: after a full restart a leader is elected within a
            // heartbeat and half an election timeout. A member restarted into a healthy cluster
            // hears its leader first, and PreVote keeps it from disturbing that leader if not.
            let mut timeout = match node.upgrade() {
                Some(n) if n.elector.restarting() => {
                    n.elector.random_timeout(&mut seed) - n.options.election + n.options.heartbeat
                }
                Some(n) => n.elector.random_timeout(&mut seed),
                None => return,
            };
            let mut ticker = tokio::time::interval(tick);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(node) = Weak::upgrade(&node) else {
                    return;
                };
                let attempt = node.election_tick(timeout).await;
                if let Some(next) = node.elector.next_timeout(attempt, &mut seed) {
                    timeout = next;
                }
            }
        });
    }

    /// One tick of the timer: whether it started an attempt (the timeout is then drawn anew)
    /// and whether that attempt lost its PreVote.
    async fn election_tick(&self, timeout: Duration) -> Attempt {
        let (leading, voter, single, state) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            let membership = m.membership_config.membership();
            let voters: Vec<u64> = membership.voter_ids().collect();
            (
                m.state == ServerState::Leader,
                voters.contains(&self.id),
                voters.len() == 1,
                m.state,
            )
        };
        if leading {
            self.elector
                .quorum_lost
                .store(!self.quorum_heard(), Ordering::Relaxed);
            return Attempt::None;
        }
        self.elector.quorum_lost.store(false, Ordering::Relaxed);
        if !voter || state == ServerState::Shutdown {
            return Attempt::None;
        }
        let waited = self.elector.timer_elapsed();
        if single {
            // The only voter needs nobody's consent: it campaigns at once, and again only if a
            // campaign did not end within a timeout.
            if state != ServerState::Follower && waited < timeout {
                return Attempt::None;
            }
            self.elector.restart_timer();
            if let Err(e) = self.raft.trigger().elect().await {
                tracing::warn!(error = %e, "election trigger");
            }
            return Attempt::Made;
        }
        if waited < timeout {
            return Attempt::None;
        }
        self.elector.restart_timer();
        let granted = self.pre_vote().await;
        // A leader heard while asking wins over the campaign.
        if granted && !self.elector.leader_alive() {
            tracing::info!(
                waited_ms = waited.as_millis() as u64,
                "PreVote won: campaigning"
            );
            if let Err(e) = self.raft.trigger().elect().await {
                tracing::warn!(error = %e, "election trigger");
            }
            Attempt::Made
        } else {
            tracing::info!(
                waited_ms = waited.as_millis() as u64,
                "PreVote lost: not campaigning"
            );
            Attempt::Lost
        }
    }

    /// On the leader: whether a majority of every voter configuration (joint ones during a
    /// membership change) answered a Raft message within an election timeout.
    /// Whether this member leads and has heard from a majority within an election timeout,
    /// judged now (not at the elector's last tick, which may not have run yet after a pause).
    pub(super) fn leads_with_quorum(&self) -> bool {
        self.metrics_now().current_leader == Some(self.id) && self.quorum_heard()
    }

    fn quorum_heard(&self) -> bool {
        let m = self.metrics_now();
        let membership = m.membership_config.membership();
        membership.get_joint_config().iter().all(|voters| {
            let heard = voters
                .iter()
                .filter(|id| {
                    **id == self.id || self.links.reached_within(**id, self.options.election)
                })
                .count();
            heard * 2 > voters.len()
        })
    }

    /// This member's last log position: (term, index); after a purge of the whole log, the
    /// purged position (recorded by openraft with the snapshot, which the metrics report).
    fn last_log_position(&self) -> Option<(u64, u64)> {
        match self.log.last_log_id() {
            Ok(Some(l)) => Some((l.leader_id.term, l.index)),
            Ok(None) => {
                let snapshot = self.metrics_now().snapshot;
                Some(snapshot.map_or((0, 0), |l| (l.leader_id.term, l.index)))
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the last log id");
                None
            }
        }
    }

    /// Asks every other voter for a PreVote; true once a majority (this member included) of
    /// every voter configuration says yes. Waits at most half an election timeout.
    async fn pre_vote(&self) -> bool {
        let Some((term, index)) = self.last_log_position() else {
            return false;
        };
        let (configs, nodes) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            let membership = m.membership_config.membership();
            let nodes: Vec<(u64, String)> = membership
                .nodes()
                .map(|(id, n)| (*id, first_url(&n.addr).to_string()))
                .collect();
            (membership.get_joint_config().clone(), nodes)
        };
        let req = PreVoteRequest {
            candidate: self.id,
            last_log_term: term,
            last_log_index: index,
        };
        let mut asks: FuturesUnordered<_> = nodes
            .into_iter()
            .filter(|(id, _)| *id != self.id && configs.iter().any(|c| c.contains(id)))
            .filter_map(|(id, addr)| {
                let mut client = self.peers.client(&addr).ok()?;
                Some(async move {
                    let granted = client
                        .pre_vote(req)
                        .await
                        .is_ok_and(|r| r.into_inner().granted);
                    (id, granted)
                })
            })
            .collect();
        let mut yes = vec![self.id];
        let won = |yes: &[u64]| {
            configs
                .iter()
                .all(|c| c.iter().filter(|id| yes.contains(id)).count() * 2 > c.len())
        };
        let limit = tokio::time::sleep(self.options.election / 2);
        tokio::pin!(limit);
        while !won(&yes) {
            tokio::select! {
                next = asks.next() => match next {
                    Some((id, true)) => yes.push(id),
                    Some((_, false)) => {}
                    None => break,
                },
                _ = &mut limit => break,
            }
        }
        won(&yes)
    }

    /// Answers a PreVote: yes if this member's leader has been silent for an election timeout
    /// (a leader answers for itself: yes only once it lost its quorum) and the candidate's log
    /// is at least as up to date as this member's.
    pub(super) async fn pre_vote_reply(&self, req: &PreVoteRequest) -> PreVoteReply {
        let state = self.metrics_now().state;
        let in_lease = match state {
            ServerState::Leader => !self.elector.quorum_lost() && self.quorum_heard(),
            _ => !self.elector.leader_lost(),
        };
        let granted = !in_lease
            && self
                .last_log_position()
                .is_some_and(|own| (req.last_log_term, req.last_log_index) >= own);
        tracing::debug!(
            candidate = format!("{:x}", req.candidate),
            granted,
            "PreVote"
        );
        PreVoteReply { granted }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restarted(e: Duration, h: Duration) -> Elector {
        let clock = Elector::new(e, h);
        clock.mark_restarted();
        clock
    }

    #[test]
    fn only_a_restarted_member_starts_as_if_its_leader_were_lost() {
        let (e, h) = (Duration::from_millis(1000), Duration::from_millis(100));
        let restarted = restarted(e, h);
        assert!(restarted.leader_lost(), "grants PreVotes at once");
        assert!(!restarted.leader_alive());
        let fresh = Elector::new(e, h);
        assert!(!fresh.leader_lost(), "waits a whole timeout first");
        restarted.heard_leader();
        assert!(!restarted.leader_lost() && restarted.leader_alive());
    }

    #[test]
    fn a_restarted_member_retries_within_two_heartbeats_until_it_hears_a_leader() {
        let (e, h) = (Duration::from_millis(1000), Duration::from_millis(100));
        let restarted = restarted(e, h);
        assert!(restarted.restarting());
        let mut seed = 7;
        for _ in 0..1000 {
            let t = restarted.restart_retry(&mut seed);
            assert!(t >= h && t < 2 * h, "{t:?}");
        }
        let retry = restarted.next_timeout(Attempt::Lost, &mut seed);
        assert!(retry.is_some_and(|t| t < 2 * h), "{retry:?}");
        assert!(restarted
            .next_timeout(Attempt::Made, &mut seed)
            .is_some_and(|t| t >= e));
        assert_eq!(restarted.next_timeout(Attempt::None, &mut seed), None);
        restarted.heard_leader();
        assert!(!restarted.restarting(), "back to whole timeouts");
        assert!(restarted
            .next_timeout(Attempt::Lost, &mut seed)
            .is_some_and(|t| t >= e));
        assert!(!Elector::new(e, h).restarting());
    }

    #[test]
    fn timeouts_stay_within_one_and_a_half_election_timeouts() {
        let e = Elector::new(Duration::from_millis(1000), Duration::from_millis(100));
        let mut seed = 42;
        for _ in 0..1000 {
            let t = e.random_timeout(&mut seed);
            assert!(t >= Duration::from_millis(1000) && t < Duration::from_millis(1500));
        }
    }
}
