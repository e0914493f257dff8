//! The gRPC codec of vserve's service: prost's encoding, and a decoder that answers a request it cannot
//! parse (bad varints, wrong wire types, truncated or over-nested messages, invalid UTF-8 in a string)
//! with INVALID_ARGUMENT. The stock prost codec says INTERNAL, which this project keeps for its own bugs:
//! a client's garbage set off the alerts meant for those. Named by build.rs (`codec_path`).

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::ProstEncoder;

/// How a status for an unparseable request begins (the RPC layer logs such calls by it).
pub const MALFORMED: &str = "malformed request message";

pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> ProstEncoder<T> {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> RequestDecoder<U> {
        RequestDecoder(PhantomData)
    }
}

pub struct RequestDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("{MALFORMED}: {e}")))
    }
}
