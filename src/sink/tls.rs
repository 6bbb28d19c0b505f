//! TLS for `wss://` PVP servers: rustls with the system's trust roots, plus `--ca-file` for a
//! private CA (a test server's self-signed certificate, an internal PKI).

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// Builds the client configuration once, at startup, so a bad CA file is a clear error then
/// rather than a failed connection later.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("--ca-file {}: {e}", path.display()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--ca-file {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "--ca-file {}: no PEM certificates in it",
                path.display()
            ));
        }
        for c in certs {
            roots
                .add(c)
                .map_err(|e| format!("--ca-file {}: {e}", path.display()))?;
        }
    }
    if roots.is_empty() {
        return Err("no TLS trust roots: the system has none and no --ca-file was given".into());
    }
    tracing::debug!(system_roots = added, "TLS trust roots loaded");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
