//! The credentials a cluster client's nodes take, which a `MIGRATE` from one node to another
//! must carry (`wire/migration.rs`): a node that needs a password refuses one without them.

use redis::{Cmd, IntoConnectionInfo};

/// The credentials of a cluster client's nodes: those of its first seed URL, which redis-rs
/// uses for every node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeAuth {
    username: Option<String>,
    password: Option<String>,
}

impl NodeAuth {
    /// The credentials `seed` names (none when it is not a URL redis-rs reads).
    pub(crate) fn of_seed(seed: &str) -> Self {
        let Ok(info) = seed.into_connection_info() else {
            return Self::default();
        };
        let settings = info.redis_settings();
        let given =
            |value: Option<&str>| value.filter(|value| !value.is_empty()).map(str::to_owned);
        Self {
            username: given(settings.username()),
            password: given(settings.password()),
        }
    }

    /// Adds them to a `MIGRATE` (before its `KEYS`): `AUTH2` for an ACL user, `AUTH` for the
    /// default user's password.
    pub(crate) fn add_to(&self, migrate: &mut Cmd) {
        match (&self.username, &self.password) {
            (Some(username), Some(password)) => {
                migrate.arg("AUTH2").arg(username).arg(password);
            }
            (None, Some(password)) => {
                migrate.arg("AUTH").arg(password);
            }
            (_, None) => {}
        }
    }
}
