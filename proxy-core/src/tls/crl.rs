//! Certificate revocation lists: read from PEM or DER files, each matched to the CA of the bundle whose key signed it, and certificates looked up by the key that issued them.
//!
//! A list is trusted only once its signature verified with the key of a CA in the bundle it
//! comes with (`agents.tls.client_ca`, a front end's `tls.client_ca`, the agent's
//! `tunnel.tls.ca`); a certificate is looked up only in the lists of the key that signed it.
//! Names alone decide nothing: after a CA rotation that kept the CA's name (a new key, the same
//! subject), the old CA's list applies to the old CA's certificates only, and a list signed by
//! any other key with a CA's name revokes nothing. The handshake ([`super::verify`]) and the
//! check of sessions verified before a list changed ask the same [`Revoked::of`]. Only the
//! end-entity certificate is looked up; a list that no CA of the bundle signed (an intermediate
//! CA's that is not in the bundle, a CA's that left it) is reported by [`Revoked::unused`].

use super::error::{TlsError, file_err};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::CertificateRevocationListDer;
use rustls::pki_types::pem::PemObject;
use std::collections::HashSet;
use std::path::Path;
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

/// The lists in `path`: every `X509 CRL` PEM block, or the whole file as one DER list. Each
/// must parse as rustls' verifiers would take it (webpki refuses delta and indirect lists, lists
/// without `nextUpdate`, unknown critical extensions).
pub fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| file_err(path, "reading revocation lists", e))?;
    let pem: Vec<_> = CertificateRevocationListDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(path, "parsing revocation lists", e))?;
    let lists = match pem.is_empty() {
        // `openssl crl -outform DER` writes one list, no PEM armour: a DER SEQUENCE.
        true if bytes.first() == Some(&0x30) => vec![CertificateRevocationListDer::from(bytes)],
        true => return Err(file_err(path, "reading revocation lists", "no X509 CRL found (PEM or DER)")),
        false => pem,
    };
    for l in &lists {
        x509_parser::parse_x509_crl(l.as_ref()).map_err(|e| file_err(path, "parsing revocation lists", e))?;
        webpki::OwnedCertRevocationList::from_der(l.as_ref())
            .map_err(|e| file_err(path, "parsing revocation lists", format!("{e:?}")))?;
    }
    Ok(lists)
}

/// One list whose signature verified with a CA's key: its issuer (DER name), that key, and the
/// serial numbers it revokes.
#[derive(Debug, Clone)]
struct List {
    issuer: Vec<u8>,
    /// The DER SubjectPublicKeyInfo of the CA whose key signed the list.
    signer: Vec<u8>,
    serials: HashSet<Vec<u8>>,
    /// When the issuer promises the next list (Unix seconds), if it says.
    next_update: Option<i64>,
}

/// Why a list of the file revokes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unused {
    /// No CA of the bundle has the list's issuer name.
    NoCaOfItsName,
    /// CAs of its issuer's name are in the bundle, but its signature verifies with none of
    /// their keys: the list of a CA rotated away under the same name, or a forgery.
    OtherKey,
    /// The CA whose key signed it may not sign lists (its key usage lacks `cRLSign`).
    NotALister,
}

/// A list that matched no CA of the bundle, as an operator finds it in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnusedList {
    /// Its place in the file, from 1.
    pub index: usize,
    /// Of how many.
    pub of: usize,
    /// Its issuer's name, as `openssl crl -issuer` prints it.
    pub issuer: String,
    pub why: Unused,
}

impl UnusedList {
    /// What an operator reads (`ca`: the bundle's file).
    pub fn message(&self, ca: &Path) -> String {
        let (ca, issuer) = (ca.display(), &self.issuer);
        let why = match self.why {
            Unused::NoCaOfItsName => format!("no CA in {ca} is named {issuer}"),
            Unused::OtherKey => format!(
                "its signature verifies with the key of no CA named {issuer} in {ca} (the list of a CA replaced under the same name, or of another key)"
            ),
            Unused::NotALister => {
                format!("the CA in {ca} whose key signed it may not sign revocation lists (no cRLSign key usage)")
            }
        };
        format!("revocation list {} of {} matches no CA: {why}; it revokes nothing", self.index, self.of)
    }
}

/// The revoked serials of a set of lists, each list with the key that signed it.
#[derive(Debug, Clone, Default)]
pub struct Revoked {
    lists: Vec<List>,
    unused: Vec<UnusedList>,
}

impl Revoked {
    /// The lists in `crl` ([`load_crls`]) matched to the CAs in `ca`.
    pub fn load(crl: &Path, ca: &Path) -> Result<Self, TlsError> {
        let cas = super::pem::load_certs(ca)?;
        Self::matched(&cas, &load_crls(crl)?).map_err(|e| file_err(crl, "parsing revocation lists", e))
    }

