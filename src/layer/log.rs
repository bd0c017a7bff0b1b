//! What the layer logs beyond each request's span, kept to a size an operator can read: a
//! rejection or an unlocked run logs one line per kind and second, whose `unlogged` field
//! counts the lines of that kind left out since the last one, and a keyless request logs a
//! warning once per route. Keys are cut to 64 bytes, four at most.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use http::Request;
use tokio::time::Instant;

use super::reject::Rejection;
use crate::keys::{display_name, display_names};
use crate::rejection_kind::RejectionKind;

/// Shortest time between two log lines of one kind.
const EVERY: Duration = Duration::from_secs(1);

/// Most routes remembered for the keyless-request warning; a layer that sees more distinct
/// keyless paths (paths with ids in them, scanners) stops warning rather than grow.
const MAX_KEYLESS_ROUTES: usize = 64;

/// Shared by every service of one layer.
#[derive(Debug, Default)]
pub(crate) struct LayerLog {
    /// Per kind of line: when it was last logged, and how many were not logged since.
    windows: Mutex<HashMap<&'static str, Window>>,
    /// The routes a keyless request was seen on.
    keyless_routes: Mutex<HashSet<String>>,
}

#[derive(Debug, Default)]
struct Window {
    logged_at: Option<Instant>,
    unlogged: u64,
}

impl LayerLog {
    /// Counts one line of `kind`; returns how many went unlogged before it when it is to be
    /// logged now, `None` when it is not.
    fn due(&self, kind: &'static str) -> Option<u64> {
        let mut windows = self.windows.lock().expect("layer log");
        let window = windows.entry(kind).or_default();
        let now = Instant::now();
        if window
            .logged_at
            .is_some_and(|logged| now.duration_since(logged) < EVERY)
        {
            window.unlogged += 1;
            return None;
        }
        window.logged_at = Some(now);
        Some(std::mem::take(&mut window.unlogged))
    }

    /// A request a layer answered itself: INFO, WARN for a lease lost (while the handler
    /// ran, or before it started or its response was stored), or ERROR for instances that
    /// disagree on a limit (an operator must fix a configuration; no retry will).
    pub(crate) fn rejected(&self, rejection: &Rejection) {
        let kind = rejection.kind();
        let Some(unlogged) = self.due(kind.as_str()) else {
            return;
        };
        let keys = display_names(rejection.keys());
        let detail = rejection.detail();
        if kind == RejectionKind::LeaseLost {
            tracing::warn!(%keys, detail, unlogged, "lock lease lost; the request was answered as such");
        } else if kind == RejectionKind::PermitsMismatch {
            tracing::error!(
                %keys,
                detail,
                unlogged,
                "instances disagree on the layer's limit for a key; give every instance the \
                 same LockLayer::limit, or a new key_prefix for a new limit"
            );
        } else {
            tracing::info!(kind = kind.as_str(), %keys, detail, unlogged, "request rejected");
        }
    }

    /// A request run without its locks because Redis could not be reached.
    pub(crate) fn failed_open(&self, names: &[String], error: &dyn std::fmt::Display) {
        let Some(unlogged) = self.due("failed_open") else {
            return;
        };
        tracing::warn!(
            keys = %display_names(names),
            error = %error,
            unlogged,
            "redis unavailable, running the request unlocked (OnRedisUnavailable::FailOpen)"
        );
    }

    /// A request the extractor found no key in, run unlocked by default: warns once per
    /// route (axum's matched route when there is one, else the path).
    pub(crate) fn keyless<B>(&self, request: &Request<B>) {
        let route = route_of(request);
        {
            let mut routes = self.keyless_routes.lock().expect("layer log");
            if routes.len() >= MAX_KEYLESS_ROUTES || !routes.insert(route.to_owned()) {
                return;
            }
        }
        tracing::warn!(
            method = %request.method(),
            route = %display_name(route),
            "the key extractor found no lock key in a request, so it runs unlocked \
             (OnMissingKey::PassThrough; logged once per route). If requests here must be \
             locked, the extractor does not match what this layer sees (see the layer's docs on \
             nest and route_layer, or use PathParamKey); to run them unlocked without this \
             warning, choose .on_missing_key(OnMissingKey::PassThrough)"
        );
    }
}

/// The route of `request`: the one axum matched, else its path.
fn route_of<B>(request: &Request<B>) -> &str {
    #[cfg(feature = "axum")]
    if let Some(matched) = request.extensions().get::<::axum::extract::MatchedPath>() {
        return matched.as_str();
    }
    request.uri().path()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_kind_and_second_with_the_count_of_the_others() {
        let log = LayerLog::default();
        assert_eq!(log.due("timeout"), Some(0));
        assert_eq!(log.due("timeout"), None);
        assert_eq!(log.due("timeout"), None);
        // Another kind has its own window.
        assert_eq!(log.due("invalid_key"), Some(0));
        tokio::time::advance(EVERY).await;
        assert_eq!(log.due("timeout"), Some(2));
        assert_eq!(log.due("timeout"), None);
    }
}
