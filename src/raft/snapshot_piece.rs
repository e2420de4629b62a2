//! A snapshot piece on the wire: bincode of openraft's `InstallSnapshotRequest`, the same bytes
//! as its derived encoding, with its data written and read as one slice. The derived form goes
//! through serde's sequence of `u8`, one call per byte: on a 2 GiB snapshot sent to a newcomer
//! that was 15 % of the two members' CPU samples, in the round trip every piece waits for.

use openraft::raft::InstallSnapshotRequest;
use openraft::{BasicNode, SnapshotMeta, Vote};
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use super::TypeConfig;

/// A piece to send, encoded as its derived form is.
pub struct Outgoing<'a>(pub &'a InstallSnapshotRequest<TypeConfig>);

impl Serialize for Outgoing<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut out = s.serialize_struct("InstallSnapshotRequest", 5)?;
        out.serialize_field("vote", &r.vote)?;
        out.serialize_field("meta", &r.meta)?;
        out.serialize_field("offset", &r.offset)?;
        out.serialize_field("data", &Slice(&r.data))?;
        out.serialize_field("done", &r.done)?;
        out.end()
    }
}

/// Bytes written at once (bincode: their length, then them, as a sequence of `u8` is).
struct Slice<'a>(&'a [u8]);

impl Serialize for Slice<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

/// A received piece, in the field order of openraft's request.
#[derive(Deserialize)]
struct Incoming {
    vote: Vote<u64>,
    meta: SnapshotMeta<u64, BasicNode>,
    offset: u64,
    #[serde(deserialize_with = "crate::apply::command::serde_bytes_vec")]
    data: Vec<u8>,
    done: bool,
}

/// Decodes a piece encoded by [`Outgoing`] or by openraft's derived encoding.
///
/// # Errors
/// When `bytes` are not such a piece.
pub fn decode(bytes: &[u8]) -> bincode::Result<InstallSnapshotRequest<TypeConfig>> {
    let p: Incoming = bincode::deserialize(bytes)?;
    Ok(InstallSnapshotRequest {
        vote: p.vote,
        meta: p.meta,
        offset: p.offset,
        data: p.data,
        done: p.done,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, LogId, StoredMembership};

    fn piece(data: Vec<u8>, done: bool) -> InstallSnapshotRequest<TypeConfig> {
        let log_id = LogId::new(CommittedLeaderId::new(3, 1), 42);
        InstallSnapshotRequest {
            vote: Vote::new_committed(3, 1),
            meta: SnapshotMeta {
                last_log_id: Some(log_id),
                last_membership: StoredMembership::default(),
                snapshot_id: "T3-N1-42".to_string(),
            },
            offset: 3 << 20,
            data,
            done,
        }
    }

    #[test]
    fn a_piece_is_the_bytes_of_its_derived_encoding_both_ways() -> bincode::Result<()> {
        for (data, done) in [
            (vec![], true),
            ((0..=255u8).cycle().take(70_000).collect(), false),
        ] {
            let p = piece(data, done);
            let derived = bincode::serialize(&p)?;
            assert_eq!(bincode::serialize(&Outgoing(&p))?, derived);
            assert_eq!(decode(&derived)?, p);
        }
        Ok(())
    }

    #[test]
    fn a_truncated_piece_is_an_error() -> bincode::Result<()> {
        let bytes = bincode::serialize(&Outgoing(&piece(vec![7; 1000], false)))?;
        for cut in [0, 10, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        Ok(())
    }
}
