//! Proxy credentials (`cluster_from: proxy_authorization`): the cluster a request's `Proxy-Authorization: Basic` names, checked against the front end's token.

/// Why proxy credentials named no cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProxyAuth {
    /// No `Proxy-Authorization` header.
    Missing,
    /// Not Basic credentials of a cluster name and the front end's token.
    Invalid,
}

/// The `Proxy-Authenticate` challenge of a 407.
pub(crate) const PROXY_CHALLENGE: &str = "Basic realm=\"seedgate\"";

/// The cluster that `Proxy-Authorization: Basic base64(cluster:token)` names, if its password is
/// `token`.
pub(super) fn proxy_auth_cluster(value: Option<&[u8]>, token: &str) -> Result<String, ProxyAuth> {
    let value = value.ok_or(ProxyAuth::Missing)?;
    let creds = proxy_wire::proxy_auth::basic(value).map_err(|_| ProxyAuth::Invalid)?;
    // Compare without an early exit so the time taken does not reveal the matching prefix.
    let (a, b) = (creds.password.as_bytes(), token.as_bytes());
    let same = a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
    if !same || !seedgate_config::server::valid_cluster_name(&creds.user) {
        return Err(ProxyAuth::Invalid);
    }
    Ok(creds.user)
}

#[cfg(test)]
mod tests {
    #[test]
    fn proxy_credentials_name_the_cluster_with_the_right_token() {
        use super::super::refusal::Refusal;
        use super::proxy_auth_cluster;
        let label = |r: Result<String, super::ProxyAuth>| r.map_err(|e| Refusal::ProxyAuth(e).label());
        for bad in ["YQ=", "Y===", "YQ==YQ==", "YQ!=", "YQ=="] {
            let value = format!("Basic {bad}");
            assert_eq!(label(proxy_auth_cluster(Some(value.as_bytes()), "s3cret")), Err("proxy_auth_invalid"), "{bad}");
        }
        let ok = proxy_auth_cluster(Some(b"Basic c2hvb3QtYTpzM2NyZXQ="), "s3cret");
        assert_eq!(ok.as_deref(), Ok("shoot-a"));
        assert_eq!(proxy_auth_cluster(Some(b"basic  c2hvb3QtYTpzM2NyZXQ= "), "s3cret").as_deref(), Ok("shoot-a"));
        assert_eq!(label(proxy_auth_cluster(None, "s3cret")), Err("proxy_auth_missing"));
        assert_eq!(label(proxy_auth_cluster(Some(b"Basic c2hvb3QtYTpzM2NyZXQ="), "s3cre")), Err("proxy_auth_invalid"));
        assert_eq!(label(proxy_auth_cluster(Some(b"Bearer s3cret"), "s3cret")), Err("proxy_auth_invalid"));
        let r = String::from_utf8(Refusal::ProxyAuth(super::ProxyAuth::Missing).answer(1)).unwrap();
        assert!(
            r.starts_with(
                "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"seedgate\"\r\n"
            ),
            "{r}"
        );
        // "a b:s3cret": not a cluster name.
        assert_eq!(label(proxy_auth_cluster(Some(b"Basic YSBiOnMzY3JldA=="), "s3cret")), Err("proxy_auth_invalid"));
    }
}
