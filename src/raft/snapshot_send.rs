//! Sending a snapshot to a lagging member while it is still being written: each piece goes out
//! as soon as the file holds it, so the transfer takes about as long as the slower of writing
//! and sending instead of both in turn (openraft's `Chunked` sender asks for the file's size
//! before its first piece).
//!
//! Otherwise the pieces follow openraft's chunked protocol and its sender's rules: a piece's
//! offset and a `done` flag on the last; a `SnapshotMismatch` (the receiver lost the transfer)
//! starts again at offset 0; up to [`MAX_RETRIES`] consecutive timeouts, network errors or
//! unreachable answers are retried after a pause; a piece rejected as too large, or a hard
//! timeout, ends the transfer. A failure to write or read the file (a full disk) ends the
//! transfer as a network error, never the leader.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed,
    StreamingError,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork};
use openraft::raft::{InstallSnapshotRequest, SnapshotResponse};
use openraft::{OptionalSend, Vote};
use tokio::sync::watch;

use super::snapshot_file::Meta;
use super::snapshots::SnapshotFiles;
use super::TypeConfig;
use crate::storage::View;

/// Consecutive failed pieces before the transfer is given up (openraft's number).
const MAX_RETRIES: u32 = 5;

/// The first pause after a timeout or a network error, doubled per failure up to
/// [`RETRY_MAX`] (openraft's numbers).
const RETRY_BASE: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_millis(200);

/// The pause after an unreachable answer once the network's own backoff has run out.
const UNREACHABLE_PAUSE: Duration = Duration::from_millis(500);

/// Bytes per piece when openraft names no size.
const DEFAULT_PIECE: u64 = 3 << 20;

/// How much of the file is written.
enum Written {
    /// At least this many bytes, and more to come.
    Growing(u64),
    /// All of it: its length.
    Whole(u64),
    /// Writing it failed.
    Failed(String),
}

/// A snapshot file being written (or already whole), to be read piece by piece.
pub struct Source {
    file: Arc<std::fs::File>,
    written: watch::Receiver<Written>,
    /// Set when the source is dropped: a writer still going stops.
    stop: Arc<AtomicBool>,
}

impl Drop for Source {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Source {
    /// A whole snapshot file.
    ///
    /// # Errors
    /// When its length cannot be read.
    pub fn whole(file: std::fs::File) -> io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(Source {
            file: Arc::new(file),
            written: watch::channel(Written::Whole(len)).1,
            stop: Arc::default(),
        })
    }

    /// The snapshot of `view` described by `meta`, written by `files` into a new file by a
    /// blocking task that starts now.
    ///
    /// # Errors
    /// When the file cannot be created.
    pub fn writing(files: Arc<SnapshotFiles>, meta: Meta, view: View) -> io::Result<Self> {
        let file = Arc::new(files.create()?);
        let (tell, written) = watch::channel(Written::Growing(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (out, stopped) = (file.clone(), stop.clone());
        tokio::task::spawn_blocking(move || {
            let mut progress = |n| {
                tell.send_replace(Written::Growing(n));
            };
            let end = files.write(&out, &meta, &view, &stopped, &mut progress);
            tell.send_replace(match end {
                Ok(len) => Written::Whole(len),
                Err(e) => Written::Failed(e.to_string()),
            });
        });
        Ok(Source {
            file,
            written,
            stop,
        })
    }

    /// The length of the piece at `offset` of at most `max` bytes once the file holds all of
    /// it, and whether it is the last.
    async fn next_piece(&mut self, offset: u64, max: u64) -> io::Result<(u64, bool)> {
        loop {
            match &*self.written.borrow_and_update() {
                Written::Whole(len) => {
                    let n = len.saturating_sub(offset).min(max);
                    return Ok((n, offset + n == *len));
                }
                Written::Growing(n) if *n >= offset + max => return Ok((max, false)),
                Written::Growing(_) => {}
                Written::Failed(e) => return Err(io::Error::other(format!("making: {e}"))),
            }
            if self.written.changed().await.is_err() {
                return Err(io::Error::other("the snapshot writer ended without a word"));
            }
        }
    }

    /// `len` bytes at `offset`.
    async fn read(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let file = self.file.clone();
        let len = usize::try_from(len).map_err(io::Error::other)?;
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0; len];
            file.read_exact_at(&mut buf, offset)?;
            Ok(buf)
        })
        .await
        .map_err(io::Error::other)?
    }
}

