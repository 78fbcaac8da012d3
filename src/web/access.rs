//! Who is let in: tokens (`--otlp-tokens` for the OTLP receivers, `--ui-tokens` for the UI
//! and API), and for the UI and API also the users an authenticating proxy at a
//! `--trusted-proxies` address names in its user header. A tokens file holds one token per line (blank lines and lines starting
//! with `#` are skipped), so tokens can be added and retired by editing it; it is re-read on
//! SIGHUP.
//!
//! Architecture invariant: a token is compared in constant time and never logged or
//! echoed; a file that cannot be read or holds no token stops start-up and, on SIGHUP,
//! keeps the tokens in force; the proxy's user header counts only on connections from a
//! trusted address (anyone else could send it).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use base64::Engine as _;
use subtle::ConstantTimeEq as _;

/// Why a tokens file was not taken.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("cannot read the tokens file {path}: {error}")]
    Unreadable { path: String, error: String },
    #[error("the tokens file {path} holds no token; write one token per line")]
    Empty { path: String },
}

/// The tokens in force, or none (no authentication).
pub struct Tokens {
    path: Option<PathBuf>,
    tokens: RwLock<Vec<Vec<u8>>>,
}

impl Tokens {
    /// No authentication: every request is let in.
    pub fn none() -> Tokens {
        Tokens {
            path: None,
            tokens: RwLock::new(Vec::new()),
        }
    }

    /// The tokens of `path`, or none when no file is given.
    pub fn load(path: Option<PathBuf>) -> Result<Tokens, TokensError> {
        let tokens = match &path {
            Some(path) => read(path)?,
            None => Vec::new(),
        };
        Ok(Tokens {
            path,
            tokens: RwLock::new(tokens),
        })
    }

    /// Whether requests must carry a token.
    pub fn required(&self) -> bool {
        self.path.is_some()
    }

    /// Re-reads the file; on a problem the tokens in force stay. Returns how many it holds.
    pub fn reload(&self) -> Result<usize, TokensError> {
        let Some(path) = &self.path else {
            return Ok(0);
        };
        let tokens = read(path)?;
        let count = tokens.len();
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = tokens;
        Ok(count)
    }

    /// Whether `token` is one of the tokens in force (always, when none is required).
    pub fn accepts(&self, token: &[u8]) -> bool {
        if !self.required() {
            return true;
        }
        let tokens = self.tokens.read().unwrap_or_else(|e| e.into_inner());
        // Every token is compared, so the time taken says nothing about which one matched.
        tokens
            .iter()
            .fold(false, |found, known| found | bool::from(known.ct_eq(token)))
    }

    /// Whether an `Authorization` header lets the request in: `Bearer TOKEN`, or with
    /// `basic`, HTTP basic authentication with the token as password (any user name), so a
    /// browser can log in.
    pub fn authorizes(&self, authorization: Option<&HeaderValue>, basic: bool) -> bool {
        if !self.required() {
            return true;
        }
        let Some(value) = authorization.map(HeaderValue::as_bytes) else {
            return false;
        };
        let Some(space) = value.iter().position(|b| *b == b' ') else {
            return false;
        };
        let (scheme, credentials) = (&value[..space], value[space + 1..].trim_ascii());
        if scheme.eq_ignore_ascii_case(b"bearer") {
            return self.accepts(credentials);
        }
        if basic && scheme.eq_ignore_ascii_case(b"basic") {
            let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(credentials) else {
                return false;
            };
            let Some(colon) = decoded.iter().position(|b| *b == b':') else {
                return false;
            };
            return self.accepts(&decoded[colon + 1..]);
        }
        false
    }
}

/// Who may use the UI and API.
pub struct UiAccess {
    pub tokens: Arc<Tokens>,
    proxies: Vec<ipnet::IpNet>,
    user_header: HeaderName,
}

