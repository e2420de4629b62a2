//! ES512 signatures (ECDSA on P-521 with SHA-512) for etcd's JWT tokens. `jsonwebtoken` signs
//! through ring, which has no P-521, so this one method goes through RustCrypto's `p521`, used
//! only here. Signatures are JOSE's: `r || s`, 66 bytes each.

use p521::ecdsa::signature::{Signer, Verifier};
use p521::ecdsa::{Signature, SigningKey, VerifyingKey};
use p521::pkcs8::{DecodePrivateKey, DecodePublicKey};
use p521::{PublicKey, SecretKey};

/// A P-521 key pair, or a public key alone (a verify-only member).
pub struct Es512 {
    signing: Option<SigningKey>,
    verifying: VerifyingKey,
}

/// Reads a private key in PEM: SEC 1 (`EC PRIVATE KEY`, what `openssl ecparam -genkey` writes)
/// or PKCS #8 (`PRIVATE KEY`), as etcd's JWT library accepts.
fn private_key(pem: &[u8]) -> Result<SecretKey, String> {
    let text = std::str::from_utf8(pem).map_err(|_| "private key: not PEM text".to_string())?;
    SecretKey::from_sec1_pem(text)
        .or_else(|_| SecretKey::from_pkcs8_pem(text))
        .map_err(|e| format!("private key: not a P-521 key in PEM: {e}"))
}

/// Reads a public key in PEM (`PUBLIC KEY`, SubjectPublicKeyInfo).
fn public_key(pem: &[u8]) -> Result<PublicKey, String> {
    let text = std::str::from_utf8(pem).map_err(|_| "public key: not PEM text".to_string())?;
    PublicKey::from_public_key_pem(text)
        .map_err(|e| format!("public key: not a P-521 key in PEM: {e}"))
}

impl Es512 {
    /// Loads the keys from their PEM files' contents. The public key is required, as etcd
    /// requires it; a private key must belong to it.
    ///
    /// # Errors
    /// A key that is not P-521 in PEM, or a private key of another public key.
    pub fn from_pem(private: Option<&[u8]>, public: &[u8]) -> Result<Self, String> {
        let verifying = VerifyingKey::from_affine(*public_key(public)?.as_affine())
            .map_err(|e| format!("public key: {e}"))?;
        let signing = match private {
            Some(pem) => {
                let key = SigningKey::from_bytes(&private_key(pem)?.to_bytes())
                    .map_err(|e| format!("private key: {e}"))?;
                let own = VerifyingKey::from(&key).to_encoded_point(false);
                if own != verifying.to_encoded_point(false) {
                    return Err("the private key does not match the public key".into());
                }
                Some(key)
            }
            None => None,
        };
        Ok(Es512 { signing, verifying })
    }

    /// Whether this member can sign.
    pub fn signs(&self) -> bool {
        self.signing.is_some()
    }

    /// The signature of `input` (`r || s`); `None` on a verify-only member.
    pub fn sign(&self, input: &[u8]) -> Option<Vec<u8>> {
        let key = self.signing.as_ref()?;
        let signature: Signature = key.try_sign(input).ok()?;
        Some(signature.to_bytes().to_vec())
    }

    /// Whether `signature` (`r || s`) signs `input`.
    pub fn verify(&self, input: &[u8], signature: &[u8]) -> bool {
        Signature::from_slice(signature).is_ok_and(|s| self.verifying.verify(input, &s).is_ok())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A P-521 key pair made with `openssl ecparam -name secp521r1 -genkey -noout` (SEC 1)
    /// and `openssl ec -pubout`.
    pub const PRIVATE: &str = "-----BEGIN EC PRIVATE KEY-----
MIHcAgEBBEIBbMSkFEV6/ltdH1XAmDU2nXJZSc3o/RKCzpcdSg0JE6Wg3PF27qt4
CFJbfGoXOB7wlUf8gv8KN6NlQ4eJ6ov9aS2gBwYFK4EEACOhgYkDgYYABAB7YlpJ
cUCR6lx9aKG/CGOvyfQ2q+bhOKf17Y2gsjkU03HMZFLB/Zl98HuDWNXTMxxcqYlX
3wrBgD0z/tEZfU+DZwC+we94vp+4j+0N3P8qlAeP3krDiXhAUuBuJxrK5Q7OJCwv
wzkm7ZcGGbhkkx7C5cD2cX7cXUWe5bTM8sQM0LNrfA==
-----END EC PRIVATE KEY-----
";

    /// The public half of [`PRIVATE`].
    pub const PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MIGbMBAGByqGSM49AgEGBSuBBAAjA4GGAAQAe2JaSXFAkepcfWihvwhjr8n0Nqvm
4Tin9e2NoLI5FNNxzGRSwf2ZffB7g1jV0zMcXKmJV98KwYA9M/7RGX1Pg2cAvsHv
eL6fuI/tDdz/KpQHj95Kw4l4QFLgbicayuUOziQsL8M5Ju2XBhm4ZJMewuXA9nF+
3F1FnuW0zPLEDNCza3w=
-----END PUBLIC KEY-----
";

    #[test]
    fn signs_and_verifies_and_refuses_a_changed_message() -> Result<(), String> {
        let keys = Es512::from_pem(Some(PRIVATE.as_bytes()), PUBLIC.as_bytes())?;
        let sig = keys.sign(b"header.claims").ok_or("no signature")?;
        assert_eq!(sig.len(), 132, "r || s, 66 bytes each");
        assert!(keys.verify(b"header.claims", &sig));
        assert!(!keys.verify(b"header.claimz", &sig));
        assert!(!keys.verify(b"header.claims", &sig[..131]));
        let verify_only = Es512::from_pem(None, PUBLIC.as_bytes())?;
        assert!(!verify_only.signs() && verify_only.sign(b"x").is_none());
        assert!(verify_only.verify(b"header.claims", &sig));
        Ok(())
    }

    #[test]
    fn refuses_other_curves_and_mismatched_keys() -> Result<(), Box<dyn std::error::Error>> {
        let p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        assert!(Es512::from_pem(None, p256.public_key_pem().as_bytes()).is_err());
        assert!(Es512::from_pem(Some(p256.serialize_pem().as_bytes()), PUBLIC.as_bytes()).is_err());
        let other = SigningKey::random(&mut p521::elliptic_curve::rand_core::OsRng);
        let other_pem = SecretKey::from_bytes(&other.to_bytes())?.to_sec1_pem(Default::default())?;
        assert!(Es512::from_pem(Some(other_pem.as_bytes()), PUBLIC.as_bytes()).is_err());
        Ok(())
    }
}
