//! The rustls verifiers of peers' certificates when revocation lists are configured: webpki verifies the chain, [`Revoked::of`] looks the certificate up by the key that issued it.
//!
//! webpki takes the first list whose issuer *name* is the certificate's issuer and refuses the
//! handshake when that list's signature does not verify with the issuer's key: after a CA
//! rotation that kept the CA's name, the old CA's list refused every certificate of the new CA.
//! Splitting the lists over one webpki verifier per CA does not help either: a verifier without
//! the issuer's list accepts what another's list revokes, so the verdict would depend on the
//! order they are tried. So webpki gets no list and verifies the chain alone, and revocation is
//! one function for handshakes and for sessions verified before a list changed.

use super::Revoked;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use std::sync::Arc;

/// A webpki verifier `V` whose accepted certificates are refused as revoked when `revoked`
/// names them.
#[derive(Debug)]
pub(crate) struct Checked<V: ?Sized> {
    pub(crate) chain: Arc<V>,
    pub(crate) revoked: Arc<Revoked>,
}

impl<V: ?Sized> Checked<V> {
    fn not_revoked(&self, end_entity: &CertificateDer<'_>) -> Result<(), Error> {
        match self.revoked.of(end_entity) {
            Some(_) => Err(Error::InvalidCertificate(CertificateError::Revoked)),
            None => Ok(()),
        }
    }
}

impl ClientCertVerifier for Checked<dyn ClientCertVerifier> {
    fn offer_client_auth(&self) -> bool {
        self.chain.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.chain.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified = self.chain.verify_client_cert(end_entity, intermediates, now)?;
        self.not_revoked(end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

impl ServerCertVerifier for Checked<dyn ServerCertVerifier> {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let verified = self.chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
        self.not_revoked(end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }

    fn root_hint_subjects(&self) -> Option<&[DistinguishedName]> {
        self.chain.root_hint_subjects()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::crl::tests::TestCa;
    use rustls::client::WebPkiServerVerifier;
    use rustls::pki_types::CertificateRevocationListDer;
    use rustls::server::WebPkiClientVerifier;

    /// What a verifier says of a certificate: `ok`, `revoked`, or another refusal.
    fn verdict<T>(r: Result<T, Error>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(Error::InvalidCertificate(CertificateError::Revoked)) => "revoked",
            Err(_) => "refused",
        }
    }

    fn roots(bundle: &[&TestCa]) -> Arc<rustls::RootCertStore> {
        let mut r = rustls::RootCertStore::empty();
        for c in bundle {
            r.add(c.cert.clone()).expect("a CA");
        }
        Arc::new(r)
    }

    fn lists(bundle: &[&TestCa], lists: &[CertificateRevocationListDer<'static>]) -> Arc<Revoked> {
        let cas: Vec<_> = bundle.iter().map(|c| c.cert.clone()).collect();
        Arc::new(Revoked::matched(&cas, lists).expect("lists"))
    }

    /// Both ends' verifiers, row by row: a CA replaced under its name (`old`, `new`), an
    /// impostor's list of that name, a list of a CA left out of the bundle. The old CA's list
    /// revokes its own certificate and refuses none of the new CA's.
    #[test]
    fn handshakes_look_lists_up_by_the_issuing_key() {
        let old = TestCa::new("agents-ca");
        let new = TestCa::new("agents-ca");
        let impostor = TestCa::new("agents-ca");
        let now = UnixTime::now();
        let name = ServerName::try_from("proxy.test").expect("name");
        // (row, bundle, lists, [(certificate serial's CA, serial, verdict)])
        type Row<'a> =
            (&'a str, Vec<&'a TestCa>, Vec<CertificateRevocationListDer<'static>>, Vec<(&'a TestCa, u64, &'a str)>);
        let rows: Vec<Row<'_>> = vec![
            (
                "prepare: old and new CA, the old CA's list",
                vec![&old, &new],
                vec![old.list(&[7])],
                vec![(&new, 7, "ok"), (&old, 7, "revoked"), (&old, 8, "ok")],
            ),
            (
                "prepare, the new CA first",
                vec![&new, &old],
                vec![old.list(&[7])],
                vec![(&new, 7, "ok"), (&old, 7, "revoked")],
            ),
            (
                "complete: the new CA alone, the old CA's list",
                vec![&new],
                vec![old.list(&[7])],
                vec![(&new, 7, "ok"), (&old, 8, "refused")],
            ),
            (
                "both CAs' lists",
                vec![&old, &new],
                vec![new.list(&[8]), old.list(&[7])],
                vec![(&new, 7, "ok"), (&new, 8, "revoked"), (&old, 7, "revoked"), (&old, 8, "ok")],
            ),
            ("an impostor's list of the CA's name", vec![&old], vec![impostor.list(&[7])], vec![(&old, 7, "ok")]),
        ];
        for (row, bundle, crls, cases) in &rows {
            let revoked = lists(bundle, crls);
            let chain: Arc<dyn ClientCertVerifier> =
                WebPkiClientVerifier::builder_with_provider(roots(bundle), crate::tls::provider())
                    .build()
                    .expect("client verifier");
            let clients = Checked { chain, revoked: revoked.clone() };
            let chain: Arc<dyn ServerCertVerifier> =
                WebPkiServerVerifier::builder_with_provider(roots(bundle), crate::tls::provider())
                    .build()
                    .expect("server verifier");
            let servers = Checked { chain, revoked };
            for (ca, serial, want) in cases {
                let got = verdict(clients.verify_client_cert(&ca.leaf(*serial), &[], now));
                assert_eq!(got, *want, "{row}: client certificate {serial}");
                let got = verdict(servers.verify_server_cert(&ca.server_leaf(*serial), &[], &name, &[], now));
                assert_eq!(got, *want, "{row}: server certificate {serial}");
            }
        }
    }

    /// A certificate of an intermediate CA that the client presents is looked up only in lists
    /// of a CA of the bundle: with the intermediate in the bundle its list applies, with its
    /// root alone it does not (the list matches no CA).
    #[test]
    fn an_intermediates_list_applies_once_the_intermediate_is_in_the_bundle() {
        let root = TestCa::new("agents-root");
        let issuing = root.intermediate("agents-issuing");
        let (leaf, chain) = (issuing.leaf(7), [issuing.cert.clone()]);
        let now = UnixTime::now();
        for (bundle, want) in [(vec![&root], "ok"), (vec![&root, &issuing], "revoked")] {
            let chain_verifier: Arc<dyn ClientCertVerifier> =
                WebPkiClientVerifier::builder_with_provider(roots(&bundle), crate::tls::provider())
                    .build()
                    .expect("client verifier");
            let v = Checked { chain: chain_verifier, revoked: lists(&bundle, &[issuing.list(&[7])]) };
            assert_eq!(verdict(v.verify_client_cert(&leaf, &chain, now)), want, "{} CAs in the bundle", bundle.len());
        }
    }
}
