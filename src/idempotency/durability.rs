//! What the records rest on: a Redis that keeps its data. A layer reads the server's
//! persistence settings once, when its first request comes, and warns by name when a
//! restart would lose records, since a lost record runs its key again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::Result;
use crate::lock::Lock;

/// Whether a layer's records were looked at already: once per layer, whatever its clones.
#[derive(Debug, Clone, Default)]
pub(crate) struct DurabilityCheck {
    done: Arc<AtomicBool>,
}

impl DurabilityCheck {
    /// Reads the persistence settings of the server that keeps `lock`'s record, in a task of
    /// its own, the first time only.
    pub(crate) fn once(&self, lock: &Lock) {
        if self.done.swap(true, Ordering::SeqCst) {
            return;
        }
        let lock = lock.clone();
        tokio::spawn(async move {
            match settings(&lock).await {
                Ok(settings) => match settings.loss() {
                    Some(loss) => tracing::warn!(
                        appendonly = %settings.appendonly,
                        save = %settings.save,
                        "idempotency records would not survive a restart of Redis: {loss}; \
                         a key whose record is lost runs again (turn on the append-only \
                         file: appendonly yes)"
                    ),
                    None => tracing::info!(
                        "idempotency records are kept in Redis's append-only file (appendonly yes)"
                    ),
                },
                Err(error) => tracing::info!(
                    %error,
                    "the persistence settings of Redis could not be read (CONFIG GET); \
                     idempotency records need a Redis that keeps its data"
                ),
            }
        });
    }
}

/// The persistence settings that decide whether records survive a restart.
#[derive(Debug, PartialEq, Eq)]
struct Persistence {
    appendonly: String,
    save: String,
}

impl Persistence {
    /// What a restart loses, if anything: all records without persistence, the ones since
    /// the last snapshot with snapshots only; nothing a graceful restart would lose with the
    /// append-only file.
    fn loss(&self) -> Option<&'static str> {
        if self.appendonly == "yes" {
            None
        } else if self.save.trim().is_empty() {
            Some("no persistence (appendonly no, save \"\"): every record is lost")
        } else {
            Some("snapshots only (appendonly no): the records since the last snapshot are lost")
        }
    }
}

/// Reads `appendonly` and `save` from the server that keeps `lock`'s record (the one that
/// keeps its hash: the record shares its slot).
async fn settings(lock: &Lock) -> Result<Persistence> {
    let key = lock.keys().hash().to_owned();
    let connections = &lock.client().engine.shared.connections;
    let (appendonly, save): (Vec<String>, Vec<String>) = connections
        .run(&key, |mut conn| async move {
            redis::pipe()
                .cmd("CONFIG")
                .arg("GET")
                .arg("appendonly")
                .cmd("CONFIG")
                .arg("GET")
                .arg("save")
                .query_async(&mut conn)
                .await
        })
        .await?;
    Ok(Persistence {
        appendonly: appendonly.get(1).cloned().unwrap_or_default(),
        save: save.get(1).cloned().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_append_only_file_keeps_every_record() {
        let settings = |appendonly: &str, save: &str| Persistence {
            appendonly: appendonly.into(),
            save: save.into(),
        };
        assert_eq!(settings("yes", "").loss(), None);
        assert_eq!(settings("yes", "3600 1").loss(), None);
        assert!(settings("no", "").loss().unwrap().contains("every record"));
        assert!(
            settings("no", "3600 1 300 100")
                .loss()
                .unwrap()
                .contains("last snapshot")
        );
    }
}
