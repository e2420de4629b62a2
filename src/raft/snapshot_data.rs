//! [`SnapshotData`], openraft's snapshot bytes: the file a received snapshot is written to, or
//! the snapshot of a [`View`] made when it is first read (a snapshot openraft builds only to
//! learn its metadata, or fetches at start, is never written out; one dropped while it is
//! being written stops being written). Sent to a lagging member, it is written into the pieces
//! sent, never to a file.

use std::future::Future;
use std::io::{self, SeekFrom};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

use super::snapshot_file::Meta;
use super::snapshot_send::Source;
use super::snapshots::SnapshotFiles;
use crate::storage::View;

/// The bytes of one snapshot, read and written as a file.
pub struct SnapshotData {
    state: State,
    /// A seek asked for before the file existed, started once it does.
    pending_seek: Option<SeekFrom>,
}

enum State {
    /// Not read yet: what to make the file from.
    Deferred(Box<Deferred>),
    /// Being written by a blocking task, which stops once the flag is set.
    Making(
        tokio::task::JoinHandle<io::Result<std::fs::File>>,
        Arc<AtomicBool>,
    ),
    /// The file.
    File(tokio::fs::File),
    /// Making it failed (the error's text, for every later call).
    Failed(String),
}

struct Deferred {
    files: Arc<SnapshotFiles>,
    meta: Meta,
    view: View,
}

impl SnapshotData {
    /// The bytes of `file` (a snapshot being received).
    pub fn file(file: tokio::fs::File) -> Self {
        SnapshotData {
            state: State::File(file),
            pending_seek: None,
        }
    }

    /// The snapshot of `view` described by `meta`, written (by `files`) when first read.
    pub fn deferred(files: Arc<SnapshotFiles>, meta: Meta, view: View) -> Self {
        SnapshotData {
            state: State::Deferred(Box::new(Deferred { files, meta, view })),
            pending_seek: None,
        }
    }

    /// The file, flushed (after a receive).
    ///
    /// # Errors
    /// When making it failed, or on a flush failure.
    pub async fn into_file(mut self) -> io::Result<std::fs::File> {
        use tokio::io::AsyncWriteExt;
        std::future::poll_fn(|cx| self.poll_made(cx)).await?;
        match std::mem::replace(&mut self.state, State::Failed(String::new())) {
            State::File(mut f) => {
                f.flush().await?;
                Ok(f.into_std().await)
            }
            _ => Err(io::Error::other("snapshot data without a file")),
        }
    }

    /// The bytes to send to a lagging member: a snapshot not made yet is written while it is
    /// sent (see [`super::snapshot_send`]).
    ///
    /// # Errors
    /// When making it failed or its file cannot be created.
    pub async fn into_source(mut self) -> io::Result<Source> {
        match std::mem::replace(&mut self.state, State::Failed(String::new())) {
            State::Deferred(d) => {
                let Deferred { meta, view, .. } = *d;
                return Ok(Source::streamed(meta, view));
            }
            other => self.state = other,
        }
        std::future::poll_fn(|cx| self.poll_made(cx)).await?;
        match std::mem::replace(&mut self.state, State::Failed(String::new())) {
            State::File(f) => Source::whole(f.into_std().await),
            _ => Err(io::Error::other("snapshot data without a file")),
        }
    }

