//! AFL target: a client's HTTP/2 stream through the request normaliser (checks in `proxy_wire::fuzzing`, replayed by `cargo test -p proxy-wire --test it fuzz_corpus`).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        proxy_wire::fuzzing::check_http2_requests(data);
    });
}
