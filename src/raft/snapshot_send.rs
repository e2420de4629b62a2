//! Sending a snapshot to a lagging member while it is written: from a [`View`], straight into
//! the pieces sent, with no file (openraft's `Chunked` sender asks for the file's size before
//! its first piece): the transfer takes about as long as the slower of writing and sending,
//! the sender needs no disk for it, and memory holds a few pieces whatever the state's size.
//!
//! Otherwise the pieces follow openraft's chunked protocol and its sender's rules: a piece's
//! offset and a `done` flag on the last; a `SnapshotMismatch` (the receiver lost the transfer)
//! starts again at offset 0; up to [`MAX_RETRIES`] consecutive timeouts, network errors or
//! unreachable answers are retried after a pause; a piece rejected as too large, or a hard
//! timeout, ends the transfer. A failure to read the state or the file ends the
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

use super::snapshot_file::{self, Meta};
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

/// Pieces written ahead of the one being sent: with the writer's two (the one it fills and the
/// one it holds back to learn whether it is the last) and the sender's two (the piece kept for
/// a retry and its copy in flight), a transfer holds at most five pieces in memory (15 MiB of
/// the default size), whatever the state's size.
const PIECES_AHEAD: usize = 1;

/// A piece of a snapshot and whether it is the last, or the writer's failure.
type Piece = io::Result<(Vec<u8>, bool)>;

/// The bytes of a snapshot to send, piece by piece.
pub enum Source {
    /// A snapshot file (one a member received, or made and read whole before).
    Whole {
        /// The file.
        file: Arc<std::fs::File>,
        /// Its length.
        len: u64,
        /// Where the next piece begins.
        offset: u64,
    },
    /// Written from a view into the pieces as they are sent: no file, no disk.
    Streamed(Stream),
}

/// A snapshot written from a [`View`] by a blocking task into pieces handed over as they fill,
/// the task waiting while [`PIECES_AHEAD`] wait to be sent. Rewound, it is written again from
/// the same view: the same bytes.
pub struct Stream {
    meta: Meta,
    view: Arc<View>,
    /// The writing task's pieces, once started (at the first piece asked for, of that size).
    pieces: Option<tokio::sync::mpsc::Receiver<Piece>>,
    /// Set to stop the writing task: when the stream is rewound or dropped.
    stop: Arc<AtomicBool>,
}

impl Drop for Stream {
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
        Ok(Source::Whole {
            file: Arc::new(file),
            len,
            offset: 0,
        })
    }

    /// The snapshot of `view` described by `meta`, written as it is sent.
    pub fn streamed(meta: Meta, view: View) -> Self {
        Source::Streamed(Stream {
            meta,
            view: Arc::new(view),
            pieces: None,
            stop: Arc::default(),
        })
    }

    /// The next piece, of `max` bytes (fewer for the last), and whether it is the last.
    async fn next_piece(&mut self, max: u64) -> io::Result<(Vec<u8>, bool)> {
        match self {
            Source::Whole { file, len, offset } => {
                let n = len.saturating_sub(*offset).min(max);
                let data = read_at(file.clone(), *offset, n).await?;
                *offset += n;
                Ok((data, *offset == *len))
            }
            Source::Streamed(stream) => stream.next_piece(max).await,
        }
    }

    /// Starts again from the first piece.
    fn rewind(&mut self) {
        match self {
            Source::Whole { offset, .. } => *offset = 0,
            Source::Streamed(stream) => stream.rewind(),
        }
    }
}

impl Stream {
    async fn next_piece(&mut self, max: u64) -> io::Result<(Vec<u8>, bool)> {
        let pieces = match &mut self.pieces {
            Some(pieces) => pieces,
            None => self.pieces.insert(self.start(max)?),
        };
        pieces
            .recv()
            .await
            .unwrap_or_else(|| Err(io::Error::other("the snapshot writer ended without a word")))
    }

