//! Names of the previous release, kept as deprecated aliases so that code written against it
//! still builds, with a warning that names the new one (see the CHANGELOG).

use std::time::Duration;

use crate::client::{
    DEFAULT_LOCAL_HANDOVER_LIMIT, DEFAULT_LOCAL_HANDOVER_WINDOW, LockClientBuilder,
};
use crate::engine::config::MAX_LOCAL_HANDOVER_LIMIT;
use crate::keys::LockKeys;

/// Renamed [`DEFAULT_LOCAL_HANDOVER_LIMIT`].
#[deprecated(since = "0.1.0", note = "renamed DEFAULT_LOCAL_HANDOVER_LIMIT")]
pub const DEFAULT_LOCAL_HANDOFF_LIMIT: u32 = DEFAULT_LOCAL_HANDOVER_LIMIT;

/// Renamed [`DEFAULT_LOCAL_HANDOVER_WINDOW`].
#[deprecated(since = "0.1.0", note = "renamed DEFAULT_LOCAL_HANDOVER_WINDOW")]
pub const DEFAULT_LOCAL_HANDOFF_WINDOW: Duration = DEFAULT_LOCAL_HANDOVER_WINDOW;

/// Renamed [`MAX_LOCAL_HANDOVER_LIMIT`].
#[deprecated(since = "0.1.0", note = "renamed MAX_LOCAL_HANDOVER_LIMIT")]
pub const MAX_LOCAL_HANDOFF_LIMIT: u32 = MAX_LOCAL_HANDOVER_LIMIT;

impl LockClientBuilder {
    /// Renamed [`LockClientBuilder::local_handover_limit`].
    #[deprecated(since = "0.1.0", note = "renamed local_handover_limit")]
    pub fn local_handoff_limit(self, limit: u32) -> Self {
        self.local_handover_limit(limit)
    }

    /// Renamed [`LockClientBuilder::local_handover_window`].
    #[deprecated(since = "0.1.0", note = "renamed local_handover_window")]
    pub fn local_handoff_window(self, window: Duration) -> Self {
        self.local_handover_window(window)
    }
}

impl LockKeys {
    /// Renamed [`LockKeys::last_grant`], the scripts' name for it.
    #[deprecated(since = "0.1.0", note = "renamed last_grant")]
    pub fn fence(&self) -> &str {
        self.last_grant()
    }

    /// Renamed [`LockKeys::waiter_terms`], the scripts' name for it.
    #[deprecated(since = "0.1.0", note = "renamed waiter_terms")]
    pub fn waiters(&self) -> &str {
        self.waiter_terms()
    }
}
