//! TLS for client and peer traffic through rustls, configured by etcd's flags: certificates
//! and keys (re-read when their files change), trusted CAs, client certificate authentication
//! with revocation lists and allowed CNs or hostnames, self-signed certificates (auto TLS),
//! cipher suites and protocol versions. `server.rs` serves `https://` listeners with
//! [`Side::server_config`]; `transport.rs` dials `https://` peers with
//! [`Side::client_config`].

pub mod accept;
mod auto;
mod pem;
mod reload;
mod verify;

use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{RootCertStore, SupportedProtocolVersion};

pub use accept::TlsConnectInfo;
pub use verify::common_name;

use crate::config::{split_urls, Config};

/// One side's TLS: what the client URLs or the peer URLs serve and (peers) dial with.
#[derive(Debug)]
pub struct Side {
    /// The certificate served.
    key: Arc<reload::ReloadingKey>,
    /// The certificate presented when dialing (peers), if not the served one.
    dial_key: Option<Arc<reload::ReloadingKey>>,
    /// CAs that sign the other side's certificates.
    roots: Option<Arc<RootCertStore>>,
    crls: Vec<rustls::pki_types::CertificateRevocationListDer<'static>>,
    client_cert_auth: bool,
    allowed_cns: Vec<String>,
    allowed_hostnames: Vec<String>,
    /// Self-signed: the other side's certificates are not verified when dialing.
    auto: bool,
    provider: Arc<CryptoProvider>,
    versions: Vec<&'static SupportedProtocolVersion>,
}

/// The flag names of one side.
struct Flags {
    cert: &'static str,
    key: &'static str,
    ca: &'static str,
    crl: &'static str,
}

impl Side {
    /// The client side's TLS from `cfg`, if a certificate or `--auto-tls` is given.
    ///
    /// # Errors
    /// A missing or unreadable file, a key that does not match, bad versions or suites, or an
    /// `https://` client URL without a certificate (each names its flag).
    pub fn client(cfg: &Config) -> Result<Option<Arc<Side>>, String> {
        // As etcd, the version and suite flags are checked whether or not TLS is in use.
        versions(&cfg.tls_min_version, &cfg.tls_max_version)?;
        provider(&cfg.cipher_suites)?;
        let https = urls_https(&cfg.listen_client_urls)
            || urls_https(&cfg.listen_client_http_urls)
            || urls_https(&cfg.listen_metrics_urls);
        let flags = Flags {
            cert: "--cert-file",
            key: "--key-file",
            ca: "--trusted-ca-file",
            crl: "--client-crl-file",
        };
        let side = Side::build(
            cfg,
            &flags,
            (&cfg.cert_file, &cfg.key_file),
            None,
            (&cfg.trusted_ca_file, &cfg.client_crl_file),
            cfg.auto_tls.then(|| {
                (
                    cfg.data_dir().join("fixtures/client"),
                    &cfg.listen_client_urls,
                )
            }),
        )?;
        if https && side.is_none() {
            return Err(format!(
                "TLS key/cert (--cert-file, --key-file) must be provided for client url {} with HTTPS scheme",
                first_https(&cfg.listen_client_urls, &cfg.listen_metrics_urls)
            ));
        }
        Ok(side.map(|mut s| {
            s.client_cert_auth = cfg.client_cert_auth;
            s.allowed_hostnames = split_urls(&cfg.client_cert_allowed_hostname);
            Arc::new(s)
        }))
    }

    /// The peer side's TLS from `cfg`, if a certificate or `--peer-auto-tls` is given.
    ///
    /// # Errors
    /// As [`Side::client`], for the peer flags.
    pub fn peer(cfg: &Config) -> Result<Option<Arc<Side>>, String> {
        let flags = Flags {
            cert: "--peer-cert-file",
            key: "--peer-key-file",
            ca: "--peer-trusted-ca-file",
            crl: "--peer-crl-file",
        };
        let dial = (!cfg.peer_client_cert_file.is_empty()).then_some((
            cfg.peer_client_cert_file.as_str(),
            cfg.peer_client_key_file.as_str(),
        ));
        let side = Side::build(
            cfg,
            &flags,
            (&cfg.peer_cert_file, &cfg.peer_key_file),
            dial,
            (&cfg.peer_trusted_ca_file, &cfg.peer_crl_file),
            cfg.peer_auto_tls
                .then(|| (cfg.data_dir().join("fixtures/peer"), &cfg.listen_peer_urls)),
        )?;
        if side.is_none() && urls_https(&cfg.listen_peer_urls) {
            return Err(format!(
                "TLS key/cert (--peer-cert-file, --peer-key-file) must be provided for peer url {} with HTTPS scheme",
                first_https(&cfg.listen_peer_urls, "")
            ));
        }
        let cns = split_urls(&cfg.peer_cert_allowed_cn);
        let hostnames = split_urls(&cfg.peer_cert_allowed_hostname);
        if !cns.is_empty() && !hostnames.is_empty() {
            return Err(
                "cannot have both --peer-cert-allowed-cn and --peer-cert-allowed-hostname".into(),
            );
        }
        Ok(side.map(|mut s| {
            s.client_cert_auth = cfg.peer_client_cert_auth;
            s.allowed_cns = cns;
            s.allowed_hostnames = hostnames;
            Arc::new(s)
        }))
    }

