//! The gRPC codec of every service: prost's, except that a message's buffer is reserved at its
//! encoded size before it is encoded. tonic's buffer starts at 8 KiB and doubles as prost
//! writes into it, so a 2.5 MB range response (a page of a Kubernetes list) was copied about
//! ten times over while it grew.
#![warn(missing_docs, clippy::all, clippy::pedantic)]

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstCodec;

/// [`ProstCodec`] with encoders that reserve a message's size first.
#[derive(Debug, Clone)]
pub struct SizedCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for SizedCodec<T, U> {
    fn default() -> Self {
        SizedCodec {
            inner: ProstCodec::default(),
        }
    }
}

impl<T, U> Codec for SizedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedEncoder<T>;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        SizedEncoder {
            _message: PhantomData,
        }
    }

    fn decoder(&mut self) -> Self::Decoder {
        self.inner.decoder()
    }
}

/// Encodes `T` into a buffer grown once to the message's size.
#[derive(Debug, Clone)]
pub struct SizedEncoder<T> {
    _message: PhantomData<T>,
}

impl<T: Message> Encoder for SizedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
