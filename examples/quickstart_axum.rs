//! The README's axum quick start: invoices written one at a time per tenant, across every
//! instance of the service.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 ADDR=127.0.0.1:3000 cargo run --example quickstart_axum
//! curl -X POST http://127.0.0.1:3000/tenants/acme/invoices
//! ```

use axum::Router;
use axum::routing::{get, post};
use tower_redis_lock::layer::PathParamKey;
use tower_redis_lock::{LockClient, LockContext, LockLayer};

/// Runs alone for its tenant across every instance. Hand the fencing token to what you
/// write, so it can refuse a stale holder.
async fn create_invoice(lock: LockContext) -> String {
    format!("written with fencing token {}\n", lock.fencing_token())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let locks = LockClient::connect(&redis).await?;
    let app = Router::new()
        .route("/tenants/{tenant}/invoices", post(create_invoice))
        .layer(LockLayer::new(locks.clone(), PathParamKey::new("tenant")))
        // Added after the layer, so not behind it: never locked.
        .route("/health", get(|| async { "ok\n" }));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);
    // On SIGTERM: take no new request, let those under way finish, then give back anything
    // still held. Killed without this, each lock it held stays taken for its lease (30 s).
    axum::serve(listener, app)
        .with_graceful_shutdown(termination())
        .await?;
    locks.shutdown().await;
    Ok(())
}

/// Resolves on Ctrl-C, or on the SIGTERM an orchestrator sends before it kills a process.
async fn termination() {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = sigterm.recv() => {}
    }
}
