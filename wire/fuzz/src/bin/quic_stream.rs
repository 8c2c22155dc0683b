//! AFL target: the QUIC tunnel's stream header and dial answer (checks in `proxy_wire::fuzzing`, replayed by `cargo test -p proxy-wire --test it fuzz_corpus::`).

fn main() {
    afl::fuzz!(|data: &[u8]| proxy_wire::fuzzing::check_quic_stream(data));
}
