//! etcd's "simple" tokens: a random string naming a user on every member for a time-to-live
//! (`--auth-token-ttl`, default 300 s) that restarts whenever the token is used. The token is
//! chosen by the member that checked the password and replicated through Raft (the
//! `Authenticate` command), so a client may present it to any member. Tokens live in memory
//! only, as in etcd: a restarted member forgets them and its clients authenticate again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use rand::Rng;

/// etcd's default `--auth-token-ttl`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// A new token's random part: 16 letters. The token is it, a dot and the Raft index of the
/// login's entry (etcd's shape; the index tells a member that has not applied the login yet to
/// wait for it). Members keep tokens under [`stored_key`].
pub fn new_prefix() -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut rng = rand::rng();
    (0..16)
        .map(|_| char::from(LETTERS[rng.random_range(0..LETTERS.len())]))
        .collect()
}

/// What the Raft log carries for a token's random part: its SHA-256, hex. The log (and the peer
/// traffic) thus never holds a usable token; only the member that made it returns it.
pub fn digest(prefix: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(prefix.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The key a presented token is kept under: its random part's digest, a dot, its index.
pub fn stored_key(token: &str) -> Option<String> {
    let (prefix, index) = token.split_once('.')?;
    Some(format!("{}.{index}", digest(prefix)))
}

/// The live simple tokens of this member. Looking a token up (every request) takes a shared
/// lock only; its deadline moves on atomically.
#[derive(Debug)]
pub struct SimpleTokens {
    ttl: Duration,
    /// Deadlines are milliseconds after this.
    origin: Instant,
    tokens: RwLock<HashMap<String, (String, AtomicU64)>>,
}

impl SimpleTokens {
    /// No tokens; each will live `ttl` after its last use.
    pub fn new(ttl: Duration) -> Self {
        SimpleTokens {
            ttl,
            origin: Instant::now(),
            tokens: RwLock::new(HashMap::new()),
        }
    }

    fn deadline(&self) -> u64 {
        let ms = self.origin.elapsed().saturating_add(self.ttl).as_millis();
        u64::try_from(ms).unwrap_or(u64::MAX)
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, (String, AtomicU64)>> {
        match self.tokens.write() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Makes `token` name `user` from now on.
    pub fn assign(&self, token: &str, user: &str) {
        let now = self.now();
        let mut tokens = self.write();
        // Dropping expired tokens here keeps the table bounded by the logins of one TTL.
        tokens.retain(|_, (_, deadline)| deadline.load(Ordering::Relaxed) > now);
        tokens.insert(
            token.to_string(),
            (user.to_string(), AtomicU64::new(self.deadline())),
        );
    }

    /// The user `token` names, if it is live; its time-to-live restarts.
    pub fn user(&self, token: &str) -> Option<String> {
        let now = self.now();
        let tokens = match self.tokens.read() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (user, deadline) = tokens.get(token)?;
        if deadline.load(Ordering::Relaxed) <= now {
            return None;
        }
        deadline.fetch_max(self.deadline(), Ordering::Relaxed);
        Some(user.clone())
    }

    /// Forgets every token of `user` (deleted, or its password changed).
    pub fn invalidate_user(&self, user: &str) {
        self.write().retain(|_, (u, _)| u != user);
    }

    /// Forgets every token (auth disabled).
    pub fn clear(&self) {
        self.write().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_user_until_invalidated() {
        let t = SimpleTokens::new(DEFAULT_TTL);
        let a = format!("{}.7", new_prefix());
        assert!(a.len() == 18 && a[..16].chars().all(|c| c.is_ascii_alphabetic()));
        assert_ne!(new_prefix(), new_prefix());
        t.assign(&a, "alice");
        t.assign("b.8", "bob");
        assert_eq!(t.user(&a).as_deref(), Some("alice"));
        assert_eq!(t.user("nope"), None);
        t.invalidate_user("alice");
        assert_eq!(t.user(&a), None);
        assert_eq!(t.user("b.8").as_deref(), Some("bob"));
        t.clear();
        assert_eq!(t.user("b.8"), None);
    }

    #[test]
    fn a_token_is_kept_under_its_digest() {
        let token = format!("{}.42", new_prefix());
        let key = stored_key(&token).unwrap_or_default();
        assert!(key.ends_with(".42") && key.len() == 64 + 3);
        assert!(!key.contains(&token[..16]));
        assert_eq!(stored_key("no-dot"), None);
    }

    #[test]
    fn an_unused_token_expires() {
        let t = SimpleTokens::new(Duration::from_millis(0));
        t.assign("x.1", "alice");
        assert_eq!(t.user("x.1"), None);
    }
}
