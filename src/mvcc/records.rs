//! How the store's records are laid out on disk: MVCC records (a tag byte, then the protobuf
//! `KeyValue`), lease records, alarm keys; and the conversions between records, key-values and
//! watch events.

use std::borrow::Cow;

use prost::Message;

use super::{KeyRevision, Revision};
use crate::pb::mvccpb::event::EventType;
use crate::pb::mvccpb::{Event, KeyValue};
use crate::storage::{meta_key, StorageError, StorageResult, Value};

const PUT_TAG: u8 = b'p';
const TOMBSTONE_TAG: u8 = b't';

/// The bit of alarm type `alarm` in [`MvccStore::raised`] (none for a type out of range).
pub(super) fn alarm_bit(alarm: i32) -> Option<u64> {
    u32::try_from(alarm).ok().and_then(|t| 1u64.checked_shl(t))
}

/// The bit set of the alarm types in `alarms`.
pub(super) fn alarm_bits(alarms: &std::collections::BTreeSet<(u64, i32)>) -> u64 {
    alarms
        .iter()
        .filter_map(|(_, a)| alarm_bit(*a))
        .fold(0, |bits, bit| bits | bit)
}

/// The meta key of alarm `alarm` raised by `member`.
pub(super) fn alarm_key(member: u64, alarm: i32) -> Vec<u8> {
    let mut k = meta_key::ALARM.to_vec();
    k.extend(member.to_be_bytes());
    k.extend(alarm.to_be_bytes());
    k
}

pub(super) fn decode_alarm_key(k: &[u8]) -> StorageResult<(u64, i32)> {
    let rest = k.get(meta_key::ALARM.len()..).unwrap_or_default();
    let member = rest.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok());
    let alarm = rest.get(8..12).and_then(|b| <[u8; 4]>::try_from(b).ok());
    match (member, alarm) {
        (Some(m), Some(a)) if rest.len() == 12 => {
            Ok((u64::from_be_bytes(m), i32::from_be_bytes(a)))
        }
        _ => Err(StorageError(format!("corrupt alarm key {k:?}"))),
    }
}

/// A lease record: granted TTL, then the checkpointed remaining TTL (both i64 big-endian).
pub(super) fn encode_lease(ttl: i64, remaining: i64) -> Vec<u8> {
    let mut v = ttl.to_be_bytes().to_vec();
    v.extend(remaining.to_be_bytes());
    v
}

pub(super) fn decode_lease(v: &[u8]) -> Option<(i64, i64)> {
    let ttl = v.get(..8)?.try_into().ok().map(i64::from_be_bytes)?;
    let remaining = v.get(8..16)?.try_into().ok().map(i64::from_be_bytes)?;
    Some((ttl, remaining))
}

/// A change as a watch event: a delete carries only the key and the deleting revision.
pub(super) fn to_event(tombstone: bool, kv: KeyValue) -> Event {
    if tombstone {
        Event {
            r#type: EventType::Delete as i32,
            kv: Some(KeyValue {
                key: kv.key,
                mod_revision: kv.mod_revision,
                ..Default::default()
            }),
            prev_kv: None,
        }
    } else {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(kv),
            prev_kv: None,
        }
    }
}

pub(super) fn encode_record(tombstone: bool, kv: &KeyValue) -> Value {
    tagged(tombstone, kv)
}

/// A put's or a tombstone's tag, then `message`, built in place (records and index entries).
fn tagged(tombstone: bool, message: &impl Message) -> Value {
    Value::build(1 + message.encoded_len(), |out| {
        if let Some((tag, mut body)) = out.split_first_mut() {
            *tag = if tombstone { TOMBSTONE_TAG } else { PUT_TAG };
            message.encode(&mut body).unwrap_or_default();
        }
    })
}

