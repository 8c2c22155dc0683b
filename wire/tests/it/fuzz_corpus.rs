//! Replays every file of the fuzzing corpora and crash directories (`wire/fuzz/`) through the checks the AFL targets run.

use proxy_wire::fuzzing;
use std::path::{Path, PathBuf};

/// Files of `wire/fuzz/{corpus,crashes}/<target>/`; the corpus directory must not be empty.
fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut out = Vec::new();
    for kind in ["corpus", "crashes"] {
        let dir = root.join(kind).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries {
            let path = e.unwrap().path();
            // AFL leaves a README.txt in crash directories; it is not an input.
            if path.is_file() && path.file_name().is_some_and(|n| n != "README.txt") {
                let bytes = std::fs::read(&path).unwrap();
                out.push((path, bytes));
            }
        }
    }
    assert!(out.len() > 1, "no corpus for {target}");
    out
}

fn replay(target: &str, check: fn(&[u8])) {
    for (path, bytes) in inputs(target) {
        let r = std::panic::catch_unwind(|| check(&bytes));
        assert!(r.is_ok(), "{target}: {} fails its check", path.display());
    }
}

#[test]
fn client_hello() {
    replay("client_hello", fuzzing::check_client_hello);
}

#[test]
fn proxy_protocol() {
    replay("proxy_protocol", fuzzing::check_proxy_protocol);
}

#[test]
fn proxy_roundtrip() {
    replay("proxy_roundtrip", fuzzing::check_proxy_roundtrip);
}

#[test]
fn http_request() {
    replay("http_request", fuzzing::check_http_request);
}

#[test]
fn http_response() {
    replay("http_response", fuzzing::check_http_response);
}

#[test]
fn control_lines_framing() {
    replay("control_lines", |d| {
        fuzzing::check_control_framing(d, 64 * 1024);
    });
}

#[test]
fn control_lines() {
    replay("control_lines", fuzzing::check_control_input);
}

#[test]
fn quic_stream() {
    replay("quic_stream", fuzzing::check_quic_stream);
}

#[test]
fn proxy_auth() {
    replay("proxy_auth", fuzzing::check_proxy_auth);
}

#[test]
fn quic_initial() {
    replay("quic_initial", |d| {
        fuzzing::check_quic_initial(d);
    });
}

#[test]
fn http2_requests() {
    replay("http2_requests", |d| {
        fuzzing::check_http2_requests(d);
    });
}
