//! `--auto-tls` and `--peer-auto-tls`: a self-signed certificate for this member's hosts,
//! generated once into the data dir (`fixtures/client` or `fixtures/peer`, as etcd does) and
//! reused on restart.

use std::path::{Path, PathBuf};

/// The certificate and key files in `dir`, generated first if missing: valid `years` years, for
/// `hosts` (DNS names or IP addresses) and `localhost`.
///
/// # Errors
/// When the certificate cannot be generated or written.
pub fn self_signed(dir: &Path, hosts: &[String], years: u64) -> Result<(PathBuf, PathBuf), String> {
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    if cert_path.exists() && key_path.exists() {
        return Ok((cert_path, key_path));
    }
    let mut names: Vec<String> = hosts.to_vec();
    names.push("localhost".into());
    names.sort();
    names.dedup();
    let fail = |e: &dyn std::fmt::Display| format!("generating a self-signed certificate: {e}");
    let mut params = rcgen::CertificateParams::new(names).map_err(|e| fail(&e))?;
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "concord");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "concord");
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(365 * i64::try_from(years.max(1)).unwrap_or(1));
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = rcgen::KeyPair::generate().map_err(|e| fail(&e))?;
    let cert = params.self_signed(&key).map_err(|e| fail(&e))?;
    std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
    write_private(&key_path, key.serialize_pem().as_bytes()).map_err(|e| fail(&e))?;
    std::fs::write(&cert_path, cert.pem()).map_err(|e| fail(&e))?;
    tracing::info!(cert = %cert_path.display(), "generated a self-signed certificate");
    Ok((cert_path, key_path))
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}