/// Sends the snapshot `meta` describes, read from `source`, to the member behind `net` in
/// pieces of openraft's chunk size, each as soon as it is written.
///
/// # Errors
/// As openraft's chunked sender: `Closed` on `cancel`, a remote `Fatal`, or a network,
/// timeout or unreachable error once retries are spent.
pub async fn send<N>(
    net: &mut N,
    vote: Vote<u64>,
    meta: Meta,
    mut source: Source,
    cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
    option: RPCOption,
) -> Result<SnapshotResponse<u64>, StreamingError<TypeConfig, Fatal<u64>>>
where
    N: RaftNetwork<TypeConfig> + ?Sized,
{
    let piece = option
        .snapshot_chunk_size()
        .map_or(DEFAULT_PIECE, |n| n.max(1) as u64);
    let mut offset = 0;
    let mut failures = 0;
    let mut unreachable_pauses = None::<Backoff>;
    let mut cancel = std::pin::pin!(cancel);
    loop {
        let (len, done) = tokio::select! {
            closed = cancel.as_mut() => return Err(StreamingError::Closed(closed)),
            next = source.next_piece(offset, piece) => next.map_err(|e| network_error(&e))?,
        };
        let data = source
            .read(offset, len)
            .await
            .map_err(|e| network_error(&e))?;
        tracing::debug!(offset, len, done, "sending snapshot piece");
        let req = InstallSnapshotRequest {
            vote,
            meta: meta.clone(),
            offset,
            data,
            done,
        };
        let sent =
            tokio::time::timeout(option.hard_ttl(), net.install_snapshot(req, option.clone()));
        let err = match sent.await {
            Err(_) => {
                let e = io::Error::other("a snapshot piece timed out");
                return Err(network_error(&e));
            }
            Ok(Ok(resp)) => {
                if resp.vote > vote || done {
                    return Ok(SnapshotResponse::new(resp.vote));
                }
                offset += len;
                failures = 0;
                unreachable_pauses = None;
                continue;
            }
            Ok(Err(err)) => err,
        };
        tracing::warn!(error = %err, offset, "sending a snapshot piece");
        let pause = match err {
            RPCError::PayloadTooLarge(p) => {
                let e = io::Error::other(format!("snapshot piece rejected as too large: {p}"));
                return Err(network_error(&e));
            }
            RPCError::RemoteError(RemoteError {
                target,
                target_node,
                source: RaftError::Fatal(fatal),
            }) => {
                return Err(StreamingError::RemoteError(RemoteError {
                    target,
                    target_node,
                    source: fatal,
                }))
            }
            RPCError::RemoteError(RemoteError {
                source: RaftError::APIError(InstallSnapshotError::SnapshotMismatch(m)),
                ..
            }) => {
                tracing::warn!(mismatch = %m, "the receiver lost the snapshot: from the start");
                offset = 0;
                failures = 0;
                unreachable_pauses = None;
                continue;
            }
            err @ (RPCError::Timeout(_) | RPCError::Network(_) | RPCError::Unreachable(_)) => {
                failures += 1;
                if failures >= MAX_RETRIES {
                    return Err(match err {
                        RPCError::Timeout(e) => StreamingError::Timeout(e),
                        RPCError::Unreachable(e) => StreamingError::Unreachable(e),
                        RPCError::Network(e) => StreamingError::Network(e),
                        other => network_error(&other),
                    });
                }
                if matches!(err, RPCError::Unreachable(_)) {
                    unreachable_pauses
                        .get_or_insert_with(|| net.backoff())
                        .next()
                        .unwrap_or(UNREACHABLE_PAUSE)
                } else {
                    retry_pause(failures)
                }
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// The pause after the `failures`th consecutive timeout or network error.
fn retry_pause(failures: u32) -> Duration {
    RETRY_BASE
        .saturating_mul(1 << failures.saturating_sub(1).min(4))
        .min(RETRY_MAX)
}

fn network_error(e: &(impl std::error::Error + 'static)) -> StreamingError<TypeConfig, Fatal<u64>> {
    StreamingError::Network(NetworkError::new(e))
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::storage::{Space, Storage};

    /// Reads `source` piece by piece, as [`send`] does.
    async fn pieces(mut source: Source, piece: u64) -> io::Result<(Vec<u8>, usize)> {
        let (mut bytes, mut count, mut offset) = (Vec::new(), 0, 0);
        loop {
            let (len, done) = source.next_piece(offset, piece).await?;
            bytes.extend(source.read(offset, len).await?);
            count += 1;
            offset += len;
            if done {
                return Ok((bytes, count));
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pieces_read_while_the_file_is_written_are_the_whole_snapshot() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(&dir.path().join("data"))?;
        // 20 MiB: the writer reports its progress twice (every 8 MiB) before it is done.
        let value = vec![7u8; 64 << 10];
        for i in 0..320u32 {
            let mut b = storage.batch();
            b.insert(Space::Kv, format!("k{i:04}").as_bytes(), &value);
            b.commit()?;
        }
        let files = Arc::new(SnapshotFiles::new(dir.path()));
        let meta = Meta {
            snapshot_id: "t-1".into(),
            ..Default::default()
        };
        let mut expected = Vec::new();
        files
            .make(&meta, &storage.view(), &AtomicBool::new(false))?
            .read_to_end(&mut expected)?;

        let writing = Source::writing(files.clone(), meta.clone(), storage.view())?;
        let (sent, count) = pieces(writing, 3 << 20).await?;
        assert!(
            sent == expected,
            "{} bytes sent, {} made",
            sent.len(),
            expected.len()
        );
        assert_eq!(count, expected.len().div_ceil(3 << 20));

        // A whole file: its last piece says it is the last, however the sizes fall.
        let whole = files.make(&meta, &storage.view(), &AtomicBool::new(false))?;
        let half = expected.len() as u64 / 2;
        let (sent, count) = pieces(Source::whole(whole)?, half).await?;
        assert!(sent == expected);
        assert_eq!(count as u64, (expected.len() as u64).div_ceil(half));
        Ok(())
    }

    #[tokio::test]
    async fn a_failed_write_ends_the_pieces_with_its_error() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let (storage, files) = super::super::snapshot_data::tests::one_key_store(dir.path())?;
        let mut source = Source::writing(files, Meta::default(), storage.view())?;
        // Stopped before it wrote a record, as when the transfer ends.
        source.stop.store(true, Ordering::Relaxed);
        let err = source
            .next_piece(0, 1 << 20)
            .await
            .err()
            .ok_or_else(|| io::Error::other("no error"))?;
        assert!(err.to_string().contains("no longer wanted"), "{err}");
        Ok(())
    }
}
