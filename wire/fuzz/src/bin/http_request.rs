//! AFL target: HTTP request heads, CONNECT authorities and absolute-form targets (checks in `proxy_wire::fuzzing`, replayed by `cargo test -p proxy-wire --test it fuzz_corpus`).

fn main() {
    afl::fuzz!(|data: &[u8]| proxy_wire::fuzzing::check_http_request(data));
}
