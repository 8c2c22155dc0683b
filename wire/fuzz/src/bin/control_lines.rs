//! AFL target: the tunnel's control lines, framing then `ControlMsg`/`AgentHello`/`AgentMsg` decoding (checks in `proxy_wire::fuzzing`, replayed by `cargo test -p proxy-wire --test it fuzz_corpus::`).

fn main() {
    afl::fuzz!(|data: &[u8]| proxy_wire::fuzzing::check_control_input(data));
}
