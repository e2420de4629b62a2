//! The Raft log entry payload ([`Command`]) and its result ([`CommandResult`]), both protobuf
//! messages of `proto/concord/raft.proto`. Protobuf keeps the log readable by newer binaries;
//! serde (for openraft) carries the same protobuf bytes. A log entry holds a command as its
//! encoding ([`EncodedCommand`]): encoded once when proposed, shared (not copied) by the log's
//! cache, the replication to followers and the apply, and decoded once to be applied.

use prost::Message;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use crate::pb::concordpb::command::Op;
pub use crate::pb::concordpb::command_result::Result as Outcome;
pub use crate::pb::concordpb::{Command, CommandBatch, CommandResult, CommandResults};

/// The log format this binary writes into [`Command::format`].
pub const COMMAND_FORMAT: u32 = 1;

impl Command {
    /// Wraps an operation of the member itself (lease expiry, compaction, alarms): applied
    /// without permission checks.
    pub fn new(op: Op) -> Self {
        Command {
            format: COMMAND_FORMAT,
            op: Some(op),
            caller: None,
        }
    }

    /// Wraps a client's operation; `caller` is who the client authenticated as (`None`: no
    /// credentials, denied while auth is on). Applying checks its permissions.
    pub fn from_client(op: Op, caller: Option<crate::auth::Caller>) -> Self {
        Command {
            format: COMMAND_FORMAT,
            op: Some(op),
            caller: Some(caller.unwrap_or_default()),
        }
    }
}

macro_rules! serde_as_protobuf {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.encode_to_vec())
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let bytes: Vec<u8> = serde_bytes_vec(d)?;
                <$t>::decode(bytes.as_slice()).map_err(D::Error::custom)
            }
        }
    };
}

/// Deserializes bytes as one buffer (bincode reads them at once), or from a sequence of `u8`
/// (what a derived `Vec<u8>` field is written as, and bincode encodes alike).
///
/// # Errors
/// When the input holds no bytes there.
pub fn serde_bytes_vec<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("protobuf bytes")
        }
        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::new();
            while let Some(b) = seq.next_element::<u8>()? {
                out.push(b);
            }
            Ok(out)
        }
    }
    d.deserialize_byte_buf(V)
}

serde_as_protobuf!(Command);
serde_as_protobuf!(CommandResult);

/// A [`Command`]'s protobuf encoding: the payload of a Raft log entry. It serializes to the same
/// bytes as the [`Command`] itself, so logs and peers of either form read each other.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EncodedCommand(bytes::Bytes);

impl EncodedCommand {
    /// Encodes `cmd`.
    pub fn encode(cmd: &Command) -> Self {
        EncodedCommand(cmd.encode_to_vec().into())
    }

    /// The command.
    ///
    /// # Errors
    /// When the bytes are not a [`Command`] (a corrupt entry).
    pub fn decode(&self) -> Result<Command, prost::DecodeError> {
        Command::decode(self.0.as_ref())
    }

    /// The encoding itself: what a log entry's stored bytes end with (serde writes it last,
    /// as the bytes they are).
    pub fn bytes(&self) -> &bytes::Bytes {
        &self.0
    }
}

impl Serialize for EncodedCommand {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for EncodedCommand {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(EncodedCommand(serde_bytes_vec(d)?.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::etcdserverpb::PutRequest;

    #[test]
    fn commands_survive_bincode() -> Result<(), bincode::Error> {
        let cmd = Command::new(Op::Put(PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        }));
        let bytes = bincode::serialize(&cmd)?;
        let back: Command = bincode::deserialize(&bytes)?;
        assert_eq!(back, cmd);
        // Its encoded form is the same bytes, both ways.
        let encoded = EncodedCommand::encode(&cmd);
        assert_eq!(bincode::serialize(&encoded)?, bytes);
        let back: EncodedCommand = bincode::deserialize(&bytes)?;
        assert_eq!(back.decode().ok(), Some(cmd));
        Ok(())
    }
}
