//! AFL target: `Proxy-Authorization: Basic` credentials, as a header value and inside a request head (checks in `proxy_wire::fuzzing`, replayed by `cargo test -p proxy-wire --test it fuzz_corpus::`).

fn main() {
    afl::fuzz!(|data: &[u8]| proxy_wire::fuzzing::check_proxy_auth(data));
}
