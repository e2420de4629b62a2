//! etcd's JWT tokens (`--auth-token jwt,pub-key=...,priv-key=...,sign-method=...,ttl=...`):
//! signed claims `{username, revision, exp}` that every member holding the public key verifies
//! on its own, so a token signed by one member is accepted by all. The `jsonwebtoken` crate is
//! used only here; ES512, which it cannot sign, is framed here and signed by `es512.rs`.
//!
//! As in etcd, a JWT is never revoked: it names the auth revision of its login, and once the
//! auth store changes every permission check fails with `revision of auth store is old` (the
//! client logs in again).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::es512::Es512;

/// etcd's default JWT lifetime.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// The claims etcd signs.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    username: String,
    revision: u64,
    exp: u64,
}

/// A member's JWT signer and verifier.
pub struct Jwt {
    keys: Keys,
    ttl: Duration,
}

/// The keys of one signing method.
enum Keys {
    /// Every method but ES512, through `jsonwebtoken`.
    Jose {
        algorithm: Algorithm,
        /// `None`: a verify-only member (public key only).
        signing: Option<EncodingKey>,
        verifying: DecodingKey,
    },
    /// ES512 (P-521), framed here (boxed: P-521 keys are large).
    Es512(Box<Es512>),
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (method, signs) = match &self.keys {
            Keys::Jose {
                algorithm, signing, ..
            } => (format!("{algorithm:?}"), signing.is_some()),
            Keys::Es512(keys) => ("ES512".to_string(), keys.signs()),
        };
        f.debug_struct("Jwt")
            .field("method", &method)
            .field("signs", &signs)
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// The JOSE header of an ES512 token, as etcd's JWT library writes it.
#[derive(Serialize, Deserialize)]
struct Es512Header {
    alg: String,
    #[serde(default)]
    typ: String,
}

/// Why `--auth-token` was refused (etcd's start-up errors).
#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    /// A malformed option list, an unknown key or a missing `sign-method`.
    #[error("auth: invalid auth options: {0}")]
    Options(String),
    /// A signing method etcd does not know.
    #[error("auth: invalid auth signature method: {0}")]
    Method(String),
    /// A key file that cannot be read or parsed.
    #[error("auth: {0}")]
    Key(String),
}

/// The `jsonwebtoken` algorithm of a signing method; `None` for ES512.
fn algorithm(name: &str) -> Result<Option<Algorithm>, JwtError> {
    Ok(Some(match name {
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "HS256" => Algorithm::HS256,
        "HS384" => Algorithm::HS384,
        "HS512" => Algorithm::HS512,
        "EdDSA" => Algorithm::EdDSA,
        "ES512" => return Ok(None),
        other => return Err(JwtError::Method(other.to_string())),
    }))
}

fn now() -> Option<Duration> {
    SystemTime::now().duration_since(UNIX_EPOCH).ok()
}

fn read(path: &str) -> Result<Vec<u8>, JwtError> {
    std::fs::read(path).map_err(|e| JwtError::Key(format!("reading {path}: {e}")))
}

fn keys(
    alg: Algorithm,
    private: Option<&[u8]>,
    public: Option<&[u8]>,
) -> Result<(Option<EncodingKey>, DecodingKey), JwtError> {
    let bad = |e: jsonwebtoken::errors::Error| JwtError::Key(e.to_string());
    use Algorithm::*;
    match alg {
        HS256 | HS384 | HS512 => {
            // etcd: the priv-key file's bytes are the shared secret.
            let secret = private.ok_or_else(|| JwtError::Key("missing key data".into()))?;
            Ok((
                Some(EncodingKey::from_secret(secret)),
                DecodingKey::from_secret(secret),
            ))
        }
        _ => {
            let signing = match private {
                Some(pem) => Some(match alg {
                    ES256 | ES384 => EncodingKey::from_ec_pem(pem).map_err(bad)?,
                    EdDSA => EncodingKey::from_ed_pem(pem).map_err(bad)?,
                    _ => EncodingKey::from_rsa_pem(pem).map_err(bad)?,
                }),
                None => None,
            };
            let public = public.ok_or_else(|| JwtError::Key("missing key data".into()))?;
            let verifying = match alg {
                ES256 | ES384 => DecodingKey::from_ec_pem(public).map_err(bad)?,
                EdDSA => DecodingKey::from_ed_pem(public).map_err(bad)?,
                _ => DecodingKey::from_rsa_pem(public).map_err(bad)?,
            };
            Ok((signing, verifying))
        }
    }
}