/// How a request was let in.
#[derive(Debug, PartialEq, Eq)]
pub enum Admitted {
    /// Nothing is required.
    Open,
    /// It carried a token.
    Token,
    /// A trusted proxy vouched for this user.
    User(String),
}

impl UiAccess {
    pub fn new(
        tokens: Arc<Tokens>,
        proxies: Vec<ipnet::IpNet>,
        user_header: HeaderName,
    ) -> UiAccess {
        UiAccess {
            tokens,
            proxies,
            user_header,
        }
    }

    /// Anyone may use the UI.
    pub fn open() -> UiAccess {
        UiAccess::new(
            Arc::new(Tokens::none()),
            Vec::new(),
            HeaderName::from_static("x-forwarded-user"),
        )
    }

    /// Whether requests must carry a token or come through a trusted proxy.
    pub fn required(&self) -> bool {
        self.tokens.required() || !self.proxies.is_empty()
    }

    /// Whether tokens are one way in (so a refusal asks for one).
    pub fn takes_tokens(&self) -> bool {
        self.tokens.required()
    }

    /// How a request from `peer` with `headers` is let in, or `None` when it is not.
    pub fn admits(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<Admitted> {
        if !self.required() {
            return Some(Admitted::Open);
        }
        let trusted = peer.is_some_and(|peer| {
            let peer = peer.to_canonical();
            self.proxies.iter().any(|net| net.contains(&peer))
        });
        if trusted {
            let user = headers
                .get(&self.user_header)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|user| !user.is_empty());
            if let Some(user) = user {
                return Some(Admitted::User(user.to_string()));
            }
        }
        (self.tokens.required()
            && self
                .tokens
                .authorizes(headers.get(header::AUTHORIZATION), true))
        .then_some(Admitted::Token)
    }
}

