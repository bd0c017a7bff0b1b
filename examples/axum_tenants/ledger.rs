//! The payments' SQL store (`--payments-sql PATH`, SQLite), for data kept outside Redis: a
//! charge is a row of `ledger`, and the payment's idempotency key a row of `idempotency`
//! under a unique key with the answer, both written in one transaction. A retry that runs
//! the handler again (the layer's `OnUnknownOutcome::RunAgain`) meets the key's row and
//! answers from it: a key is charged once whatever happened to the attempt before it.
//!
//! SQLite's file locks serialize the instances' transactions (`BEGIN IMMEDIATE`), as a
//! database's row locks and unique constraints would.

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Bytes;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// Where the ledger is.
#[derive(Debug, Clone)]
pub(crate) struct Ledger {
    path: PathBuf,
}

/// What a charge found.
pub(crate) enum Charged {
    /// Charged now, its answer kept with it.
    Now,
    /// Charged by an earlier attempt with the key: the answer it kept.
    Before(Bytes),
}

/// The payment a charge is for.
pub(crate) struct Payment<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) key: &'a str,
    pub(crate) fingerprint: &'a str,
    pub(crate) amount: i64,
}

impl Ledger {
    /// The ledger at `path`, its tables made if it is new.
    pub(crate) fn open(path: PathBuf) -> rusqlite::Result<Self> {
        let ledger = Self { path };
        ledger.connect()?.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE IF NOT EXISTS idempotency (
                 tenant TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
                 answer BLOB NOT NULL, PRIMARY KEY (tenant, key));
             CREATE TABLE IF NOT EXISTS ledger (
                 id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, payment_key TEXT NOT NULL,
                 amount INTEGER NOT NULL);",
        )?;
        Ok(ledger)
    }

    fn connect(&self) -> rusqlite::Result<Connection> {
        let connection = Connection::open(&self.path)?;
        // Instances wait for each other's transactions, as on any database.
        connection.busy_timeout(Duration::from_secs(10))?;
        Ok(connection)
    }

    /// Charges `payment` and keeps `answer` with its key, in one transaction; or, when the
    /// key was charged already, gives the answer kept then and charges nothing.
    pub(crate) async fn charge_once(
        &self,
        payment: Payment<'_>,
        answer: Bytes,
    ) -> rusqlite::Result<Charged> {
        let ledger = self.clone();
        let (tenant, key) = (payment.tenant.to_owned(), payment.key.to_owned());
        let (fingerprint, amount) = (payment.fingerprint.to_owned(), payment.amount);
        let charged = tokio::task::spawn_blocking(move || {
            let mut connection = ledger.connect()?;
            let transaction =
                connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let kept: Option<Vec<u8>> = transaction
                .query_row(
                    "SELECT answer FROM idempotency WHERE tenant = ?1 AND key = ?2",
                    params![tenant, key],
                    |row| row.get(0),
                )
                .optional()?;
            if let Some(kept) = kept {
                return Ok(Charged::Before(kept.into()));
            }
            transaction.execute(
                "INSERT INTO ledger (tenant, payment_key, amount) VALUES (?1, ?2, ?3)",
                params![tenant, key, amount],
            )?;
            transaction.execute(
                "INSERT INTO idempotency (tenant, key, fingerprint, answer) VALUES (?1, ?2, ?3, ?4)",
                params![tenant, key, fingerprint, answer.to_vec()],
            )?;
            transaction.commit()?;
            Ok(Charged::Now)
        });
        charged.await.expect("the ledger's task")
    }
}
