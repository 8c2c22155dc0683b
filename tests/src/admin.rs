//! A minimal HTTP/1.1 client for admin endpoints, and Prometheus text-format lookups.

use anyhow::{Context as _, bail};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// One admin request must finish within this (the admin server answers from memory).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Responses larger than this are a bug in the server or the test.
const MAX_RESPONSE: usize = 16 << 20;

/// `GET path` with `Connection: close`; returns the status and the (de-chunked) body.
pub async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    http_request(addr, "GET", path, None, None).await
}

/// `POST path` with `body`, and `Authorization: Bearer <bearer>` when given.
pub async fn http_post(
    addr: SocketAddr,
    path: &str,
    body: &str,
    bearer: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    http_request(addr, "POST", path, Some(body), bearer).await
}

/// Any method; the body is sent with a Content-Length.
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    bearer: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = bearer {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    req.push_str(body.unwrap_or(""));
    let raw = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        (&mut s).take(MAX_RESPONSE as u64).read_to_end(&mut out).await?;
        anyhow::Ok(out)
    })
    .await
    .with_context(|| format!("{method} http://{addr}{path}: no complete answer within {REQUEST_TIMEOUT:?}"))?
    .with_context(|| format!("{method} http://{addr}{path}"))?;
    let (status, body) = parse_response(&raw).with_context(|| format!("{method} http://{addr}{path}"))?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A whole answer: status, header lines (names lower-cased) and body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// The value of header `name` (lower-case), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `GET path` with extra request header lines (`("Authorization", "Basic ...")`); the whole answer.
pub async fn http_get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<Answer> {
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let raw = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        (&mut s).take(MAX_RESPONSE as u64).read_to_end(&mut out).await?;
        anyhow::Ok(out)
    })
    .await
    .with_context(|| format!("GET http://{addr}{path}: no complete answer within {REQUEST_TIMEOUT:?}"))?
    .with_context(|| format!("GET http://{addr}{path}"))?;
    let (status, body) = parse_response(&raw).with_context(|| format!("GET http://{addr}{path}"))?;
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(raw.len());
    let headers = String::from_utf8_lossy(&raw[..head_end])
        .split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned())))
        .collect();
    Ok(Answer { status, headers, body: String::from_utf8_lossy(&body).into_owned() })
}

/// Split an HTTP/1.1 response read to EOF into status and body (Content-Length or chunked).
pub fn parse_response(raw: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").context("response has no complete head")?;
    let head = std::str::from_utf8(&raw[..head_end]).context("response head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let mut chunked = false;
    let mut length = None;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else { continue };
        let v = v.trim();
        if k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if k.eq_ignore_ascii_case("content-length") {
            length = v.parse::<usize>().ok();
        }
    }
    let rest = &raw[head_end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = length {
        if rest.len() < n {
            bail!("body is {} bytes, Content-Length says {n}", rest.len());
        }
        rest[..n].to_vec()
    } else {
        rest.to_vec()
    };
    Ok((status, body))
}

fn dechunk(mut b: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    // Each round consumes at least one line, so the input length bounds the loop.
    for _ in 0..=b.len() {
        let eol = b.windows(2).position(|w| w == b"\r\n").context("truncated chunk size")?;
        let size_text = std::str::from_utf8(&b[..eol])?.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).with_context(|| format!("bad chunk size {size_text:?}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size + 2 {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
    bail!("malformed chunked body")
}

/// Poll `GET /readyz` until it answers 200, for at most `deadline`.
pub async fn wait_ready(addr: SocketAddr, deadline: Duration) -> anyhow::Result<()> {
    crate::poll::poll_until(deadline, Duration::from_millis(20), || async {
        match http_get(addr, "/readyz").await {
            Ok((200, _)) => Ok(()),
            Ok((s, body)) => Err(anyhow::anyhow!("/readyz answered {s}: {}", body.trim())),
            Err(e) => Err(e),
        }
    })
    .await
    .with_context(|| format!("admin {addr} not ready"))
}

type Labels = Vec<(String, String)>;

/// One sample line: metric name, labels, value.
fn parse_sample(line: &str) -> Option<(&str, Labels, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let (ls, after) = parse_labels(r)?;
        labels = ls;
        rest = after;
    }
    // The value is the first field after the labels; a timestamp may follow.
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((name, labels, value))
}

/// Parse `k="v",...}` (after the `{`); returns the labels and the text after the `}`.
fn parse_labels(mut s: &str) -> Option<(Labels, &str)> {
    let mut labels = Vec::new();
    // Every round consumes at least one character.
    for _ in 0..=s.len() {
        s = s.trim_start_matches([',', ' ']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_owned();
        let mut chars = s[eq + 1..].trim_start().strip_prefix('"')?.char_indices();
        let base = s.len() - chars.as_str().len();
        let mut val = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => val.push('\n'),
                    other => val.push(other),
                },
                '"' => {
                    end = Some(base + i + 1);
                    break;
                }
                c => val.push(c),
            }
        }
        s = &s[end?..];
        labels.push((key, val));
    }
    None
}

