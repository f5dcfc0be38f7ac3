//! TLS plumbing shared by the RESP client and the HTTP clients.
//!
//! picket uses one rustls stack with the ring provider (it builds with only
//! a C compiler). reqwest is built without a default provider, so the
//! provider must be installed once per process before any client is built.

use std::sync::Once;

static INSTALL: Once = Once::new();

/// Install ring as the process-wide rustls crypto provider (idempotent).
pub fn install_crypto_provider() {
    INSTALL.call_once(|| {
        // Another library may have installed one already; either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