    /// Each of `lists` kept with the CA of `cas` whose key signed it, or reported as unused.
    pub fn matched(cas: &[CertificateDer<'_>], lists: &[CertificateRevocationListDer<'_>]) -> Result<Self, String> {
        let cas: Vec<X509Certificate<'_>> =
            cas.iter().filter_map(|c| x509_parser::parse_x509_certificate(c.as_ref()).ok().map(|(_, x)| x)).collect();
        let mut out = Self::default();
        for (i, der) in lists.iter().enumerate() {
            let (_, crl) = x509_parser::parse_x509_crl(der.as_ref()).map_err(|e| e.to_string())?;
            let issuer = crl.issuer().as_raw();
            let named: Vec<&X509Certificate<'_>> = cas.iter().filter(|c| c.subject().as_raw() == issuer).collect();
            // The signature decides; the name only narrows the CAs to try.
            let signer = named.iter().find(|c| crl.verify_signature(c.public_key()).is_ok());
            let used = match signer {
                Some(c) if may_sign_lists(c) => Ok(c),
                Some(_) => Err(Unused::NotALister),
                None if named.is_empty() => Err(Unused::NoCaOfItsName),
                None => Err(Unused::OtherKey),
            };
            match used {
                Ok(c) => out.lists.push(List {
                    issuer: issuer.to_vec(),
                    signer: c.public_key().raw.to_vec(),
                    serials: crl.iter_revoked_certificates().map(|r| r.raw_serial().to_vec()).collect(),
                    next_update: crl.next_update().map(|t| t.timestamp()),
                }),
                Err(why) => {
                    out.unused.push(UnusedList { index: i + 1, of: lists.len(), issuer: crl.issuer().to_string(), why })
                }
            }
        }
        Ok(out)
    }

    /// The serial of `cert` (hex, as `openssl x509 -serial` prints it) when a list signed by
    /// the key that issued `cert` revokes it; `None` when none does, or `cert` cannot be parsed.
    pub fn of(&self, cert: &CertificateDer<'_>) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let (_, x) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        let (issuer, serial) = (x.issuer().as_raw(), x.raw_serial());
        // Signatures are checked only for a serial some list of the issuer's name holds.
        let listed = self.lists.iter().filter(|l| l.issuer == issuer && l.serials.contains(serial)).any(|l| {
            SubjectPublicKeyInfo::from_der(&l.signer).is_ok_and(|(_, key)| x.verify_signature(Some(&key)).is_ok())
        });
        listed.then(|| serial_hex(serial))
    }

    /// The lists of the file that no CA of the bundle signed: they revoke nothing.
    pub fn unused(&self) -> &[UnusedList] {
        &self.unused
    }

    /// Revoked serials across the lists in use.
    pub fn len(&self) -> usize {
        self.lists.iter().map(|l| l.serials.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The earliest `nextUpdate` of the lists in use (Unix seconds): after it a list is stale.
    pub fn next_update(&self) -> Option<i64> {
        self.lists.iter().filter_map(|l| l.next_update).min()
    }
}

/// Whether `ca`'s key usage allows signing lists (no key usage extension: any use).
fn may_sign_lists(ca: &X509Certificate<'_>) -> bool {
    match ca.key_usage() {
        Ok(Some(ku)) => ku.value.crl_sign(),
        Ok(None) => true,
        Err(_) => false,
    }
}

/// `serial` as upper-case hex without leading zero bytes (openssl's `serial=` form).
pub fn serial_hex(serial: &[u8]) -> String {
    let trimmed = match serial.iter().position(|b| *b != 0) {
        Some(i) => &serial[i..],
        None => &serial[serial.len().saturating_sub(1)..],
    };
    trimmed.iter().map(|b| format!("{b:02X}")).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType, IsCa, Issuer, KeyIdMethod,
        KeyPair, KeyUsagePurpose, RevokedCertParams, SerialNumber, date_time_ymd,
    };

    /// A test CA: its certificate, and what signs as it.
    pub(crate) struct TestCa {
        pub(crate) cert: CertificateDer<'static>,
        issuer: Issuer<'static, KeyPair>,
    }

    fn ca_params(name: &str, crl_sign: bool) -> CertificateParams {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        if crl_sign {
            p.key_usages.push(KeyUsagePurpose::CrlSign);
        }
        p
    }

    impl TestCa {
        /// A CA named `name` with a key of its own.
        pub(crate) fn new(name: &str) -> Self {
            Self::with_key(name, KeyPair::generate().expect("key"), true)
        }

        /// A CA named `name` with `key`; `crl_sign`: whether its key usage allows lists.
        fn with_key(name: &str, key: KeyPair, crl_sign: bool) -> Self {
            let p = ca_params(name, crl_sign);
            let cert = p.self_signed(&key).expect("self-signed").der().clone();
            // Lists are signed by an issuer allowed to (rcgen checks); the bundle holds `cert`.
            Self { cert, issuer: Issuer::new(ca_params(name, true), key) }
        }

        /// An intermediate CA named `name` that this CA signed.
        pub(crate) fn intermediate(&self, name: &str) -> Self {
            let key = KeyPair::generate().expect("key");
            let cert = ca_params(name, true).signed_by(&key, &self.issuer).expect("intermediate").der().clone();
            Self { cert, issuer: Issuer::new(ca_params(name, true), key) }
        }

        /// Another certificate for this CA's key and name (a renewed CA certificate).
        fn renewed(&self, crl_sign: bool) -> Self {
            let key = KeyPair::from_pem(&self.issuer.key().serialize_pem()).expect("key");
            let name = x509_parser::parse_x509_certificate(self.cert.as_ref())
                .expect("ca")
                .1
                .subject()
                .iter_common_name()
                .next()
                .and_then(|n| n.as_str().ok())
                .expect("cn")
                .to_owned();
            Self::with_key(&name, key, crl_sign)
        }

        /// A client certificate (CN `shoot-a`) with serial `serial`.
        pub(crate) fn leaf(&self, serial: u64) -> CertificateDer<'static> {
            self.issue(serial, Vec::new(), rcgen::ExtendedKeyUsagePurpose::ClientAuth)
        }

        /// A server certificate for `proxy.test` with serial `serial`.
        pub(crate) fn server_leaf(&self, serial: u64) -> CertificateDer<'static> {
            self.issue(serial, vec!["proxy.test".to_owned()], rcgen::ExtendedKeyUsagePurpose::ServerAuth)
        }