impl Jwt {
    /// Parses the options after `jwt,` (`pub-key=`, `priv-key=`, `sign-method=`, `ttl=`, as
    /// etcd's) and loads the keys.
    ///
    /// # Errors
    /// [`JwtError`], with etcd's wording.
    pub fn from_options(options: &str) -> Result<Self, JwtError> {
        let mut map = std::collections::BTreeMap::new();
        for pair in options.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| JwtError::Options(pair.to_string()))?;
            if map.insert(k, v).is_some() {
                return Err(JwtError::Options(format!("{k} given twice")));
            }
        }
        for k in map.keys() {
            if !["pub-key", "priv-key", "sign-method", "ttl"].contains(k) {
                tracing::warn!(option = *k, "unknown token specific option");
            }
        }
        let method = map
            .get("sign-method")
            .ok_or_else(|| JwtError::Options("sign-method is required".into()))?;
        let alg = algorithm(method)?;
        let ttl = match map.get("ttl") {
            Some(t) => crate::config::parse_duration(t).map_err(JwtError::Options)?,
            None => DEFAULT_TTL,
        };
        let private = map.get("priv-key").map(|p| read(p)).transpose()?;
        let public = map.get("pub-key").map(|p| read(p)).transpose()?;
        let keys = match alg {
            Some(algorithm) => {
                let (signing, verifying) = keys(algorithm, private.as_deref(), public.as_deref())?;
                Keys::Jose {
                    algorithm,
                    signing,
                    verifying,
                }
            }
            None => {
                let public = public.ok_or_else(|| JwtError::Key("missing key data".into()))?;
                Keys::Es512(Box::new(
                    Es512::from_pem(private.as_deref(), &public).map_err(JwtError::Key)?,
                ))
            }
        };
        Ok(Jwt { keys, ttl })
    }

    /// A signed token for `username` at auth `revision`; `None` on a verify-only member.
    pub fn sign(&self, username: &str, revision: u64) -> Option<String> {
        let claims = Claims {
            username: username.to_string(),
            revision,
            exp: now()?.saturating_add(self.ttl).as_secs(),
        };
        match &self.keys {
            Keys::Jose {
                algorithm, signing, ..
            } => jsonwebtoken::encode(&Header::new(*algorithm), &claims, signing.as_ref()?).ok(),
            Keys::Es512(keys) => {
                let header = Es512Header {
                    alg: "ES512".into(),
                    typ: "JWT".into(),
                };
                let mut token = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).ok()?);
                token.push('.');
                token.push_str(&URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).ok()?));
                let signature = keys.sign(token.as_bytes())?;
                token.push('.');
                token.push_str(&URL_SAFE_NO_PAD.encode(signature));
                Some(token)
            }
        }
    }

    /// The user and auth revision a valid, unexpired token names.
    pub fn verify(&self, token: &str) -> Option<(String, u64)> {
        let claims = match &self.keys {
            Keys::Jose {
                algorithm,
                verifying,
                ..
            } => {
                let mut validation = Validation::new(*algorithm);
                validation.leeway = 0;
                validation.set_required_spec_claims(&["exp"]);
                jsonwebtoken::decode::<Claims>(token, verifying, &validation)
                    .ok()?
                    .claims
            }
            Keys::Es512(keys) => verify_es512(keys, token)?,
        };
        Some((claims.username, claims.revision))
    }
}