    /// Starts the writing task, in pieces of `max` bytes.
    fn start(&self, max: u64) -> io::Result<tokio::sync::mpsc::Receiver<Piece>> {
        let piece = usize::try_from(max.max(1)).map_err(io::Error::other)?;
        let (tx, rx) = tokio::sync::mpsc::channel(PIECES_AHEAD);
        let (meta, view, stop) = (self.meta.clone(), self.view.clone(), self.stop.clone());
        tracing::info!(snapshot = %self.meta.snapshot_id, piece, "streaming snapshot");
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let mut out = PieceWriter::new(piece, tx.clone());
            let written = snapshot_file::encode(&mut out, &meta, &view, &stop)
                .and_then(|written| out.finish().map(|()| written));
            match written {
                Ok(bytes) => tracing::info!(
                    bytes,
                    took_ms = started.elapsed().as_millis() as u64,
                    snapshot = %meta.snapshot_id,
                    "streamed snapshot"
                ),
                // The sender gone (the transfer ended) or the view unreadable: told, if
                // anyone still listens.
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                }
            }
        });
        Ok(rx)
    }

    fn rewind(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.stop = Arc::default();
        self.pieces = None;
    }
}

/// Cuts what is written into pieces of one size and hands each over once the next begins, so
/// that the last is known as the last.
struct PieceWriter {
    piece: usize,
    filling: Vec<u8>,
    held: Option<Vec<u8>>,
    out: tokio::sync::mpsc::Sender<Piece>,
}

impl PieceWriter {
    fn new(piece: usize, out: tokio::sync::mpsc::Sender<Piece>) -> Self {
        PieceWriter {
            piece,
            filling: Vec::with_capacity(piece.min(BUFFER_CAP)),
            held: None,
            out,
        }
    }

    fn hand_over(&self, data: Vec<u8>, last: bool) -> io::Result<()> {
        self.out
            .blocking_send(Ok((data, last)))
            .map_err(|_| io::Error::other("snapshot no longer wanted"))
    }

    /// Hands over what is left, the last piece marked so.
    fn finish(mut self) -> io::Result<()> {
        let filling = std::mem::take(&mut self.filling);
        match self.held.take() {
            Some(held) if filling.is_empty() => self.hand_over(held, true),
            Some(held) => {
                self.hand_over(held, false)?;
                self.hand_over(filling, true)
            }
            None => self.hand_over(filling, true),
        }
    }
}

/// The most a piece's buffer reserves before it holds anything.
const BUFFER_CAP: usize = 4 << 20;

