//! Replays the control-line fuzzing corpus and crashes (`wire/fuzz/{corpus,crashes}/control_lines/`): framing, then `ControlMsg` decoding.
// In proxy-core, not proxy-wire, because ControlMsg is defined here and proxy-wire stays free
// of tokio (proxy-wire's own replay covers the framing alone).

use proxy_wire::fuzzing::check_control_input;
use std::path::Path;

#[test]
fn control_lines_corpus_and_crashes_replay() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wire/fuzz");
    let mut n = 0;
    for kind in ["corpus", "crashes"] {
        let Ok(entries) = std::fs::read_dir(root.join(kind).join("control_lines")) else { continue };
        for e in entries {
            let path = e.unwrap().path();
            if !path.is_file() || path.file_name().is_some_and(|f| f == "README.txt") {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let r = std::panic::catch_unwind(|| check_control_input(&bytes));
            assert!(r.is_ok(), "{} fails its check", path.display());
            n += 1;
        }
    }
    assert!(n > 1, "no control_lines corpus");
}
