//! Writes: every mutation becomes a [`Command`] in the Raft log. The leader proposes it (many
//! concurrent proposals share one log fsync); a follower forwards it to the leader's `Forward`
//! RPC. Acknowledged only after a quorum has the entry on disk and the leader applied it.

use openraft::error::{ClientWriteError, RaftError};
use prost::Message;

use super::RaftNode;
use crate::apply::{Command, CommandResult, Outcome};
use crate::error::{Error, Result};

/// Where a proposal must go.
pub(super) enum Route {
    Local,
    Forward(String),
}

impl RaftNode {
    /// Replicates and applies `cmd`, returning its outcome (a domain error if apply rejected it).
    ///
    /// # Errors
    /// [`Error::RequestTooLarge`], [`Error::NoLeader`], [`Error::Timeout`], [`Error::Stopped`], or
    /// the error apply returned.
    pub async fn propose(&self, cmd: Command) -> Result<Outcome> {
        if cmd.encoded_len() > self.options.max_request_bytes {
            return Err(Error::RequestTooLarge);
        }
        let result = tokio::time::timeout(self.options.request_timeout, self.route(cmd))
            .await
            .map_err(|_| Error::Timeout)??;
        match result.result {
            Some(Outcome::Error(code)) => Err(Error::from_code(code)),
            Some(o) => Ok(o),
            None => Err(Error::Storage),
        }
    }

    async fn route(&self, cmd: Command) -> Result<CommandResult> {
        match self.propose_local(cmd.clone()).await? {
            Ok(r) => Ok(r),
            Err(Route::Forward(addr)) => self.forward(&addr, cmd).await,
            Err(Route::Local) => Err(Error::LeaderChanged),
        }
    }

    /// Proposes on this member if it leads; otherwise says where the leader is.
    pub(super) async fn propose_local(
        &self,
        cmd: Command,
    ) -> Result<std::result::Result<CommandResult, Route>> {
        match self.raft.client_write(cmd).await {
            Ok(resp) => Ok(Ok(resp.data)),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                match f.leader_id.and_then(|l| self.leader_addr(l)) {
                    Some(addr) if f.leader_id != Some(self.id) => Ok(Err(Route::Forward(addr))),
                    Some(_) => Ok(Err(Route::Local)),
                    None => Err(Error::NoLeader),
                }
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(_))) => {
                Err(Error::LeaderChanged)
            }
            Err(RaftError::Fatal(_)) => Err(Error::Stopped),
        }
    }

    async fn forward(&self, addr: &str, cmd: Command) -> Result<CommandResult> {
        let mut client = self.peers.client(addr).map_err(|_| Error::NoLeader)?;
        let reply = client
            .forward(cmd)
            .await
            .map_err(|_| Error::NoLeader)?
            .into_inner();
        if reply.error != 0 {
            return Err(Error::from_code(reply.error));
        }
        reply.result.ok_or(Error::Storage)
    }
}
