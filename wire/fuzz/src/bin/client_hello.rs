//! AFL target: the TLS ClientHello reader (checks in `proxy_wire::fuzzing`, replayed by `cargo test -p proxy-wire --test it fuzz_corpus`).

fn main() {
    afl::fuzz!(|data: &[u8]| proxy_wire::fuzzing::check_client_hello(data));
}