    /// Ready once the file exists: starts making it on the first call.
    fn poll_made(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match &mut self.state {
                State::Deferred(_) => {
                    let placeholder = State::Failed(String::new());
                    if let State::Deferred(d) = std::mem::replace(&mut self.state, placeholder) {
                        let Deferred { files, meta, view } = *d;
                        let cancel = Arc::new(AtomicBool::new(false));
                        let stop = cancel.clone();
                        let task =
                            tokio::task::spawn_blocking(move || files.make(&meta, &view, &stop));
                        self.state = State::Making(task, cancel);
                    }
                }
                State::Making(task, _) => {
                    let made = ready!(Pin::new(task).poll(cx));
                    self.state = match made {
                        Ok(Ok(file)) => State::File(tokio::fs::File::from_std(file)),
                        Ok(Err(e)) => State::Failed(e.to_string()),
                        Err(e) => State::Failed(e.to_string()),
                    };
                }
                State::File(_) => return Poll::Ready(Ok(())),
                State::Failed(e) => {
                    return Poll::Ready(Err(io::Error::other(format!("making a snapshot: {e}"))))
                }
            }
        }
    }

    /// The file, once made, with any seek asked for before it existed started.
    fn poll_file(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Pin<&mut tokio::fs::File>>> {
        ready!(self.poll_made(cx))?;
        match &mut self.state {
            State::File(f) => {
                if let Some(to) = self.pending_seek.take() {
                    Pin::new(&mut *f).start_seek(to)?;
                }
                Poll::Ready(Ok(Pin::new(f)))
            }
            _ => Poll::Ready(Err(io::Error::other("snapshot data without a file"))),
        }
    }
}

impl Drop for SnapshotData {
    fn drop(&mut self) {
        if let State::Making(_, cancel) = &self.state {
            cancel.store(true, Ordering::Relaxed);
        }
    }
}

impl AsyncRead for SnapshotData {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let file = ready!(self.get_mut().poll_file(cx))?;
        file.poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let file = ready!(self.get_mut().poll_file(cx))?;
        file.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let file = ready!(self.get_mut().poll_file(cx))?;
        file.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let file = ready!(self.get_mut().poll_file(cx))?;
        file.poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        match &mut this.state {
            State::File(f) => Pin::new(f).start_seek(position),
            _ => {
                this.pending_seek = Some(position);
                Ok(())
            }
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let file = ready!(self.get_mut().poll_file(cx))?;
        file.poll_complete(cx)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};

    use super::*;
    use crate::storage::{Space, Storage};

    /// A state holding `k` = `v` in `dir`, and the snapshot files of `dir`.
    pub(in crate::raft) fn one_key_store(
        dir: &std::path::Path,
    ) -> io::Result<(Storage, Arc<SnapshotFiles>)> {
        let storage = Storage::open(&dir.join("data"))?;
        let mut b = storage.batch();
        b.insert(Space::Kv, b"k", b"v");
        b.commit()?;
        Ok((storage, Arc::new(SnapshotFiles::new(dir))))
    }

    #[tokio::test]
    async fn a_deferred_snapshot_is_made_on_first_read_from_its_own_view_and_leaves_no_name(
    ) -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let (storage, files) = one_key_store(dir.path())?;
        let meta = Meta {
            snapshot_id: "t-1".into(),
            ..Default::default()
        };

        drop(SnapshotData::deferred(
            files.clone(),
            meta.clone(),
            storage.view(),
        ));
        let mut data = SnapshotData::deferred(files.clone(), meta.clone(), storage.view());
        // Written after the view: not in the snapshot.
        let mut b = storage.batch();
        b.insert(Space::Kv, b"later", b"v");
        b.commit()?;

        let end = data.seek(SeekFrom::End(0)).await?;
        data.seek(SeekFrom::Start(0)).await?;
        let mut bytes = Vec::new();
        data.read_to_end(&mut bytes).await?;
        assert_eq!(bytes.len() as u64, end);
        let (read, mut reader) = super::super::snapshot_file::Reader::new(&bytes[..])?;
        assert_eq!(read, meta);
        let mut keys = Vec::new();
        while let Some(r) = reader.next_record()? {
            keys.push(r.key);
        }
        assert_eq!(keys, vec![b"k".to_vec()]);
        let left = crate::raft::snapshots::tests::snapshot_files(dir.path())?;
        assert!(left.is_empty(), "made snapshots take no name: {left:?}");
        Ok(())
    }
}
