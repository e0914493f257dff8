//! The gRPC codec of vserve's service: prost's encoding, and a decoder that answers a request it cannot
//! parse (bad varints, wrong wire types, truncated or over-nested messages, invalid UTF-8 in a string)
//! with INVALID_ARGUMENT. The stock prost codec says INTERNAL, which this project keeps for its own bugs:
//! a client's garbage set off the alerts meant for those. Named by build.rs (`codec_path`). [`restate`]
//! does the same for the statuses tonic gives a request framed wrongly, before any decoder sees it.

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
        RequestDecoder {
            decoded: false,
            message: PhantomData,
        }
    }
}

/// Decodes a call's request messages: one per call (every vserve method takes one request; tonic reads
/// the body to its end before the handler runs, so a second message reaches here and fails the call
/// with UNIMPLEMENTED, gRPC's code for a request cardinality violation, instead of being dropped
/// unseen).
pub struct RequestDecoder<U> {
    decoded: bool,
    message: PhantomData<U>,
}

impl<U: Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if std::mem::replace(&mut self.decoded, true) {
            return Err(Status::unimplemented(format!(
                "{MALFORMED}: the call carried more than one, and every vserve method takes exactly \
                 one (a request cardinality violation)"
            )));
        }
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("{MALFORMED}: {e}")))
    }
}

/// tonic's status for a request the client framed wrongly, restated (`None` for any other status):
/// - a message over `limit` (tonic: OUT_OF_RANGE "decoded message length too large", which names no
///   limit and reads as a frame past the end) → INVALID_ARGUMENT naming the size, the limit and what
///   `method`'s caller can send less of;
/// - a body that ends inside a message (tonic: INTERNAL "Unexpected EOF decoding stream.") or a
///   message whose flag byte is neither 0 nor 1 → INVALID_ARGUMENT, [`MALFORMED`];
/// - a call with no request message (tonic: INTERNAL "Missing request message.") → UNIMPLEMENTED,
///   gRPC's code for a request cardinality violation.
///
/// INTERNAL is this project's code for its own bugs, so a client's framing must not answer it. The one
/// framing status kept INTERNAL is gRPC's own rule: a message flagged compressed on a call that names
/// no `grpc-encoding` MUST fail INTERNAL (gRPC's compression spec).
pub fn restate(status: &Status, limit: usize, method: &str) -> Option<Status> {
    let msg = status.message();
    match status.code() {
        tonic::Code::OutOfRange if msg.contains("message length too large") => {
            let found = msg
                .split("found ")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .map_or(String::new(), |n| format!(" of {n} bytes"));
            let less = match method {
                "GetClips" => "fewer clips per GetClips".to_owned(),
                "ReleaseSlots" => "fewer slots per ReleaseSlots".to_owned(),
                _ => format!("a smaller {method} request"),
            };
            Some(Status::invalid_argument(format!(
                "request message{found} is over the {limit} bytes ({} MiB) a request may have; send \
                 {less}",
                limit >> 20
            )))
        }
        tonic::Code::Internal if msg.starts_with("Unexpected EOF decoding stream") => {
            Some(Status::invalid_argument(format!(
                "{MALFORMED}: the request body ended inside a message (its gRPC length prefix \
                 announced more bytes than were sent)"
            )))
        }
        tonic::Code::Internal if msg.contains("invalid compression flag") => {
            Some(Status::invalid_argument(format!(
                "{MALFORMED}: a gRPC message's flag byte must be 0 or 1"
            )))
        }
        tonic::Code::Internal if msg.starts_with("Missing request message") => {
            Some(Status::unimplemented(format!(
                "{MALFORMED}: the call carried none, and every vserve method takes exactly one \
                 (a request cardinality violation)"
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonic_framing_statuses_are_restated_and_others_kept() {
        let too_large = Status::out_of_range(
            "Error, decoded message length too large: found 5242880 bytes, the limit is: 4194304 bytes",
        );
        let big = restate(&too_large, 4 << 20, "GetClips").unwrap();
        assert_eq!(big.code(), tonic::Code::InvalidArgument);
        assert!(
            big.message()
                .starts_with("request message of 5242880 bytes is over the 4194304 bytes (4 MiB)"),
            "{}",
            big.message()
        );
        assert!(big.message().ends_with("send fewer clips per GetClips"));
        // Named for the method called (a ReleaseSlots over 4 MiB was told about GetClips: probe D).
        let release = restate(&too_large, 4 << 20, "ReleaseSlots").unwrap();
        assert!(
            release
                .message()
                .ends_with("send fewer slots per ReleaseSlots"),
            "{}",
            release.message()
        );
        let cut = restate(
            &Status::internal("Unexpected EOF decoding stream."),
            1,
            "GetClips",
        )
        .unwrap();
        assert_eq!(cut.code(), tonic::Code::InvalidArgument);
        assert!(cut.message().starts_with(MALFORMED));
        let flag = restate(&Status::internal("protocol error: received message with invalid compression flag: 7 (valid flags are 0 and 1), while sending request"), 1, "GetClips").unwrap();
        assert_eq!(flag.code(), tonic::Code::InvalidArgument);
        let none = restate(&Status::internal("Missing request message."), 1, "GetClips").unwrap();
        assert_eq!(none.code(), tonic::Code::Unimplemented);
        assert!(none.message().contains("cardinality"));
        // gRPC's rule for a compressed flag without grpc-encoding, and every other status: unchanged.
        for kept in [
            Status::internal("protocol error: received message with compressed-flag but no grpc-encoding was specified"),
            Status::internal("a bug"),
            Status::out_of_range("frame 300 is past the end"),
        ] {
            assert!(restate(&kept, 1, "GetClips").is_none(), "{kept:?}");
        }
    }
}
