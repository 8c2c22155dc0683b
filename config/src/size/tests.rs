use super::*;

#[test]
fn plain_counts_and_units() {
    for (text, bytes) in [
        ("16777216", 16 << 20),
        ("16Mi", 16 << 20),
        ("16MiB", 16 << 20),
        ("512Ki", 512 << 10),
        ("1Gi", 1 << 30),
        ("64M", 64_000_000),
        ("128k", 128_000),
        ("128K", 128_000),
        ("2G", 2_000_000_000),
        ("1.5Mi", 3 << 19),
        ("1.5k", 1_500),
        (" 8Ki ", 8 << 10),
        ("0", 0),
    ] {
        assert_eq!(parse_size(text).unwrap(), bytes, "{text}");
    }
}

#[test]
fn refused_forms_say_why_and_what_is_accepted() {
    for (text, why) in [
        ("16MB", "unknown unit"),
        ("16 Mi", "unknown unit"),
        ("16mi", "unknown unit"),
        ("Mi", "not a number"),
        ("1.Mi", "not a number"),
        ("1.2.3", "not a number"),
        ("1.5", "not a whole number of bytes"),
        ("0.1Ki", "not a whole number of bytes"),
        ("99999999999999999999Ti", "too large"),
        ("-1Mi", "unknown unit"),
    ] {
        let e = parse_size(text).unwrap_err();
        assert_eq!(e, ValueError::Size { text: text.to_owned(), why }, "{text}");
        assert!(e.to_string().contains("Ki, Mi, Gi"), "{e}");
    }
}

#[test]
fn a_size_key_reads_both_forms_and_names_the_accepted_ones_when_refused() {
    let cfg = crate::agent::parse(
        "tunnel:\n  servers: [s:1]\n  tls: { cert: c, key: k, ca: ca }\n  allow: [10.0.0.0/8]\n  max_stream_window: 32Mi\n  connection_window: 134217728\n  tcp_notsent_lowat: 64Ki\n  stream_window: 1Mi\n",
        "a.yaml",
    )
    .unwrap();
    let s = cfg.tunnel.expect("a tunnel").session();
    assert_eq!((s.max_stream_window, s.connection_window, s.tcp_notsent_lowat), (32 << 20, 128 << 20, 64 << 10));
    assert_eq!(s.stream_window, Some(1 << 20));
    let err = crate::agent::parse(
        "tunnel:\n  servers: [s:1]\n  tls: { cert: c, key: k, ca: ca }\n  allow: [10.0.0.0/8]\n  max_stream_window: 3Gi\n  connection_window: 64MB\n  tcp_notsent_lowat: true\n  stream_window: 8Gi\n",
        "a.yaml",
    )
    .unwrap_err()
    .to_string();
    for (line, text) in [
        ("a.yaml:5:22: tunnel.max_stream_window", "must be between 65535 and 2147483647 bytes (64Ki - 1 and 2Gi - 1)"),
        ("a.yaml:6:22: tunnel.connection_window", r#"invalid size "64MB" (unknown unit); write a byte count"#),
        ("a.yaml:7:22: tunnel.tcp_notsent_lowat", r#"invalid size "true" (not a number)"#),
        ("a.yaml:8:18: tunnel.stream_window", r#"invalid size "8Gi" (more than 4294967295 bytes)"#),
    ] {
        assert!(err.lines().any(|l| l.starts_with(line) && l.contains(text)), "{line} {text}:\n{err}");
    }
}
