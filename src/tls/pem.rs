//! Certificates, keys and revocation lists read from PEM files, with errors that name the flag
//! and the file.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// A TLS setup error, naming what was wrong.
pub type Error = String;

/// Every certificate in `path` (given by `flag`).
///
/// # Errors
/// When the file cannot be read or holds no certificate.
pub fn certs(flag: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{flag} {}: no certificate in the file",
            path.display()
        ));
    }
    Ok(certs)
}

/// The private key in `path` (given by `flag`).
///
/// # Errors
/// When the file cannot be read or holds no key.
pub fn key(flag: &str, path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

/// Every revocation list in `path` (given by `flag`).
///
/// # Errors
/// When the file cannot be read.
pub fn crls(flag: &str, path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, Error> {
    CertificateRevocationListDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{flag} {}: {e}", path.display()))
}

/// A certificate chain and its key, checked to belong together.
///
/// # Errors
/// When either file is unreadable, or the key does not match the certificate.
pub fn certified_key(
    (cert_flag, cert_path): (&str, &Path),
    (key_flag, key_path): (&str, &Path),
) -> Result<Arc<CertifiedKey>, Error> {
    let chain = certs(cert_flag, cert_path)?;
    let key = key(key_flag, key_path)?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("{key_flag} {}: {e}", key_path.display()))?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|_| {
        format!(
            "{key_flag} {} does not match the certificate in {cert_flag} {}",
            key_path.display(),
            cert_path.display()
        )
    })?;
    Ok(Arc::new(certified))
}

/// A root store of the CAs in `path` (given by `flag`).
///
/// # Errors
/// When the file is unreadable or a certificate in it is not a usable CA.
pub fn roots(flag: &str, path: &Path) -> Result<Arc<rustls::RootCertStore>, Error> {
    let mut store = rustls::RootCertStore::empty();
    for cert in certs(flag, path)? {
        store
            .add(cert)
            .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    }
    Ok(Arc::new(store))
}
