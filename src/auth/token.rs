//! etcd's "simple" tokens: a random string naming a user on every member for a time-to-live
//! (`--auth-token-ttl`, default 300 s) that restarts whenever the token is used. The token is
//! chosen by the member that checked the password and replicated through Raft (the
//! `Authenticate` command), so a client may present it to any member. Tokens live in memory
//! only, as in etcd: a restarted member forgets them and its clients authenticate again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::Rng;

/// etcd's default `--auth-token-ttl`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// A new token's random part: 16 letters. The member that applies the login appends a dot and
/// the Raft index of its entry (etcd's shape; the index tells a member that has not applied
/// the login yet to wait for it).
pub fn new_prefix() -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut rng = rand::rng();
    (0..16)
        .map(|_| char::from(LETTERS[rng.random_range(0..LETTERS.len())]))
        .collect()
}

/// The live simple tokens of this member.
#[derive(Debug)]
pub struct SimpleTokens {
    ttl: Duration,
    tokens: Mutex<HashMap<String, (String, Instant)>>,
}

impl SimpleTokens {
    /// No tokens; each will live `ttl` after its last use.
    pub fn new(ttl: Duration) -> Self {
        SimpleTokens {
            ttl,
            tokens: Mutex::new(HashMap::new()),
        }
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Instant)>> {
        match self.tokens.lock() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Makes `token` name `user` from now on.
    pub fn assign(&self, token: &str, user: &str) {
        let mut tokens = self.tokens();
        let now = Instant::now();
        // Dropping expired tokens here keeps the table bounded by the logins of one TTL.
        tokens.retain(|_, (_, deadline)| *deadline > now);
        tokens.insert(token.to_string(), (user.to_string(), now + self.ttl));
    }

    /// The user `token` names, if it is live; its time-to-live restarts.
    pub fn user(&self, token: &str) -> Option<String> {
        let mut tokens = self.tokens();
        let now = Instant::now();
        let (user, deadline) = tokens.get_mut(token)?;
        if *deadline <= now {
            tokens.remove(token);
            return None;
        }
        *deadline = now + self.ttl;
        Some(user.clone())
    }

    /// Forgets every token of `user` (deleted, or its password changed).
    pub fn invalidate_user(&self, user: &str) {
        self.tokens().retain(|_, (u, _)| u != user);
    }

    /// Forgets every token (auth disabled).
    pub fn clear(&self) {
        self.tokens().clear();
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
    fn an_unused_token_expires() {
        let t = SimpleTokens::new(Duration::from_millis(0));
        t.assign("x.1", "alice");
        assert_eq!(t.user("x.1"), None);
    }
}
