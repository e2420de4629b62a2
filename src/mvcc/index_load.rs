//! Reading the key index's entries at start (and after a snapshot install): from the `index`
//! keyspace, a few dozen bytes per change, when its marker says it is complete; otherwise from
//! the records themselves, values and all, writing the `index` keyspace on the way so that the
//! next start reads only that.
//!
//! The two halves of the revision space are read and decoded on two threads; the index is then
//! built shard by shard (`index_build.rs`), in about its own memory.

use super::records::{decode_as, encode_index_entry, IndexFields};
use super::{Changes, KeyIndex, KeyRevision, Revision};
use crate::storage::{meta_key, Batches, Space, Storage, StorageError, StorageResult, Value};

/// Rebuilds the key index from every stored change at revisions up to `current`.
pub(super) fn load_index(storage: &Storage, current: i64) -> StorageResult<KeyIndex> {
    let complete = storage
        .get(Space::Meta, meta_key::INDEX_COMPLETE)?
        .is_some();
    if !complete {
        clear_index_entries(storage)?;
    }
    let source = if complete { Space::Index } else { Space::Kv };
    let middle = Revision::new(current / 2 + 1, 0).to_bytes();
    let (low, high) = std::thread::scope(|scope| {
        let low = scope.spawn(|| read_changes(storage, source, &[], Some(&middle)));
        let high = read_changes(storage, source, &middle, None);
        (low.join(), high)
    });
    let mut changes = low.map_err(|_| StorageError("key index loader panicked".into()))??;
    changes.append(high?);
    if !complete {
        let mut done = storage.batch();
        done.insert(Space::Meta, meta_key::INDEX_COMPLETE, &[]);
        done.commit()?;
        storage.persist_state()?;
        tracing::info!(changes = changes.len(), "wrote the key index's entries");
    }
    Ok(KeyIndex::build(changes))
}

/// Removes every entry of the `index` keyspace (left by an interrupted rebuild, or by the state
/// a snapshot install replaced).
fn clear_index_entries(storage: &Storage) -> StorageResult<()> {
    let mut out = Batches::new(storage);
    storage.for_each_in(Space::Index, &[], None, |k, _| out.remove(Space::Index, k))?;
    out.flush()
}

/// The key index entries of the changes stored at revisions `from <= rev < to`, read from
/// `source`: the `index` keyspace, or the records (`kv`), whose index entries are then written.
fn read_changes(
    storage: &Storage,
    source: Space,
    from: &[u8],
    to: Option<&[u8]>,
) -> StorageResult<Changes> {
    let mut changes = Changes::default();
    let mut rebuilt = (source == Space::Kv).then(|| Batches::new(storage));
    storage.for_each_in(source, from, to, |k, v| {
        let (key, change) = change_of(k, v)?;
        if let Some(out) = rebuilt.as_mut() {
            out.insert_value(Space::Index, k, encode_index_entry(&key, &change))?;
        }
        changes.push(key.into_boxed_slice(), change);
        Ok(())
    })?;
    if let Some(mut out) = rebuilt {
        out.flush()?;
    }
    Ok(changes)
}

/// The key and the key index's change that a stored change holds: a record of `kv` or an entry
/// of `index` (revision key `k`, value `v`).
fn change_of(k: &[u8], v: &[u8]) -> StorageResult<(Vec<u8>, KeyRevision)> {
    let rev = Revision::from_bytes(k)
        .ok_or_else(|| StorageError(format!("corrupt revision key {k:?}")))?;
    let (tombstone, head) = decode_as::<IndexFields>(v)?;
    let change = if tombstone {
        KeyRevision::tombstone(rev)
    } else {
        KeyRevision {
            rev,
            create_revision: head.create_revision,
            version: head.version,
            lease: head.lease,
        }
    };
    Ok((head.key, change))
}

/// The `index` keyspace's entry for the record `v` of `kv` at revision key `k` (see
/// [`super::disk::index_entry`]).
pub(super) fn index_entry(k: &[u8], v: &[u8]) -> StorageResult<Value> {
    let (key, change) = change_of(k, v)?;
    Ok(encode_index_entry(&key, &change))
}

#[cfg(test)]
mod tests {
    use super::super::records::decode_as;
    use super::*;
    use crate::mvcc::{KeyRange, KvTxn, MvccStore};