/// The claims of an ES512 token whose header names ES512, whose signature is valid and which
/// has not expired (no leeway, as the other methods are checked).
fn verify_es512(keys: &Es512, token: &str) -> Option<Claims> {
    let mut parts = token.split('.');
    let (header, claims, signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let head: Es512Header = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).ok()?).ok()?;
    let signed = &token[..header.len() + 1 + claims.len()];
    if head.alg != "ES512"
        || !keys.verify(signed.as_bytes(), &URL_SAFE_NO_PAD.decode(signature).ok()?)
    {
        return None;
    }
    let claims: Claims = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).ok()?).ok()?;
    (claims.exp >= now()?.as_secs()).then_some(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a key pair's PEM files into `dir`; returns their paths (private, public).
    fn pem_files(
        dir: &std::path::Path,
        private_pem: &str,
        public_pem: &str,
    ) -> std::io::Result<(String, String)> {
        let (private, public) = (dir.join("priv.pem"), dir.join("pub.pem"));
        std::fs::write(&private, private_pem)?;
        std::fs::write(&public, public_pem)?;
        Ok((private.display().to_string(), public.display().to_string()))
    }

    /// The ES512 test key pair's files in `dir`.
    fn es512_files(dir: &std::path::Path) -> std::io::Result<(String, String)> {
        use crate::auth::es512::tests::{PRIVATE, PUBLIC};
        pem_files(dir, PRIVATE, PUBLIC)
    }

    #[test]
    fn a_token_signed_by_one_member_verifies_on_another() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let (private, public) = pem_files(dir.path(), &key.serialize_pem(), &key.public_key_pem())?;
        let signer = Jwt::from_options(&format!(
            "pub-key={public},priv-key={private},sign-method=ES256"
        ))?;
        let verify_only = Jwt::from_options(&format!("pub-key={public},sign-method=ES256,ttl=1m"))?;
        let token = signer.sign("alice", 7).ok_or("no token")?;
        assert_eq!(verify_only.verify(&token), Some(("alice".into(), 7)));
        assert_eq!(verify_only.sign("alice", 7), None, "verify-only");
        let mut forged = token.clone();
        forged.push('x');
        assert_eq!(verify_only.verify(&forged), None);
        assert_eq!(verify_only.verify("not.a.jwt"), None);
        Ok(())
    }

    #[test]
    fn hmac_uses_the_key_files_bytes_and_bad_options_are_refused(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"s3cret")?;
        let s = secret.display();
        let hs = Jwt::from_options(&format!("priv-key={s},sign-method=HS256"))?;
        let token = hs.sign("bob", 1).ok_or("no token")?;
        assert_eq!(hs.verify(&token), Some(("bob".into(), 1)));
        let other = Jwt::from_options(&format!("priv-key={s},sign-method=HS384"))?;
        assert_eq!(other.verify(&token), None, "another method");
        assert!(matches!(
            Jwt::from_options("sign-method=XX256"),
            Err(JwtError::Method(_))
        ));
        assert!(matches!(
            Jwt::from_options(&format!("priv-key={s}")),
            Err(JwtError::Options(_))
        ));
        assert!(matches!(
            Jwt::from_options("pub-key=/nonexistent,sign-method=RS256"),
            Err(JwtError::Key(_))
        ));
        Ok(())
    }

    #[test]
    fn es512_tokens_sign_and_verify_like_the_other_methods(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (private, public) = es512_files(dir.path())?;
        let signer = Jwt::from_options(&format!(
            "pub-key={public},priv-key={private},sign-method=ES512"
        ))?;
        let verify_only = Jwt::from_options(&format!("pub-key={public},sign-method=ES512"))?;
        let token = signer.sign("alice", 7).ok_or("no token")?;
        assert_eq!(verify_only.verify(&token), Some(("alice".into(), 7)));
        assert_eq!(verify_only.sign("alice", 7), None, "verify-only");
        let (head, _) = token.split_once('.').ok_or("no header")?;
        assert_eq!(
            URL_SAFE_NO_PAD.decode(head)?,
            br#"{"alg":"ES512","typ":"JWT"}"#,
            "etcd's header"
        );
        let mut forged = token.clone();
        forged.insert(head.len() + 3, 'x');
        assert_eq!(verify_only.verify(&forged), None);
        assert_eq!(verify_only.verify(&format!("{token}.x")), None);
        assert_eq!(verify_only.verify("not.a.jwt"), None);
        // Another implementation's token (Python's `cryptography`, r || s): exp 2100-01-01.
        let foreign = "eyJhbGciOiJFUzUxMiIsInR5cCI6IkpXVCJ9.eyJleHAiOjQxMDI0NDQ4MDAsInJldmlzaW9uIjozLCJ1c2VybmFtZSI6ImNhcm9sIn0.AVUt3P2G5pWRH6kcNN0DEwxC-2Zb7L808kLPpKaLxxCHadCWk6GDAuLRVmsijdOIcCmNT28gOQyUdTa_rTRSO9_YAHt0H9HBzvyJ3I_LeVAxsEn_4xb1pwG2WeflZ6mcaWLFWCzK4bSIhXRbz2w0dUW1WyUI18aopxy-RCMR3VB5-3gS";
        assert_eq!(verify_only.verify(foreign), Some(("carol".into(), 3)));
        // The same claims under another method's header are refused.
        let hs = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS512","typ":"JWT"}"#);
        let relabelled = format!("{hs}{}", &foreign[foreign.find('.').ok_or("no dot")?..]);
        assert_eq!(verify_only.verify(&relabelled), None);
        // A key of another curve is refused at start.
        let p256 = dir.path().join("p256.pub");
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        std::fs::write(&p256, key.public_key_pem())?;
        assert!(matches!(
            Jwt::from_options(&format!("pub-key={},sign-method=ES512", p256.display())),
            Err(JwtError::Key(_))
        ));
        Ok(())
    }

    #[test]
    fn an_expired_es512_token_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (private, public) = es512_files(dir.path())?;
        let jwt = Jwt::from_options(&format!(
            "pub-key={public},priv-key={private},sign-method=ES512,ttl=0s"
        ))?;
        let token = jwt.sign("bob", 1).ok_or("no token")?;
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(jwt.verify(&token), None);
        Ok(())
    }

    #[test]
    fn an_expired_token_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"k")?;
        let s = secret.display();
        let jwt = Jwt::from_options(&format!("priv-key={s},sign-method=HS256,ttl=0s"))?;
        let token = jwt.sign("bob", 1).ok_or("no token")?;
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(jwt.verify(&token), None);
        Ok(())
    }
}
