//! The control-stream check of the AFL target `control_lines`, for proxy-core's corpus replay test; it lives in `proxy_wire::fuzzing` with the messages it decodes. Not part of the API.

pub use proxy_wire::fuzzing::check_control_input;