impl io::Write for PieceWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = (self.piece - self.filling.len()).min(buf.len());
        self.filling.extend_from_slice(&buf[..n]);
        if self.filling.len() == self.piece {
            let full = std::mem::replace(
                &mut self.filling,
                Vec::with_capacity(self.piece.min(BUFFER_CAP)),
            );
            if let Some(held) = self.held.replace(full) {
                self.hand_over(held, false)?;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `len` bytes of `file` at `offset`.
async fn read_at(file: Arc<std::fs::File>, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let len = usize::try_from(len).map_err(io::Error::other)?;
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    })
    .await
    .map_err(io::Error::other)?
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
    // The piece being sent, kept until it is acknowledged: a retry sends it again.
    let mut current: Option<(Vec<u8>, bool)> = None;
    loop {
        let (data, done) = match &current {
            Some(piece) => piece.clone(),
            None => {
                let next = tokio::select! {
                    closed = cancel.as_mut() => return Err(StreamingError::Closed(closed)),
                    next = source.next_piece(piece) => next.map_err(|e| network_error(&e))?,
                };
                current.insert(next).clone()
            }
        };
        let len = data.len() as u64;
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
                current = None;
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
                source.rewind();
                current = None;
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
    use crate::raft::snapshots::SnapshotFiles;
    use crate::storage::{Space, Storage};

    /// Reads `source` piece by piece, as [`send`] does, at most `limit` pieces.
    async fn pieces(source: &mut Source, piece: u64, limit: usize) -> io::Result<(Vec<u8>, usize)> {
        let mut bytes = Vec::new();
        for count in 1..=limit {
            let (data, done) = source.next_piece(piece).await?;
            bytes.extend(data);
            if done {
                return Ok((bytes, count));
            }
        }
        Ok((bytes, limit))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streamed_pieces_are_the_made_snapshot_and_a_rewind_sends_it_again() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(&dir.path().join("data"))?;
        // 20 MiB: seven pieces of 3 MiB, the writer blocked ahead of the reader.
        let value = vec![7u8; 64 << 10];
        for i in 0..320u32 {
            let mut b = storage.batch();
            b.insert(Space::Kv, format!("k{i:04}").as_bytes(), &value);
            b.commit()?;
        }
        let files = SnapshotFiles::new(dir.path());
        let meta = Meta {
            snapshot_id: "t-1".into(),
            ..Default::default()
        };
        let mut expected = Vec::new();
        files
            .make(&meta, &storage.view(), &AtomicBool::new(false))?
            .read_to_end(&mut expected)?;
        let whole = files.make(&meta, &storage.view(), &AtomicBool::new(false))?;

        let mut streamed = Source::streamed(meta.clone(), storage.view());
        // Written after the view: not in what is sent, before or after a rewind.
        let mut b = storage.batch();
        b.insert(Space::Kv, b"later", b"v");
        b.commit()?;
        let (first, count) = pieces(&mut streamed, 3 << 20, 2).await?;
        assert_eq!((first.len(), count), (6 << 20, 2));
        streamed.rewind();
        let (sent, count) = pieces(&mut streamed, 3 << 20, 100).await?;
        assert!(
            sent == expected,
            "{} bytes sent, {} made",
            sent.len(),
            expected.len()
        );
        assert_eq!(count, expected.len().div_ceil(3 << 20));

        // A whole file: its last piece says it is the last, however the sizes fall.
        let half = expected.len() as u64 / 2;
        let mut whole = Source::whole(whole)?;
        let (sent, count) = pieces(&mut whole, half, 100).await?;
        assert!(sent == expected);
        assert_eq!(count as u64, (expected.len() as u64).div_ceil(half));
        let names = crate::raft::snapshots::tests::snapshot_files(dir.path())?;
        assert!(names.is_empty(), "no file: {names:?}");
        Ok(())
    }

    #[test]
    fn the_last_piece_is_marked_and_never_empty_unless_all_is() -> io::Result<()> {
        use std::io::Write;
        for (len, expected) in [
            (10, vec![(5, false), (5, true)]),
            (11, vec![(5, false), (5, false), (1, true)]),
            (4, vec![(4, true)]),
            (0, vec![(0, true)]),
        ] {
            let (tx, mut rx) = tokio::sync::mpsc::channel(8);
            let mut out = PieceWriter::new(5, tx);
            out.write_all(&vec![1u8; len])?;
            out.finish()?;
            let mut got = Vec::new();
            while let Ok(piece) = rx.try_recv() {
                let (data, last) = piece?;
                got.push((data.len(), last));
            }
            assert_eq!(got, expected, "{len} bytes");
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_failed_write_ends_the_pieces_with_its_error() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let (storage, _) = super::super::snapshot_data::tests::one_key_store(dir.path())?;
        let mut source = Source::streamed(Meta::default(), storage.view());
        // Stopped before it wrote a record, as when the transfer ends.
        if let Source::Streamed(stream) = &source {
            stream.stop.store(true, Ordering::Relaxed);
        }
        let err = source
            .next_piece(1 << 20)
            .await
            .err()
            .ok_or_else(|| io::Error::other("no error"))?;
        assert!(err.to_string().contains("no longer wanted"), "{err}");
        Ok(())
    }
}
