//! Which Redis errors mean that Redis refused this client, rather than failed it: wrong
//! credentials, an ACL that forbids what the library does, or a TLS certificate one side does
//! not accept. Retrying cures none of these, so they get their own
//! [`ErrorKind::AccessDenied`](crate::ErrorKind::AccessDenied).

use std::error::Error as StdError;
use std::io;
use std::sync::Arc;

use redis::{ErrorKind as K, RedisError, ServerErrorKind as S};
use rustls::AlertDescription as Alert;

/// How Redis 6 and 7.0 start the message of a command that a script's user may not run, or a
/// key or channel it may not touch: the script fails with a plain `ERR`, not `NOPERM`.
const SCRIPT_ACL_DENIAL: &str = "The user executing the script can't";

/// The same refusal as Redis 7.2 and Valkey word it (`ACL failure in script: User … has no
/// permissions to …`).
const SCRIPT_ACL_FAILURE: &str = "ACL failure in script";

/// How Redis starts its answer to a command too long for a client that has not
/// authenticated (more than 10 arguments, as the library's scripts take), before it closes
/// the connection: a missing password shows up as this rather than `NOAUTH`.
const UNAUTHENTICATED_PROTOCOL_ERROR: &str = "Protocol error: unauthenticated";

/// Whether Redis refused this client's credentials or permissions.
pub(crate) fn access_denied(err: &RedisError) -> bool {
    match err.kind() {
        K::AuthenticationFailed | K::Server(S::NoPerm) => true,
        K::Server(S::ResponseError) => err.detail().is_some_and(|detail| {
            detail.contains(SCRIPT_ACL_DENIAL)
                || detail.contains(SCRIPT_ACL_FAILURE)
                || detail.starts_with(UNAUTHENTICATED_PROTOCOL_ERROR)
        }),
        // Codes redis-rs has no kind for: no AUTH sent to a server that wants one, or
        // credentials refused on a command rather than at connection set-up.
        K::Extension => matches!(err.code(), Some("NOAUTH" | "WRONGPASS")),
        K::Io => tls_error(err).is_some_and(certificate_refused),
        _ => false,
    }
}

/// The rustls error behind a failed TLS connection, when there is one.
fn tls_error(err: &RedisError) -> Option<&rustls::Error> {
    // redis-rs keeps the I/O error behind an `Arc`; tokio-rustls puts the rustls error inside.
    let shared = err
        .source()?
        .downcast_ref::<Arc<dyn StdError + Send + Sync>>()?;
    let io = (**shared).downcast_ref::<io::Error>()?;
    io.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Whether a TLS handshake failed on a certificate: the server's did not verify here, or the
/// server refused ours (or its absence).
fn certificate_refused(err: &rustls::Error) -> bool {
    match err {
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => true,
        rustls::Error::AlertReceived(alert) => matches!(
            alert,
            Alert::BadCertificate
                | Alert::UnsupportedCertificate
                | Alert::CertificateRevoked
                | Alert::CertificateExpired
                | Alert::CertificateUnknown
                | Alert::UnknownCA
                | Alert::AccessDenied
                | Alert::CertificateRequired
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::error_reply as reply;

    fn io_error(inner: rustls::Error) -> RedisError {
        io::Error::new(io::ErrorKind::InvalidData, inner).into()
    }

    #[test]
    fn refused_credentials_and_acl_denials_are_access_denied() {
        assert!(access_denied(&RedisError::from((
            K::AuthenticationFailed,
            "Password authentication failed"
        ))));
        assert!(access_denied(&reply("NOAUTH Authentication required.")));
        assert!(access_denied(&reply(
            "ERR Protocol error: unauthenticated multibulk length"
        )));
        assert!(access_denied(&reply(
            "WRONGPASS invalid username-password pair or user is disabled."
        )));
        assert!(access_denied(&reply(
            "NOPERM this user has no permissions to access one of the keys used as arguments"
        )));
        assert!(access_denied(&reply(
            "ERR The user executing the script can't publish to the channel mentioned in the \
             command script: 5f2a, on @user_script:1."
        )));
        assert!(access_denied(&reply(
            "ERR ACL failure in script: User locker has no permissions to run the 'hset' \
             command script: 5f2a, on @user_script:58."
        )));
    }

    #[test]
    fn other_failures_are_not_access_denied() {
        assert!(!access_denied(&reply(
            "ERR Error running script, on @user_script:1."
        )));
        assert!(!access_denied(&reply(
            "NOSCRIPT No matching script. Please use EVAL."
        )));
        assert!(!access_denied(&RedisError::from(io::Error::from(
            io::ErrorKind::ConnectionRefused
        ))));
        assert!(!access_denied(&io_error(rustls::Error::DecryptError)));
    }

    #[test]
    fn certificates_refused_in_the_handshake_are_access_denied() {
        assert!(access_denied(&io_error(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer
        ))));
        assert!(access_denied(&io_error(rustls::Error::AlertReceived(
            Alert::CertificateRequired
        ))));
    }
}
