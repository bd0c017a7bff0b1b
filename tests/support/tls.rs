//! Throw-away certificates for TLS tests, made with the `openssl` command line in a fresh
//! temporary directory that is removed on drop.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A certificate authority, a server certificate it signed for `localhost` and
/// `127.0.0.1`, and a client certificate it signed.
#[derive(Debug)]
pub struct TestPki {
    dir: PathBuf,
}

/// What a TLS-only test server needs: its files, whether it asks clients for certificates,
/// and what the harness trusts and presents to reach it.
#[derive(Debug, Clone)]
pub struct ServerTls {
    cert_file: PathBuf,
    key_file: PathBuf,
    ca_file: PathBuf,
    ca_pem: Vec<u8>,
    client_identity: (Vec<u8>, Vec<u8>),
    require_client_certificates: bool,
}

impl TestPki {
    /// Makes the certificates; panics (the test fails) when `openssl` is missing or fails.
    pub fn create() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "tower-redis-lock-pki-{}-{nanos}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).expect("create the certificate directory");
        let pki = Self { dir };
        pki.write("ca.cnf", CA_CONFIG);
        pki.write("server.ext", SERVER_EXTENSIONS);
        pki.write("client.ext", CLIENT_EXTENSIONS);
        pki.openssl(&[
            "req",
            "-x509",
            "-config",
            "ca.cnf",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-noenc",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
        ]);
        pki.sign("server", "localhost", "server.ext", 1);
        pki.sign("client", "tower-redis-lock test client", "client.ext", 2);
        pki
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.read("ca.crt")
    }

    /// The client certificate, PEM.
    pub fn client_cert_pem(&self) -> Vec<u8> {
        self.read("client.crt")
    }

    /// The client certificate's private key, PEM (PKCS#8).
    pub fn client_key_pem(&self) -> Vec<u8> {
        self.read("client.key")
    }

    /// The path of one of the PEM files (`ca.crt`, `client.crt`, `client.key`), for programs
    /// that read them from disk.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A TLS-only server with this CA's server certificate; with
    /// `require_client_certificates`, it refuses clients without one signed by this CA.
    pub fn server(&self, require_client_certificates: bool) -> ServerTls {
        ServerTls {
            cert_file: self.dir.join("server.crt"),
            key_file: self.dir.join("server.key"),
            ca_file: self.dir.join("ca.crt"),
            ca_pem: self.ca_pem(),
            client_identity: (self.client_cert_pem(), self.client_key_pem()),
            require_client_certificates,
        }
    }

    /// A key and a certificate for `name` signed by the CA, with the extensions of `ext`.
    fn sign(&self, name: &str, common_name: &str, ext: &str, serial: u32) {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        let subject = format!("/CN={common_name}");
        self.openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-noenc",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &subject,
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            &serial.to_string(),
            "-days",
            "2",
            "-extfile",
            ext,
            "-out",
            &crt,
        ]);
    }

    fn openssl(&self, args: &[&str]) {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|err| {
                panic!("cannot run openssl ({err}); run ./scripts/setup.sh to install it")
            });
        assert!(
            output.status.success(),
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.dir.join(name), text).expect("write a certificate file");
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(name)).expect("read a certificate file")
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl ServerTls {
    /// The redis-server arguments that make it listen for TLS only, on `port`.
    pub fn listen_args(&self, port: u16) -> Vec<String> {
        let path = |path: &PathBuf| path.display().to_string();
        let auth_clients = if self.require_client_certificates {
            "yes"
        } else {
            "no"
        };
        vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            path(&self.cert_file),
            "--tls-key-file".into(),
            path(&self.key_file),
            "--tls-ca-cert-file".into(),
            path(&self.ca_file),
            "--tls-auth-clients".into(),
            auth_clients.into(),
        ]
    }

    /// What the harness's own client trusts and presents.
    pub fn harness_certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: self.client_identity.0.clone(),
                client_key: self.client_identity.1.clone(),
            }),
            root_cert: Some(self.ca_pem.clone()),
        }
    }
}

const CA_CONFIG: &str = "\
[req]
distinguished_name = subject
x509_extensions = ca
prompt = no
[subject]
CN = tower-redis-lock test CA
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
";

const SERVER_EXTENSIONS: &str = "\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
authorityKeyIdentifier = keyid
";

const CLIENT_EXTENSIONS: &str = "\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
";
