//! A certificate and key re-read when their files change on disk (rotation without a restart,
//! as etcd re-reads them for every handshake). A change that cannot be loaded (say, the new
//! certificate is written but its key not yet) is logged and the previous pair stays in use.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::sign::CertifiedKey;

/// What identifies a file's version: its modification time and length.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &PathBuf) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// A certificate chain and key from two files, reloaded when either changes.
#[derive(Debug)]
pub struct ReloadingKey {
    cert: (&'static str, PathBuf),
    key: (&'static str, PathBuf),
    current: Mutex<(Stamp, Stamp, Arc<CertifiedKey>)>,
}

impl ReloadingKey {
    /// Loads the pair (flags name the files in errors).
    ///
    /// # Errors
    /// When the files cannot be loaded now.
    pub fn load(
        cert: (&'static str, PathBuf),
        key: (&'static str, PathBuf),
    ) -> Result<Self, super::pem::Error> {
        let (c, k) = (stamp(&cert.1), stamp(&key.1));
        let loaded = super::pem::certified_key((cert.0, &cert.1), (key.0, &key.1))?;
        Ok(ReloadingKey {
            cert,
            key,
            current: Mutex::new((c, k, loaded)),
        })
    }

    /// The pair to present now, reloaded first if a file changed.
    pub fn get(&self) -> Arc<CertifiedKey> {
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let (c, k) = (stamp(&self.cert.1), stamp(&self.key.1));
        if (c, k) != (cur.0, cur.1) {
            match super::pem::certified_key((self.cert.0, &self.cert.1), (self.key.0, &self.key.1))
            {
                Ok(loaded) => {
                    tracing::info!(cert = %self.cert.1.display(), "TLS certificate reloaded");
                    *cur = (c, k, loaded);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "TLS certificate changed but cannot be loaded; keeping the previous one");
                    // Not retried until a file changes again.
                    cur.0 = c;
                    cur.1 = k;
                }
            }
        }
        cur.2.clone()
    }
}

impl rustls::server::ResolvesServerCert for ReloadingKey {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

impl rustls::client::ResolvesClientCert for ReloadingKey {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
