//! Where the client reaches Redis: the URL with its credentials, and the TLS settings for a
//! `rediss://` one. Both the command pool and the pub/sub connection are made from the one
//! redis-rs client built here, so both authenticate and verify the server the same way.

use std::borrow::Cow;
use std::fmt;

use redis::ConnectionAddr;

use crate::error::{ErrorKind, LockError, Result};
use crate::wire::tls::{TlsSettings, ensure_crypto_provider};

#[derive(Clone)]
pub(crate) struct Endpoint {
    url: String,
    pub(crate) tls: TlsSettings,
}

impl Endpoint {
    pub(crate) fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            tls: TlsSettings::default(),
        }
    }

    /// The redis-rs client for this endpoint.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for an unparsable URL, unusable certificates,
    /// certificates given for a URL without TLS, or a TLS URL that turns certificate checks
    /// off.
    pub(crate) fn client(&self) -> Result<redis::Client> {
        let client = redis::Client::open(self.url.as_str()).map_err(|err| {
            LockError::with_source(ErrorKind::InvalidConfig, "invalid redis url", err)
        })?;
        let insecure = match client.get_connection_info().addr() {
            ConnectionAddr::TcpTls { insecure, .. } => *insecure,
            _ => {
                if self.tls.is_set() {
                    return Err(LockError::new(
                        ErrorKind::InvalidConfig,
                        "TLS certificates were given for a URL without TLS: use rediss://",
                    ));
                }
                return Ok(client);
            }
        };
        if insecure {
            // Refused by redis-rs too, but only at the first connection.
            return Err(LockError::new(
                ErrorKind::InvalidConfig,
                "certificate checks cannot be turned off (#insecure)",
            ));
        }
        ensure_crypto_provider();
        let Some(certificates) = self.tls.certificates()? else {
            return Ok(client);
        };
        redis::Client::build_with_tls(client.get_connection_info().clone(), certificates).map_err(
            |err| {
                LockError::with_source(ErrorKind::InvalidConfig, "unusable TLS certificates", err)
            },
        )
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &without_password(&self.url))
            .field("tls", &self.tls)
            .finish()
    }
}

/// `url` with its password (in the user info, or a `pass` query parameter of a Unix socket
/// URL) replaced by `***`, for logs.
fn without_password(url: &str) -> Cow<'_, str> {
    let mut printable = Cow::Borrowed(url);
    if let Some(scheme_end) = url.find("://") {
        let authority_start = scheme_end + 3;
        let authority_end = url[authority_start..]
            .find(['/', '?', '#'])
            .map_or(url.len(), |end| authority_start + end);
        let authority = &url[authority_start..authority_end];
        if let Some(at) = authority.rfind('@')
            && let Some(colon) = authority[..at].find(':')
        {
            let password = authority_start + colon + 1..authority_start + at;
            printable.to_mut().replace_range(password, "***");
        }
    }
    if let Some(query_start) = printable.find('?') {
        let query = &printable[query_start + 1..];
        let redacted = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some(("pass", _)) => "pass=***",
                _ => pair,
            })
            .collect::<Vec<_>>()
            .join("&");
        if redacted != query {
            printable
                .to_mut()
                .replace_range(query_start + 1.., &redacted);
        }
    }
    printable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            without_password("redis://locker:s3cret@host:6380/2"),
            "redis://locker:***@host:6380/2"
        );
        assert_eq!(
            without_password("rediss://:s3cret@host"),
            "rediss://:***@host"
        );
        assert_eq!(
            without_password("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(without_password("redis://host:6379"), "redis://host:6379");
        assert_eq!(without_password("redis://user@host"), "redis://user@host");
        let endpoint = Endpoint::new("redis://u:s3cret@host");
        assert!(!format!("{endpoint:?}").contains("s3cret"));
    }

    #[test]
    fn certificates_need_a_tls_url() {
        let mut endpoint = Endpoint::new("redis://127.0.0.1:1");
        endpoint.tls.trust(b"whatever".to_vec());
        assert_eq!(
            endpoint.client().unwrap_err().kind(),
            ErrorKind::InvalidConfig
        );
    }

    #[test]
    fn certificate_checks_cannot_be_turned_off() {
        let err = Endpoint::new("rediss://127.0.0.1:1/#insecure")
            .client()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        assert!(err.to_string().contains("#insecure"), "{err}");
    }

    #[test]
    fn bad_pem_is_invalid_config() {
        let mut endpoint = Endpoint::new("rediss://127.0.0.1:1");
        endpoint.tls.trust(b"not a certificate".to_vec());
        assert_eq!(
            endpoint.client().unwrap_err().kind(),
            ErrorKind::InvalidConfig
        );
    }

    #[test]
    fn a_tls_url_without_certificates_uses_the_system_roots() {
        assert!(Endpoint::new("rediss://127.0.0.1:1").client().is_ok());
    }
}
