//! TLS settings for `rediss://` URLs: the certificate authorities to trust and the client's
//! own certificate, as PEM, checked when the client is built; and rustls's process-wide
//! crypto provider, which redis-rs needs.

use std::fmt;
use std::sync::Once;

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::error::{ErrorKind, LockError, Result};

/// The PEM the builder was given. Never printed: a private key may be among it.
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    root_certificates: Option<Vec<u8>>,
    /// The certificate chain and its private key.
    client_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsSettings {
    /// Trusts the certificates of `pem` instead of the system's trust store.
    pub(crate) fn trust(&mut self, pem: Vec<u8>) {
        self.root_certificates = Some(pem);
    }

    /// Presents `chain` (with its private `key`) to servers that ask for a client certificate.
    pub(crate) fn identify(&mut self, chain: Vec<u8>, key: Vec<u8>) {
        self.client_identity = Some((chain, key));
    }

    pub(crate) fn is_set(&self) -> bool {
        self.root_certificates.is_some() || self.client_identity.is_some()
    }

    /// The certificates for redis-rs, or `None` to use its defaults (the system's trust store,
    /// no client certificate).
    ///
    /// redis-rs reads PEM without a single certificate as an empty trust store, which would
    /// fail every connection later with a misleading error; so that is refused here.
    pub(crate) fn certificates(&self) -> Result<Option<TlsCertificates>> {
        if !self.is_set() {
            return Ok(None);
        }
        if let Some(pem) = &self.root_certificates {
            require_certificates(pem, "the TLS root certificate PEM")?;
        }
        if let Some((chain, _)) = &self.client_identity {
            require_certificates(chain, "the TLS client certificate PEM")?;
        }
        Ok(Some(TlsCertificates {
            client_tls: self
                .client_identity
                .clone()
                .map(|(client_cert, client_key)| ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: self.root_certificates.clone(),
        }))
    }
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let given = |set: bool| if set { "<given>" } else { "<none>" };
        f.debug_struct("TlsSettings")
            .field(
                "root_certificates",
                &given(self.root_certificates.is_some()),
            )
            .field("client_identity", &given(self.client_identity.is_some()))
            .finish()
    }
}

fn require_certificates(pem: &[u8], what: &str) -> Result<()> {
    let mut found = 0;
    for certificate in CertificateDer::pem_slice_iter(pem) {
        certificate.map_err(|err| {
            LockError::with_source(
                ErrorKind::InvalidConfig,
                format!("{what} is unreadable"),
                err,
            )
        })?;
        found += 1;
    }
    if found == 0 {
        return Err(LockError::new(
            ErrorKind::InvalidConfig,
            format!("{what} holds no certificate"),
        ));
    }
    Ok(())
}

/// Installs ring as rustls's process-wide crypto provider unless one is installed already.
///
/// redis-rs builds its TLS configurations from the process default, and rustls cannot pick
/// one by itself when the process links more than one provider. A provider the application
/// installed first is kept.
pub(crate) fn ensure_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Fails only if another thread installed one in between; theirs is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_without_a_certificate_is_invalid_config() {
        let mut settings = TlsSettings::default();
        settings.trust(b"not a certificate".to_vec());
        let Err(err) = settings.certificates() else {
            panic!("refused");
        };
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);

        let mut settings = TlsSettings::default();
        settings.trust(b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n".to_vec());
        let Err(err) = settings.certificates() else {
            panic!("refused");
        };
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    }

    #[test]
    fn no_settings_leave_redis_defaults() {
        assert!(TlsSettings::default().certificates().unwrap().is_none());
    }

    #[test]
    fn debug_never_prints_the_pem() {
        let mut settings = TlsSettings::default();
        settings.identify(b"chain".to_vec(), b"SECRET KEY".to_vec());
        let printed = format!("{settings:?}");
        assert!(!printed.contains("SECRET"), "{printed}");
        assert!(printed.contains("<given>"), "{printed}");
    }
}
