//! Sorted bulk writes straight into tables ([`Ingest`]): fjall's ingestion, which writes neither
//! the journal nor a memtable, so each value reaches the disk once. A snapshot install writes
//! the state's records and their key-index entries this way.

use super::{Space, Storage, StorageError, StorageResult, Value};

/// Sorted runs in a keyspace's first level above which a new ingestion waits for compaction
/// (each finished ingestion adds one; fjall slows writes at 20 and halts them at 30).
const MAX_L0_RUNS: usize = 12;

/// Writes of ascending keys into tables of one or more keyspaces, visible (and durable) once
/// [`Ingest::finish`] returns; what was not finished is never seen.
pub struct Ingest<'a> {
    storage: &'a Storage,
    open: Vec<Open<'a>>,
}

struct Open<'a> {
    space: Space,
    ingestion: fjall::Ingestion<'a>,
    /// The last key written, which the next must exceed (empty before the first: keys are
    /// never empty).
    last: Vec<u8>,
}

impl<'a> Ingest<'a> {
    /// Nothing written yet.
    pub fn new(storage: &'a Storage) -> Self {
        Ingest {
            storage,
            open: Vec::new(),
        }
    }

    /// Sets `key` to `value` in `space`. Within a space, each key must be greater than the
    /// one before (since the last [`Ingest::finish`]).
    ///
    /// # Errors
    /// A key not above the one before (input out of order, so corrupt), or a write failure.
    pub fn insert(&mut self, space: Space, key: &[u8], value: Value) -> StorageResult<()> {
        if key.is_empty() {
            return Err(StorageError(format!("ingest: an empty key in {space:?}")));
        }
        let open = self.open_for(space)?;
        match key.cmp(open.last.as_slice()) {
            std::cmp::Ordering::Greater => {}
            std::cmp::Ordering::Equal => {
                return Err(StorageError(format!(
                    "ingest: a duplicate key in {space:?}"
                )))
            }
            std::cmp::Ordering::Less => {
                return Err(StorageError(format!(
                    "ingest: keys of {space:?} out of order"
                )))
            }
        }
        open.ingestion.write(key, value.0)?;
        open.last.clear();
        open.last.extend_from_slice(key);
        Ok(())
    }

    /// The ingestion open for `space`, started (once its compactions keep up) if none is.
    fn open_for(&mut self, space: Space) -> StorageResult<&mut Open<'a>> {
        if let Some(i) = self.open.iter().position(|o| o.space == space) {
            return Ok(&mut self.open[i]);
        }
        let keyspace = self.storage.space(space);
        self.storage.wait_for_compactions(keyspace, MAX_L0_RUNS);
        self.open.push(Open {
            space,
            ingestion: keyspace.start_ingestion()?,
            last: Vec::new(),
        });
        let last = self.open.len() - 1;
        Ok(&mut self.open[last])
    }

    /// Makes everything written so far durable and visible: its tables are synced and
    /// registered, one sorted run per keyspace written.
    ///
    /// # Errors
    /// When the tables cannot be written or registered.
    pub fn finish(&mut self) -> StorageResult<()> {
        for open in self.open.drain(..) {
            open.ingestion.finish()?;
        }
        Ok(())
    }
}