/// Decodes a stored record as `M` (the whole `KeyValue`, or just the fields the index needs);
/// returns whether it is a tombstone. From a `&[u8]` the value is copied; from
/// [`bytes::Bytes`] (a record read with [`crate::storage::Storage::get_shared`]) it is a slice
/// of the record, not a copy.
pub(super) fn decode_as<M: Message + Default>(
    mut bytes: impl bytes::Buf,
) -> StorageResult<(bool, M)> {
    if !bytes.has_remaining() {
        return Err(StorageError("empty mvcc record".into()));
    }
    let tag = bytes.get_u8();
    let msg = M::decode(bytes).map_err(|e| StorageError(format!("corrupt record: {e}")))?;
    Ok((tag == TOMBSTONE_TAG, msg))
}

/// A stored change as etcd keeps it in its `key` bucket: etcd's key for `rev` (see
/// [`Revision::to_etcd_key`]) and the value, a put's encoded `KeyValue` as stored (byte for
/// byte etcd's) or, for a tombstone, a `KeyValue` holding only the key. HashKV hashes these;
/// etcd's database files hold them.
pub(super) fn etcd_entry(rev: Revision, bytes: &[u8]) -> StorageResult<(Vec<u8>, Cow<'_, [u8]>)> {
    let (tag, body) = bytes
        .split_first()
        .ok_or_else(|| StorageError(format!("empty mvcc record {rev:?}")))?;
    if *tag != TOMBSTONE_TAG {
        return Ok((rev.to_etcd_key(false), Cow::Borrowed(body)));
    }
    let kv = KeyValue::decode(body).map_err(|e| StorageError(format!("corrupt record: {e}")))?;
    let value = KeyValue {
        key: kv.key,
        ..Default::default()
    };
    Ok((rev.to_etcd_key(true), Cow::Owned(value.encode_to_vec())))
}

pub(super) fn decode_record(bytes: &[u8]) -> StorageResult<(bool, KeyValue)> {
    decode_as(bytes)
}

/// The fields of a stored `mvccpb.KeyValue` the key index needs: decoding skips the value
/// (field 5) instead of copying it, which is most of a start-up scan.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct IndexFields {
    #[prost(bytes = "vec", tag = "1")]
    pub(super) key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub(super) create_revision: i64,
    #[prost(int64, tag = "4")]
    pub(super) version: i64,
    #[prost(int64, tag = "6")]
    pub(super) lease: i64,
}

/// The `index` keyspace's entry for a record of `key` (see [`IndexFields`]): the record's tag,
/// then the fields, so that [`decode_as`] reads it as it reads the record.
pub(super) fn encode_index_entry(key: &[u8], change: &KeyRevision) -> Value {
    let fields = IndexFields {
        key: key.to_vec(),
        create_revision: change.create_revision,
        version: change.version,
        lease: change.lease,
    };
    tagged(change.is_tombstone(), &fields)
}

pub(super) fn key_value(key: &[u8], change: &KeyRevision, value: bytes::Bytes) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        create_revision: change.create_revision,
        mod_revision: change.rev.main,
        version: change.version,
        value,
        lease: change.lease,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `part` points into `whole`'s buffer.
    fn within(part: &bytes::Bytes, whole: &bytes::Bytes) -> bool {
        let start = whole.as_ptr() as usize;
        (start..start + whole.len()).contains(&(part.as_ptr() as usize))
    }

    /// A record decoded from shared bytes has its value as a slice of them; from a slice, the
    /// same fields with the value copied.
    #[test]
    fn a_shared_record_lends_its_value() -> StorageResult<()> {
        for size in [0, 10, 5000] {
            let kv = KeyValue {
                key: b"k".to_vec(),
                mod_revision: 3,
                value: vec![7; size].into(),
                ..Default::default()
            };
            let stored = bytes::Bytes::copy_from_slice(&encode_record(false, &kv));
            let (tombstone, read) = decode_as::<KeyValue>(stored.clone())?;
            assert!(!tombstone);
            assert_eq!(read, kv, "{size} bytes");
            assert_eq!(within(&read.value, &stored), size > 0, "{size} bytes");
            let (_, copied) = decode_as::<KeyValue>(&stored[..])?;
            assert_eq!(copied, kv, "{size} bytes");
            assert!(!within(&copied.value, &stored) || size == 0, "{size} bytes");
        }
        assert!(decode_as::<KeyValue>(&[][..]).is_err(), "an empty record");
        Ok(())
    }
}
