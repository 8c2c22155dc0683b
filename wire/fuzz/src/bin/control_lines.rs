//! AFL target: the tunnel's control lines, framing then `ControlMsg` decoding (replayed by proxy-core's `control_corpus` test).

fn main() {
    afl::fuzz!(|data: &[u8]| proxy_core::tunnel::fuzzing::check_control_input(data));
}
