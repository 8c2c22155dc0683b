//! konnectivity's `ProxyService` as generated from its proto (`build.rs`), and the codec it uses: prost's, with small first buffers (an idle `Proxy` stream holds them).

#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms, unreachable_pub)]
mod generated {
    tonic::include_proto!("_");
}

pub(crate) use generated::packet::Payload;
pub(crate) use generated::proxy_service_server::{ProxyService, ProxyServiceServer};
pub(crate) use generated::{CloseResponse, Data, DialResponse, Packet, PacketType};

/// First size of a `Proxy` stream's encode and decode buffers: tonic's default (8 KiB each) is
/// most of what an idle stream holds; they grow for larger packets.
const CODEC_BUFFER: usize = 1024;
/// Encoded bytes a stream gathers before handing them to HTTP/2 (tonic's default).
const CODEC_YIELD: usize = 32 * 1024;

/// prost's codec for `Packet`s with [`CODEC_BUFFER`]-sized first buffers.
#[derive(Debug, Default)]
pub(crate) struct Codec;

impl tonic::codec::Codec for Codec {
    type Encode = Packet;
    type Decode = Packet;
    type Encoder = tonic_prost::ProstEncoder<Packet>;
    type Decoder = tonic_prost::ProstDecoder<Packet>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(tonic::codec::BufferSettings::new(CODEC_BUFFER, CODEC_YIELD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(tonic::codec::BufferSettings::new(CODEC_BUFFER, CODEC_YIELD))
    }
}