    fn build(
        cfg: &Config,
        flags: &Flags,
        (cert, key): (&str, &str),
        dial: Option<(&str, &str)>,
        (ca, crl): (&str, &str),
        auto: Option<(PathBuf, &String)>,
    ) -> Result<Option<Side>, String> {
        let given = !cert.is_empty() || !key.is_empty();
        if given && (cert.is_empty() || key.is_empty()) {
            return Err(format!(
                "both {} and {} must be given",
                flags.cert, flags.key
            ));
        }
        let (cert_path, key_path, auto) = match (given, auto) {
            (true, auto) => {
                if auto.is_some() {
                    tracing::warn!(
                        "ignoring auto TLS: {} and {} are given",
                        flags.cert,
                        flags.key
                    );
                }
                (PathBuf::from(cert), PathBuf::from(key), false)
            }
            (false, Some((dir, urls))) => {
                let (c, k) = auto::self_signed(&dir, &hosts(urls), cfg.self_signed_cert_validity)?;
                (c, k, true)
            }
            (false, None) => return Ok(None),
        };
        let served = reload::ReloadingKey::load((flags.cert, cert_path), (flags.key, key_path))?;
        let dial_key = match dial {
            Some((c, k)) => Some(Arc::new(reload::ReloadingKey::load(
                ("--peer-client-cert-file", PathBuf::from(c)),
                ("--peer-client-key-file", PathBuf::from(k)),
            )?)),
            None => None,
        };
        let roots = if ca.is_empty() {
            None
        } else {
            Some(pem::roots(flags.ca, std::path::Path::new(ca))?)
        };
        let crls = if crl.is_empty() {
            Vec::new()
        } else {
            pem::crls(flags.crl, std::path::Path::new(crl))?
        };
        Ok(Some(Side {
            key: Arc::new(served),
            dial_key,
            roots,
            crls,
            client_cert_auth: false,
            allowed_cns: Vec::new(),
            allowed_hostnames: Vec::new(),
            auto,
            provider: Arc::new(provider(&cfg.cipher_suites)?),
            versions: versions(&cfg.tls_min_version, &cfg.tls_max_version)?,
        }))
    }

    /// The server configuration of this side's listeners: HTTP/2 and HTTP/1.1 by ALPN, client
    /// certificates required and verified when client certificate auth is on.
    ///
    /// # Errors
    /// When client certificate auth is on without a trusted CA, or the CA cannot verify.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, String> {
        let builder = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&self.versions)
            .map_err(|e| e.to_string())?;
        let builder = if self.client_cert_auth {
            let roots = match (&self.roots, self.auto) {
                (Some(r), _) => r.clone(),
                // Auto TLS: peers present self-signed certificates; require one, as etcd does,
                // but only its own can be verified.
                (None, true) => Arc::new(self_roots(&self.key)?),
                (None, false) => {
                    return Err("client certificate auth needs a trusted CA file".into());
                }
            };
            let inner = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots,
                self.provider.clone(),
            )
            .with_crls(self.crls.clone())
            .build()
            .map_err(|e| e.to_string())?;
            builder.with_client_cert_verifier(Arc::new(verify::AllowedNames {
                inner,
                cns: self.allowed_cns.clone(),
                hostnames: self.allowed_hostnames.clone(),
            }))
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_cert_resolver(self.key.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The client configuration for dialing peers: their certificates verified against the
    /// trusted CA (not at all with auto TLS and no CA, as etcd), this member's certificate
    /// presented.
    ///
    /// # Errors
    /// When neither a CA nor auto TLS lets peers be verified.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let builder = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&self.versions)
            .map_err(|e| e.to_string())?;
        let builder = match &self.roots {
            Some(roots) => {
                let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    roots.clone(),
                    self.provider.clone(),
                )
                .with_crls(self.crls.clone())
                .build()
                .map_err(|e| e.to_string())?;
                builder.with_webpki_verifier(verifier)
            }
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verify::AnyServerCert(
                    self.provider.clone(),
                ))),
        };
        let key = self.dial_key.clone().unwrap_or_else(|| self.key.clone());
        let mut config = builder.with_client_cert_resolver(key);
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A client configuration for `https://` endpoints (load generators, tools, tests): servers
/// verified against the CAs in `ca`, or not at all when `None` (as `etcdctl
/// --insecure-skip-tls-verify`; handshake signatures are still checked); the certificate and key
/// `cert` presented if given.
///
/// # Errors
/// An unreadable file or a key that does not match its certificate.
pub fn client_config(
    ca: Option<&std::path::Path>,
    cert: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match ca {
        Some(ca) => builder.with_root_certificates(pem::roots("CA", ca)?),
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verify::AnyServerCert(provider))),
    };
    let mut config = match cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(pem::certs("cert", cert)?, pem::key("key", key)?)
            .map_err(|e| e.to_string())?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A root store trusting the certificate `key` serves (auto TLS).