fn read(path: &PathBuf) -> Result<Vec<Vec<u8>>, TokensError> {
    let text = std::fs::read_to_string(path).map_err(|error| TokensError::Unreadable {
        path: path.display().to_string(),
        error: error.to_string(),
    })?;
    // Editors on some systems start a UTF-8 file with a byte-order mark; it belongs to no
    // token (kept, it would silently disable the first one).
    let text = text.strip_prefix('\u{FEFF}').unwrap_or(&text);
    let tokens: Vec<Vec<u8>> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| line.as_bytes().to_vec())
        .collect();
    if tokens.is_empty() {
        return Err(TokensError::Empty {
            path: path.display().to_string(),
        });
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> (tempfile::TempDir, Tokens) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, text).unwrap();
        let tokens = Tokens::load(Some(path)).unwrap();
        (dir, tokens)
    }

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    #[test]
    fn bearer_and_basic_carry_a_token_of_the_file() {
        let (_dir, tokens) = tokens("# team a\nalpha-1\n\n  beta-2  \n");
        assert!(tokens.authorizes(Some(&header("Bearer alpha-1")), false));
        assert!(tokens.authorizes(Some(&header("bearer beta-2")), false));
        assert!(!tokens.authorizes(Some(&header("Bearer alpha")), false));
        assert!(!tokens.authorizes(Some(&header("Bearer # team a")), false));
        assert!(!tokens.authorizes(None, false));
        // user:beta-2
        let basic = header("Basic dXNlcjpiZXRhLTI=");
        assert!(tokens.authorizes(Some(&basic), true));
        assert!(
            !tokens.authorizes(Some(&basic), false),
            "OTLP takes bearer only"
        );
        assert!(!tokens.authorizes(Some(&header("Basic !!!")), true));
        assert!(
            !tokens.authorizes(Some(&header("Basic dXNlcg==")), true),
            "no colon"
        );
        assert!(!tokens.authorizes(Some(&header("Token alpha-1")), true));
    }

    /// Regression: a tokens file saved with a byte-order mark silently disabled its first
    /// token (the mark became part of it).
    #[test]
    fn a_byte_order_mark_is_not_part_of_the_first_token() {
        let (_dir, with_mark) = tokens("\u{FEFF}alpha-1\nbeta-2\n");
        assert!(with_mark.authorizes(Some(&header("Bearer alpha-1")), false));
        assert!(with_mark.authorizes(Some(&header("Bearer beta-2")), false));
        let (_dir, comment_first) = tokens("\u{FEFF}# ops\ngamma-3\n");
        assert!(comment_first.authorizes(Some(&header("Bearer gamma-3")), false));
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, header(value));
        }
        map
    }

    #[test]
    fn the_user_header_counts_only_from_a_trusted_proxy() {
        let proxies = vec!["10.0.0.0/24".parse().unwrap(), "::1/128".parse().unwrap()];
        let access = UiAccess::new(
            Arc::new(Tokens::none()),
            proxies,
            HeaderName::from_static("x-forwarded-user"),
        );
        let proxy: IpAddr = "10.0.0.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.9".parse().unwrap();
        let stranger: IpAddr = "10.0.1.7".parse().unwrap();
        let alice = headers(&[("x-forwarded-user", "alice")]);
        assert!(access.required() && !access.takes_tokens());
        assert_eq!(
            access.admits(Some(proxy), &alice),
            Some(Admitted::User("alice".into()))
        );
        assert_eq!(
            access.admits(Some(mapped), &alice),
            Some(Admitted::User("alice".into())),
            "an IPv4 peer on an IPv6 socket"
        );
        assert_eq!(access.admits(Some(stranger), &alice), None, "forged");
        assert_eq!(access.admits(None, &alice), None, "no peer known");
        assert_eq!(access.admits(Some(proxy), &HeaderMap::new()), None);
        assert_eq!(
            access.admits(Some(proxy), &headers(&[("x-forwarded-user", "  ")])),
            None
        );
    }

    #[test]
    fn tokens_and_a_proxy_are_both_ways_in() {
        let (_dir, tokens) = tokens("alpha\n");
        let access = UiAccess::new(
            Arc::new(tokens),
            vec!["127.0.0.1/32".parse().unwrap()],
            HeaderName::from_static("remote-user"),
        );
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "192.0.2.1".parse().unwrap();
        assert!(access.takes_tokens());
        assert_eq!(
            access.admits(Some(other), &headers(&[("authorization", "Bearer alpha")])),
            Some(Admitted::Token)
        );
        assert_eq!(
            access.admits(Some(loopback), &headers(&[("remote-user", "bob")])),
            Some(Admitted::User("bob".into()))
        );
        assert_eq!(
            access.admits(Some(loopback), &headers(&[("x-forwarded-user", "bob")])),
            None,
            "only the configured header"
        );
        assert_eq!(
            UiAccess::open().admits(None, &HeaderMap::new()),
            Some(Admitted::Open)
        );
    }

    #[test]
    fn no_file_lets_everyone_in_and_a_bad_file_keeps_the_tokens_in_force() {
        let open = Tokens::none();
        assert!(!open.required() && open.authorizes(None, true));
        let (dir, tokens) = tokens("alpha\n");
        let path = dir.path().join("tokens");
        std::fs::write(&path, "# nothing\n").unwrap();
        assert!(matches!(tokens.reload(), Err(TokensError::Empty { .. })));
        assert!(tokens.accepts(b"alpha"), "kept");
        std::fs::write(&path, "gamma\n").unwrap();
        assert_eq!(tokens.reload().unwrap(), 1);
        assert!(
            tokens.accepts(b"gamma") && !tokens.accepts(b"alpha"),
            "rotated"
        );
        std::fs::remove_file(&path).unwrap();
        let error = tokens.reload().unwrap_err().to_string();
        assert!(error.starts_with("cannot read the tokens file"), "{error}");
        assert!(
            Tokens::load(Some(dir.path().join("missing"))).is_err(),
            "start-up stops"
        );
    }
}
