//! AFL target: PROXY v1/v2 detect and parse (checks in `proxy_wire::fuzzing`, replayed by `cargo test -p proxy-wire --test it fuzz_corpus`).

fn main() {
    afl::fuzz!(|data: &[u8]| proxy_wire::fuzzing::check_proxy_protocol(data));
}
