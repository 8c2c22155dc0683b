//! AFL target: PROXY encode_v1/try_encode_v2 round trips from fuzzer-chosen addresses and TLVs (checks in `proxy_wire::fuzzing`, replayed by `cargo test -p proxy-wire --test it fuzz_corpus`).

fn main() {
    afl::fuzz!(|data: &[u8]| proxy_wire::fuzzing::check_proxy_roundtrip(data));
}
