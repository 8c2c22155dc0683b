//! `Proxy-Authorization: Basic` credentials (RFC 7617) from the header's raw bytes.
//!
//! The value is untrusted: any bytes a client sends. Base64 is decoded by the `base64` crate
//! (standard alphabet, padding required and canonical); what the credentials are then checked
//! against (a token, compared in constant time) is the caller's business.

#![deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;

/// A user name and password, as the client sent them.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

/// The password stays out of logs and panics.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("user", &self.user).finish_non_exhaustive()
    }
}

#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    #[error("credentials are not UTF-8")]
    NotUtf8,
    #[error("not the Basic scheme")]
    NotBasic,
    #[error("credentials are not valid base64")]
    BadBase64,
    #[error("credentials have no ':' between user and password")]
    NoSeparator,
}

/// The credentials of a `Basic` value: `Basic base64(user:password)`, the scheme in any case,
/// spaces around the parts ignored.
pub fn basic(value: &[u8]) -> Result<Credentials, AuthError> {
    let value = std::str::from_utf8(value).map_err(|_| AuthError::NotUtf8)?.trim();
    let (scheme, encoded) = value.split_once(' ').ok_or(AuthError::NotBasic)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(AuthError::NotBasic);
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).map_err(|_| AuthError::BadBase64)?;
    let decoded = String::from_utf8(decoded).map_err(|_| AuthError::NotUtf8)?;
    let (user, password) = decoded.split_once(':').ok_or(AuthError::NoSeparator)?;
    Ok(Credentials { user: user.to_owned(), password: password.to_owned() })
}

/// The header value that carries `user` and `password` (what a client sends).
pub fn encode_basic(user: &str, password: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(user: &str, password: &str) -> Result<Credentials, AuthError> {
        Ok(Credentials { user: user.into(), password: password.into() })
    }

    #[test]
    fn curls_header_value_decodes() {
        // `curl --proxy-user shoot-a:s3cret`
        assert_eq!(basic(b"Basic c2hvb3QtYTpzM2NyZXQ="), creds("shoot-a", "s3cret"));
        assert_eq!(basic(b"basic  c2hvb3QtYTpzM2NyZXQ= "), creds("shoot-a", "s3cret"));
        assert_eq!(encode_basic("shoot-a", "s3cret"), "Basic c2hvb3QtYTpzM2NyZXQ=");
        // The password may hold colons; the user name may not.
        assert_eq!(basic(encode_basic("u", "a:b").as_bytes()), creds("u", "a:b"));
        assert_eq!(basic(b"Basic Og=="), creds("", ""));
    }

    #[test]
    fn padding_length_and_alphabet_are_checked() {
        for (value, want) in [
            (&b"Basic YQ="[..], AuthError::BadBase64),
            (b"Basic Y===", AuthError::BadBase64),
            (b"Basic YQ==YQ==", AuthError::BadBase64),
            (b"Basic YQ!=", AuthError::BadBase64),
            (b"Basic YR==", AuthError::BadBase64), // non-canonical trailing bits
            (b"Basic YQ==", AuthError::NoSeparator),
            (b"Basic ", AuthError::NotBasic),
            (b"Bearer s3cret", AuthError::NotBasic),
            (b"Basic", AuthError::NotBasic),
            (b"Basic \xff", AuthError::NotUtf8),
            (b"Basic /w==", AuthError::NotUtf8),
        ] {
            assert_eq!(basic(value), Err(want), "{}", String::from_utf8_lossy(value));
        }
    }

    #[test]
    fn the_password_is_not_in_debug_output() {
        let c = Credentials { user: "u".into(), password: "s3cret".into() };
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
