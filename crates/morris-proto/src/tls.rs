//! TLS under the handshake (`--tls`): encryption and integrity of every byte
//! of a connection, with rustls (TLS 1.3 only, ring's primitives).
//!
//! Who a peer is stays the business of the key handshake
//! ([`crate::auth::handshake`]), which then runs *inside* the TLS session
//! and covers the session's exported keying material (RFC 5705/8446
//! exporters): both proofs are valid on this session only. So certificates
//! carry no trust: a server makes a throw-away self-signed one when it
//! first needs it, and a client accepts any certificate whose holder signs
//! the TLS handshake with it. A man in the middle that ends TLS on both
//! sides has two sessions with two different bindings, and cannot relay
//! the proofs. Without the key, a client learns nothing: the key proofs
//! come before any request.

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};

/// The first byte of a TLS connection (a handshake record); a plain
/// morris connection starts with a length whose first byte is 0.
pub const TLS_FIRST_BYTE: u8 = 0x16;

/// The label of the keying material the key handshake covers.
const EXPORTER_LABEL: &[u8] = b"EXPORTER-morris-key-handshake-v1";

/// The name a client asks for (certificates are not checked against it).
pub const SERVER_NAME: &str = "morris";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any certificate; checks that the peer signs the handshake with
/// it (see the module docs for why that is enough here).
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The client side's configuration (made once per process).
pub fn client_config() -> Result<Arc<ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let p = provider();
            let cfg = ClientConfig::builder_with_provider(p.clone())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(|e| format!("TLS client configuration: {e}"))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(p)))
                .with_no_client_auth();
            Ok(Arc::new(cfg))
        })
        .clone()
}

/// The server side's configuration, with a self-signed certificate made the
/// first time it is needed (once per process).
pub fn server_config() -> Result<Arc<ServerConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<ServerConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let made = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
                .map_err(|e| format!("making a TLS certificate: {e}"))?;
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.key_pair.serialize_der()));
            let cfg = ServerConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(|e| format!("TLS server configuration: {e}"))?
                .with_no_client_auth()
                .with_single_cert(vec![made.cert.der().clone()], key)
                .map_err(|e| format!("TLS server configuration: {e}"))?;
            Ok(Arc::new(cfg))
        })
        .clone()
}

/// The keying material of a session that the key handshake covers.
pub fn binding<D>(conn: &rustls::ConnectionCommon<D>) -> Result<[u8; 32], String> {
    conn.export_keying_material([0u8; 32], EXPORTER_LABEL, None)
        .map_err(|e| format!("TLS exporter: {e}"))
}