        fn issue(
            &self,
            serial: u64,
            names: Vec<String>,
            usage: rcgen::ExtendedKeyUsagePurpose,
        ) -> CertificateDer<'static> {
            let mut p = CertificateParams::new(names).expect("params");
            p.distinguished_name.push(DnType::CommonName, "shoot-a");
            p.serial_number = Some(SerialNumber::from(serial));
            p.extended_key_usages = vec![usage];
            let key = KeyPair::generate().expect("key");
            p.signed_by(&key, &self.issuer).expect("leaf").der().clone()
        }

        /// A list revoking `serials`, signed by this CA.
        pub(crate) fn list(&self, serials: &[u64]) -> CertificateRevocationListDer<'static> {
            let p = CertificateRevocationListParams {
                this_update: date_time_ymd(2024, 1, 1),
                next_update: date_time_ymd(2100, 1, 1),
                crl_number: SerialNumber::from(1u64),
                issuing_distribution_point: None,
                revoked_certs: serials
                    .iter()
                    .map(|s| RevokedCertParams {
                        serial_number: SerialNumber::from(*s),
                        revocation_time: date_time_ymd(2024, 1, 1),
                        reason_code: None,
                        invalidity_date: None,
                    })
                    .collect(),
                key_identifier_method: KeyIdMethod::Sha256,
            };
            p.signed_by(&self.issuer).expect("list").der().clone()
        }
    }

    #[test]
    fn serials_print_as_openssl_does() {
        assert_eq!(serial_hex(&[0x00, 0x1f, 0xa0]), "1FA0");
        assert_eq!(serial_hex(&[0x00]), "00");
        assert_eq!(serial_hex(&[]), "");
    }

    #[test]
    fn a_file_without_a_list_is_refused_with_its_name() {
        let dir = std::env::temp_dir().join(format!("seedgate-crl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let f = dir.join("crl.pem");
        std::fs::write(&f, "not a list\n").expect("write");
        let e = load_crls(&f).expect_err("no list").to_string();
        assert!(e.contains("crl.pem") && e.contains("no X509 CRL"), "{e}");
        std::fs::write(&f, "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n").expect("write");
        let e = load_crls(&f).expect_err("garbage").to_string();
        assert!(e.contains("parsing revocation lists"), "{e}");
        assert!(load_crls(&dir.join("missing.pem")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Lists against bundles of CAs, row by row: which lists are used, which are not and why,
    /// and which certificates they revoke. `old` and `new` share a name (a rotation that kept
    /// it); `impostor` has it too; `renewed` is `old`'s key in a new certificate; `issuing` an
    /// intermediate CA of `old`'s.
    #[test]
    fn lists_match_the_ca_whose_key_signed_them_never_a_name_alone() {
        let old = TestCa::new("agents-ca");
        let new = TestCa::new("agents-ca");
        let impostor = TestCa::new("agents-ca");
        let other = TestCa::new("other-ca");
        let renewed = old.renewed(true);
        let no_lists = old.renewed(false);
        let (old_7, old_8) = (old.leaf(7), old.leaf(8));
        let (new_7, other_7) = (new.leaf(7), other.leaf(7));
        let renewed_9 = renewed.leaf(9);
        let issuing = old.intermediate("issuing-ca");
        let issuing_7 = issuing.leaf(7);
        use Unused::*;
        // (row, bundle, lists, the unused lists' reasons, certificates revoked, certificates not)
        type Row<'a> = (&'a str, Vec<&'a TestCa>, Vec<CertificateRevocationListDer<'static>>, Vec<Unused>);
        let rows: Vec<(Row<'_>, Vec<&CertificateDer<'_>>, Vec<&CertificateDer<'_>>)> = vec![
            (
                ("the old CA's list, old CA alone", vec![&old], vec![old.list(&[7])], vec![]),
                vec![&old_7],
                vec![&old_8, &new_7, &other_7],
            ),
            (
                ("the old CA's list, old and new CA of one name", vec![&old, &new], vec![old.list(&[7])], vec![]),
                vec![&old_7],
                vec![&new_7, &old_8],
            ),
            (
                ("the old CA's list, new CA alone", vec![&new], vec![old.list(&[7])], vec![OtherKey]),
                vec![],
                vec![&old_7, &new_7],
            ),
            (
                ("each CA's list, the new one's first", vec![&old, &new], vec![new.list(&[8]), old.list(&[7])], vec![]),
                vec![&old_7],
                vec![&new_7, &old_8],
            ),
            (
                ("an impostor's list of the CA's name", vec![&old], vec![impostor.list(&[7, 8])], vec![OtherKey]),
                vec![],
                vec![&old_7, &old_8],
            ),
            (
                ("a list of a CA not in the bundle", vec![&old], vec![other.list(&[7])], vec![NoCaOfItsName]),
                vec![],
                vec![&old_7, &other_7],
            ),
            (
                (
                    "the old key's list, its renewed certificate in the bundle",
                    vec![&renewed],
                    vec![old.list(&[7, 9])],
                    vec![],
                ),
                vec![&old_7, &renewed_9],
                vec![&old_8, &new_7],
            ),
            (
                (
                    "an intermediate's list, the intermediate in the bundle",
                    vec![&old, &issuing],
                    vec![issuing.list(&[7])],
                    vec![],
                ),
                vec![&issuing_7],
                vec![&old_7],
            ),
            (
                (
                    "an intermediate's list, its root alone in the bundle",
                    vec![&old],
                    vec![issuing.list(&[7])],
                    vec![NoCaOfItsName],
                ),
                vec![],
                vec![&issuing_7, &old_7],
            ),
            (
                (
                    "a list of a key whose certificate may not sign lists",
                    vec![&no_lists],
                    vec![old.list(&[7])],
                    vec![NotALister],
                ),
                vec![],
                vec![&old_7],
            ),
        ];
        for ((row, bundle, lists, unused), revoked, kept) in &rows {
            let cas: Vec<_> = bundle.iter().map(|c| c.cert.clone()).collect();
            let r = Revoked::matched(&cas, lists).expect("parsed");
            let why: Vec<Unused> = r.unused().iter().map(|u| u.why).collect();
            assert_eq!(&why, unused, "{row}: unused lists");
            for c in revoked {
                assert_eq!(r.of(c).as_deref(), Some(serial_of(c).as_str()), "{row}: revoked");
            }
            for c in kept {
                assert_eq!(r.of(c), None, "{row}: not revoked");
            }
        }
    }

    fn serial_of(c: &CertificateDer<'_>) -> String {
        serial_hex(x509_parser::parse_x509_certificate(c.as_ref()).expect("cert").1.raw_serial())
    }

    #[test]
    fn an_unused_list_says_where_and_why() {
        let (ca, impostor) = (TestCa::new("agents-ca"), TestCa::new("agents-ca"));
        let r =
            Revoked::matched(std::slice::from_ref(&ca.cert), &[ca.list(&[1]), impostor.list(&[1])]).expect("parsed");
        let [u] = r.unused() else { panic!("one unused list: {:?}", r.unused()) };
        assert_eq!((u.index, u.of, u.issuer.as_str()), (2, 2, "CN=agents-ca"));
        let m = u.message(Path::new("/etc/ca.crt"));
        assert!(m.starts_with("revocation list 2 of 2 matches no CA: "), "{m}");
        assert!(m.contains("no CA named CN=agents-ca in /etc/ca.crt") && m.ends_with("it revokes nothing"), "{m}");
        assert_eq!(r.len(), 1, "the CA's own list is in use");
    }
}
