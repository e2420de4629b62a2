//! Password hashes: bcrypt (etcd's choice, `--bcrypt-cost`, default 10), computed and checked
//! on tokio's blocking pool: a hash takes tens of milliseconds on purpose and must not stall
//! the async runtime. Passwords are never logged; only their hashes are stored or replicated.

/// etcd's default `--bcrypt-cost`.
pub const DEFAULT_COST: u32 = 10;

/// The smallest and largest costs bcrypt accepts (etcd's range too).
pub const COST_RANGE: std::ops::RangeInclusive<u32> = 4..=31;

/// Hashes `password` with `cost`; `None` if hashing failed (a cost outside [`COST_RANGE`], or
/// the blocking pool is gone).
pub async fn hash(password: String, cost: u32) -> Option<String> {
    tokio::task::spawn_blocking(move || bcrypt::hash(password.as_bytes(), cost).ok())
        .await
        .ok()
        .flatten()
}

/// Whether `password` matches `hash` (false for a malformed hash).
pub async fn verify(password: String, hash: String) -> bool {
    tokio::task::spawn_blocking(move || bcrypt::verify(password.as_bytes(), &hash).unwrap_or(false))
        .await
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hash_verifies_its_password_only() {
        let Some(h) = hash("s3cret".into(), 4).await else {
            panic!("hashing failed");
        };
        assert!(h.starts_with("$2"));
        assert!(!h.contains("s3cret"));
        assert!(verify("s3cret".into(), h.clone()).await);
        assert!(!verify("secret".into(), h).await);
        assert!(!verify("x".into(), "not a hash".into()).await);
    }

    #[tokio::test]
    async fn etcd_go_hashes_verify() {
        // golang.org/x/crypto/bcrypt writes `$2a$`: what an etcd snapshot carries.
        let Some(h) = hash("pw".into(), 4).await else {
            panic!("hashing failed");
        };
        let go_style = h.replacen("$2b$", "$2a$", 1);
        assert!(verify("pw".into(), go_style).await);
    }
}