fn self_roots(key: &reload::ReloadingKey) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in &key.get().cert {
        roots.add(cert.clone()).map_err(|e| e.to_string())?;
    }
    Ok(roots)
}

fn urls_https(urls: &str) -> bool {
    split_urls(urls).iter().any(|u| is_https(u))
}

fn first_https(a: &str, b: &str) -> String {
    split_urls(a)
        .into_iter()
        .chain(split_urls(b))
        .find(|u| is_https(u))
        .unwrap_or_default()
}

/// Whether a listen or peer URL asks for TLS.
pub fn is_https(url: &str) -> bool {
    url.starts_with("https://") || url.starts_with("unixs://")
}

/// The hosts of `urls`, for a self-signed certificate.
fn hosts(urls: &str) -> Vec<String> {
    split_urls(urls)
        .iter()
        .filter_map(|u| {
            let rest = u.split_once("://").map_or(u.as_str(), |(_, r)| r);
            let host = rest.rsplit_once(':').map_or(rest, |(h, _)| h);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            (!host.is_empty()).then(|| host.to_string())
        })
        .collect()
}

/// rustls's ring provider with the cipher suites `--cipher-suites` names (Go's names; empty:
/// every suite). TLS 1.3 suites are always on (Go does not let them be configured either).
fn provider(names: &str) -> Result<CryptoProvider, String> {
    let mut provider = rustls::crypto::ring::default_provider();
    let names = split_urls(names);
    if names.is_empty() {
        return Ok(provider);
    }
    let all = provider.cipher_suites.clone();
    let mut chosen: Vec<rustls::SupportedCipherSuite> = all
        .iter()
        .filter(|s| matches!(s, rustls::SupportedCipherSuite::Tls13(_)))
        .copied()
        .collect();
    for name in &names {
        let found = all.iter().find(|s| {
            let own = format!("{:?}", s.suite());
            own == *name || own == format!("{name}_SHA256")
        });
        match found {
            Some(s) if !chosen.contains(s) => chosen.push(*s),
            Some(_) => {}
            None => return Err(format!("unexpected TLS cipher suite {name:?}")),
        }
    }
    provider.cipher_suites = chosen;
    Ok(provider)
}

/// The protocol versions between `--tls-min-version` and `--tls-max-version`.
fn versions(min: &str, max: &str) -> Result<Vec<&'static SupportedProtocolVersion>, String> {
    let rank = |v: &str, default: u8| match v {
        "" => Ok(default),
        "TLS1.2" => Ok(2),
        "TLS1.3" => Ok(3),
        other => Err(format!(
            "unexpected TLS version {other:?} (must be one of: TLS1.2, TLS1.3)"
        )),
    };
    let (lo, hi) = (rank(min, 2)?, rank(max, 3)?);
    if lo > hi {
        return Err(format!(
            "min version ({min}) is greater than max version ({max})"
        ));
    }
    let mut out = Vec::new();
    if lo <= 2 && hi >= 2 {
        out.push(&rustls::version::TLS12);
    }
    if hi >= 3 {
        out.push(&rustls::version::TLS13);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_suites_read_as_etcd() {
        assert_eq!(versions("TLS1.2", "").map(|v| v.len()), Ok(2));
        assert_eq!(versions("TLS1.3", "").map(|v| v.len()), Ok(1));
        assert!(versions("TLS1.3", "TLS1.2").is_err());
        assert!(versions("SSL3", "").is_err());
        let p =
            provider("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305");
        assert!(p.is_ok_and(|p| p.cipher_suites.len() == 5));
        assert!(provider("TLS_RSA_WITH_RC4_128_SHA").is_err());
        assert_eq!(
            hosts("https://127.0.0.1:2379,https://[::1]:2379,http://node-a:1"),
            ["127.0.0.1", "::1", "node-a"]
        );
    }
}
