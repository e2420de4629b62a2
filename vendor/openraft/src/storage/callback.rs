//! Callbacks used by Storage API

use std::io;

use anyerror::AnyError;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::async_runtime::AsyncOneshotSendExt;
use crate::core::notify::Notify;
use crate::raft_state::io_state::log_io_id::LogIOId;
use crate::type_config::alias::OneshotSenderOf;
use crate::LogId;
use crate::RaftTypeConfig;
use crate::StorageIOError;
use crate::Vote;

/// A oneshot callback for completion of log io operation.
pub struct LogFlushed<C>
where C: RaftTypeConfig
{
    log_io_id: LogIOId<C::NodeId>,
    to: FlushedTo<C>,
}

/// Concord patch: where a flush is reported.
enum FlushedTo<C>
where C: RaftTypeConfig
{
    /// To a caller awaiting the flush.
    Oneshot(OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>),
    /// Straight to RaftCore, as `Notify::LocalLogFlushed` (a leader's own append).
    Core {
        tx: mpsc::UnboundedSender<Notify<C>>,
        vote: Vote<C::NodeId>,
        log_id: LogId<C::NodeId>,
    },
}

impl<C> LogFlushed<C>
where C: RaftTypeConfig
{
    pub(crate) fn new(
        log_io_id: LogIOId<C::NodeId>,
        tx: OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>,
    ) -> Self {
        Self {
            log_io_id,
            to: FlushedTo::Oneshot(tx),
        }
    }

    /// Concord patch: a callback that reports the flush of the leader's own append of entries
    /// up to `log_id` directly to RaftCore.
    pub(crate) fn to_core(tx: mpsc::UnboundedSender<Notify<C>>, vote: Vote<C::NodeId>, log_id: LogId<C::NodeId>) -> Self {
        Self {
            log_io_id: LogIOId::new(vote.clone(), Some(log_id.clone())),
            to: FlushedTo::Core { tx, vote, log_id },
        }
    }

    /// Report log io completion event.
    ///
    /// It will be called when the log is successfully appended to the storage or an error occurs.
    pub fn log_io_completed(self, result: Result<(), io::Error>) {
        if let Err(e) = &result {
            tracing::error!("LogFlush error: {}, while flushing upto {}", e, self.log_io_id);
        }
        let sent = match self.to {
            FlushedTo::Oneshot(tx) => tx.send(result.map(|_| self.log_io_id)).is_ok(),
            FlushedTo::Core { tx, vote, log_id } => {
                let result = result.map(|_| log_id).map_err(|e| StorageIOError::write_logs(AnyError::error(e)).into());
                tx.send(Notify::LocalLogFlushed { vote, result }).is_ok()
            }
        };

        if !sent {
            tracing::error!("failed to send log io completion event");
        }
    }
}

/// A oneshot callback for completion of applying logs to state machine.
pub struct LogApplied<C>
where C: RaftTypeConfig
{
    last_log_id: LogId<C::NodeId>,
    tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
}

impl<C> LogApplied<C>
where C: RaftTypeConfig
{
    #[allow(dead_code)]
    pub(crate) fn new(
        last_log_id: LogId<C::NodeId>,
        tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
    ) -> Self {
        Self { last_log_id, tx }
    }

    /// Report apply io completion event.
    ///
    /// It will be called when the log is successfully applied to the state machine or an error
    /// occurs.
    pub fn completed(self, result: Result<Vec<C::R>, StorageIOError<C::NodeId>>) {
        let res = match result {
            Ok(x) => {
                tracing::debug!("LogApplied upto {}", self.last_log_id);
                let resp = (self.last_log_id.clone(), x);
                self.tx.send(Ok(resp))
            }
            Err(e) => {
                tracing::error!("LogApplied error: {}, while applying upto {}", e, self.last_log_id);
                self.tx.send(Err(e))
            }
        };

        if let Err(_e) = res {
            tracing::error!("failed to send apply complete event, last_log_id: {}", self.last_log_id);
        }
    }
}
