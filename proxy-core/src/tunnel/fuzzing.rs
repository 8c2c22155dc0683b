//! The control-stream check shared by the AFL target `control_lines` (`wire/fuzz/`) and the corpus replay test.
//!
//! Here rather than in proxy-wire because it decodes [`ControlMsg`], which lives in this crate;
//! proxy-wire must not depend on proxy-core (nor on tokio). Not part of the API.

use super::{AgentHello, ControlMsg, h2::CONTROL_LINE_MAX};

/// Frames `data` as the control stream does (every split gives the same lines, see
/// `proxy_wire::fuzzing::check_control_framing`), then decodes each line as both ends do.
/// Panics if framing depends on the split or a decoded message does not survive re-encoding.
pub fn check_control_input(data: &[u8]) {
    let (lines, _) = proxy_wire::fuzzing::check_control_framing(data, CONTROL_LINE_MAX);
    for line in lines {
        if let Ok(msg) = serde_json::from_slice::<ControlMsg>(&line) {
            let again = serde_json::to_vec(&msg).expect("a decoded message encodes");
            assert_eq!(serde_json::from_slice::<ControlMsg>(&again).ok(), Some(msg));
        }
        if let Ok(hello) = serde_json::from_slice::<AgentHello>(&line) {
            let again = serde_json::to_vec(&hello).expect("a decoded hello encodes");
            assert_eq!(serde_json::from_slice::<AgentHello>(&again).ok(), Some(hello));
        }
    }
}