    type TestResult = Result<(), Box<dyn std::error::Error>>;
    /// A record's revision key, whether it is a tombstone, and its index fields.
    type Fields = (Vec<u8>, bool, IndexFields);

    /// Puts, overwrites, a lease, deletes and a txn-like batch of several changes.
    fn write_history(store: &MvccStore) -> TestResult {
        for round in 0..3 {
            let mut w = store.write()?;
            for i in 0..50 {
                w.put(format!("k{i:03}").as_bytes(), &[round; 100], 0)?;
                w.end_request();
            }
            w.commit()?;
        }
        let mut w = store.write()?;
        w.delete_range(
            &KeyRange::Between(b"k010".to_vec(), b"k020".to_vec()),
            false,
        )?;
        w.end_request();
        w.put(b"x", b"one", 0)?;
        w.put(b"y", &[9; 10_000], 0)?;
        w.end_request();
        w.commit()?;
        Ok(())
    }

    /// A data dir (kept while held), its storage, and the live keys [`write_history`] left.
    type Written = (tempfile::TempDir, Storage, Vec<(Vec<u8>, KeyRevision)>);

    /// A data dir with [`write_history`] written and closed, and every live key it then held.
    fn written() -> Result<Written, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(dir.path())?;
        let store = MvccStore::open(storage.clone())?;
        write_history(&store)?;
        let before = everything(&store)?;
        drop(store);
        Ok((dir, storage, before))
    }

    /// Every live key of the store with its index entry, at the current revision.
    fn everything(store: &MvccStore) -> crate::error::Result<Vec<(Vec<u8>, KeyRevision)>> {
        let r = store.read()?;
        let at = r.read_revision();
        Ok(r.index_range(&KeyRange::From(Vec::new()), at))
    }

    /// Each record's index fields, decoded from `space`, by revision.
    fn fields(storage: &Storage, space: Space) -> StorageResult<Vec<Fields>> {
        storage
            .scan(space)?
            .into_iter()
            .map(|(k, v)| decode_as::<IndexFields>(&v[..]).map(|(t, f)| (k, t, f)))
            .collect()
    }

    #[test]
    fn every_record_has_an_index_entry_with_its_fields() -> TestResult {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(dir.path())?;
        write_history(&MvccStore::open(storage.clone())?)?;
        let records = fields(&storage, Space::Kv)?;
        assert_eq!(records.len(), 50 * 3 + 10 + 2);
        assert_eq!(fields(&storage, Space::Index)?, records);
        assert!(storage
            .get(Space::Meta, meta_key::INDEX_COMPLETE)?
            .is_some());
        Ok(())
    }

    #[test]
    fn a_start_reads_the_index_entries_not_the_records() -> TestResult {
        let (_dir, storage, before) = written()?;
        // Records emptied of their values and fields: only the index entries can say what
        // the keys are.
        let mut b = storage.batch();
        for (k, _) in storage.scan(Space::Kv)? {
            b.insert(Space::Kv, &k, b"p");
        }
        b.commit()?;
        let store = MvccStore::open(storage.clone())?;
        assert_eq!(everything(&store)?, before);
        Ok(())
    }

    #[test]
    fn without_the_marker_a_start_rebuilds_the_entries_from_the_records() -> TestResult {
        let (_dir, storage, before) = written()?;
        let records = fields(&storage, Space::Kv)?;
        // A data dir of format 2 (no entries), or one whose rebuild a crash cut short: some
        // entries missing, and one of a record long gone.
        let mut b = storage.batch();
        b.remove(Space::Meta, meta_key::INDEX_COMPLETE);
        for (k, _) in storage.scan(Space::Index)?.into_iter().step_by(2) {
            b.remove(Space::Index, &k);
        }
        let gone = Revision::new(1_000_000, 0).to_bytes();
        b.insert(Space::Index, &gone, &storage.scan(Space::Index)?[0].1);
        b.commit()?;

        let store = MvccStore::open(storage.clone())?;
        assert_eq!(everything(&store)?, before);
        assert_eq!(fields(&storage, Space::Index)?, records);
        assert!(storage
            .get(Space::Meta, meta_key::INDEX_COMPLETE)?
            .is_some());
        drop(store);
        // And the next start reads them.
        assert_eq!(everything(&MvccStore::open(storage.clone())?)?, before);
        Ok(())
    }
}
