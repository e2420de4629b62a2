//! Certificate checks beyond the chain: the allowed CNs and hostnames of a peer's or client's
//! certificate (`--peer-cert-allowed-cn`, `--peer-cert-allowed-hostname`,
//! `--client-cert-allowed-hostname`), and the unverified server certificates of auto TLS (etcd
//! skips verification of self-signed peers the same way).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// The subject CN of a DER certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// Whether the certificate names `host` among its DNS or IP SANs (`*.` wildcards match one
/// label).
fn names_host(der: &[u8], host: &str) -> bool {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return false;
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    let ip: Option<std::net::IpAddr> = host.parse().ok();
    san.value.general_names.iter().any(|name| match name {
        GeneralName::DNSName(dns) => {
            dns.eq_ignore_ascii_case(host)
                || dns.strip_prefix("*.").is_some_and(|suffix| {
                    host.split_once('.')
                        .is_some_and(|(_, rest)| rest.eq_ignore_ascii_case(suffix))
                })
        }
        GeneralName::IPAddress(bytes) => ip.is_some_and(|ip| match ip {
            std::net::IpAddr::V4(v4) => *bytes == v4.octets(),
            std::net::IpAddr::V6(v6) => *bytes == v6.octets(),
        }),
        _ => false,
    })
}

/// A client verifier that also requires one of the allowed CNs or hostnames.
#[derive(Debug)]
pub struct AllowedNames {
    /// The chain verifier.
    pub inner: Arc<dyn ClientCertVerifier>,
    /// Allowed subject CNs (empty: any).
    pub cns: Vec<String>,
    /// Allowed SAN hostnames (empty: any).
    pub hostnames: Vec<String>,
}

impl ClientCertVerifier for AllowedNames {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if !self.cns.is_empty() {
            let cn = common_name(end_entity).unwrap_or_default();
            if !self.cns.contains(&cn) {
                return Err(rustls::Error::General(format!(
                    "client certificate CN {cn:?} is not allowed"
                )));
            }
        }
        if !self.hostnames.is_empty() && !self.hostnames.iter().any(|h| names_host(end_entity, h)) {
            return Err(rustls::Error::General(
                "client certificate names no allowed hostname".into(),
            ));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Accepts any server certificate (auto TLS: peers present self-signed certificates nobody can
/// verify), still checking the handshake's signatures.
#[derive(Debug)]
pub struct AnyServerCert(pub Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

    /// A CA, and a verifier requiring certificates it signed.
    fn ca() -> TestResult<(
        rcgen::Certificate,
        rcgen::KeyPair,
        Arc<dyn ClientCertVerifier>,
    )> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()?;
        Ok((cert, key, verifier))
    }

    fn issue(
        ca: &rcgen::Certificate,
        ca_key: &rcgen::KeyPair,
        cn: &str,
        sans: &[&str],
    ) -> TestResult<CertificateDer<'static>> {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(sans)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate()?;
        Ok(params.signed_by(&key, ca, ca_key)?.der().clone())
    }

    #[test]
    fn allowed_cns_and_hostnames_are_enforced() -> TestResult {
        let (ca_cert, ca_key, inner) = ca()?;
        let now = UnixTime::now();
        let by_cn = AllowedNames {
            inner: inner.clone(),
            cns: vec!["member-a".into()],
            hostnames: Vec::new(),
        };
        let a = issue(&ca_cert, &ca_key, "member-a", &["a.example"])?;
        let b = issue(&ca_cert, &ca_key, "member-b", &["b.example", "10.0.0.2"])?;
        assert!(by_cn.verify_client_cert(&a, &[], now).is_ok());
        assert!(by_cn.verify_client_cert(&b, &[], now).is_err());
        let by_host = AllowedNames {
            inner,
            cns: Vec::new(),
            hostnames: vec!["b.example".into()],
        };
        assert!(by_host.verify_client_cert(&b, &[], now).is_ok());
        assert!(by_host.verify_client_cert(&a, &[], now).is_err());
        assert!(names_host(&b, "10.0.0.2"));
        assert!(!names_host(&b, "10.0.0.3"));
        assert_eq!(common_name(&a).as_deref(), Some("member-a"));
        // Not signed by the CA: refused whatever its name.
        let (other, other_key, _) = ca()?;
        let stranger = issue(&other, &other_key, "member-a", &[])?;
        assert!(by_cn.verify_client_cert(&stranger, &[], now).is_err());
        Ok(())
    }
}