fn labels_match(have: &[(String, String)], want: &[(&str, &str)]) -> bool {
    want.iter().all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
}

/// The value of the first sample of `name` whose labels include all of `labels`.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter_map(parse_sample).find(|(n, l, _)| *n == name && labels_match(l, labels)).map(|(_, _, v)| v)
}

/// The sum over every sample of `name` whose labels include all of `labels` (0 when none).
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(parse_sample)
        .filter(|(n, l, _)| *n == name && labels_match(l, labels))
        .map(|(_, _, v)| v)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP seedgate_connections_total Connections handled.
# TYPE seedgate_connections_total counter
seedgate_connections_total{listener="gateway",result="ok",route="a"} 3
seedgate_connections_total{listener="gateway",result="ok",route="b"} 4
seedgate_connections_total{listener="other",result="no_route",route=""} 1
seedgate_handshake_duration_seconds_bucket{listener="gateway",protocol="tls",le="+Inf"} 7
seedgate_handshake_duration_seconds_count{listener="gateway",protocol="tls"} 7
weird{a="x\"y,z}",b="\\"} 2.5 1700000000
seedgate_build_info 1
"#;

    #[test]
    fn metric_lookup_by_label_subset() {
        assert_eq!(metric_value(TEXT, "seedgate_connections_total", &[("route", "b")]), Some(4.0));
        assert_eq!(metric_value(TEXT, "seedgate_connections_total", &[("route", "c")]), None);
        assert_eq!(metric_sum(TEXT, "seedgate_connections_total", &[("listener", "gateway")]), 7.0);
        assert_eq!(metric_sum(TEXT, "seedgate_connections_total", &[]), 8.0);
        assert_eq!(metric_value(TEXT, "seedgate_handshake_duration_seconds_count", &[]), Some(7.0));
        assert_eq!(metric_value(TEXT, "seedgate_handshake_duration_seconds_bucket", &[("le", "+Inf")]), Some(7.0));
        assert_eq!(metric_value(TEXT, "weird", &[("a", "x\"y,z}"), ("b", "\\")]), Some(2.5));
        assert_eq!(metric_value(TEXT, "seedgate_build_info", &[]), Some(1.0));
        // A name is matched whole, not as a prefix.
        assert_eq!(metric_value(TEXT, "seedgate_connections", &[]), None);
    }

    #[test]
    fn responses_with_length_and_chunks() {
        let (s, b) = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA").unwrap();
        assert_eq!((s, b.as_slice()), (200, &b"ok"[..]));
        let (s, b) =
            parse_response(b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n")
                .unwrap();
        assert_eq!((s, b.as_slice()), (503, &b"abcde"[..]));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
    }
}
