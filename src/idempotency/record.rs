//! The record of an idempotency key, in a Redis hash beside the key's lock
//! (`<lock hash>:response`, in the lock's slot), read by every duplicate and by `lockctl
//! idempotent`: started when the first request's handler starts, with the outcome its
//! handler committed with its effect, if it did, then the response it was answered.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::durability::DurabilityCheck;
use crate::client::LockClient;
use crate::error::Result;
use crate::guarded_write::GuardedWrites;
use crate::lock::Lock;

/// The hash fields of a stored response.
const FINGERPRINT: &str = "fingerprint";
const STATUS: &str = "status";
const HEADERS: &str = "headers";
const TRAILERS: &str = "trailers";
const BODY: &str = "body";
/// `whole`, or `over_bound` for a response whose body was longer than the store's bound:
/// kept so that a duplicate learns the request ran, not to replay it.
const KEPT: &str = "kept";
/// `started` from when a handler starts, `committed` once it committed its outcome: what a
/// record without a response says of the request that made it.
const STATE: &str = "state";
/// What the handler committed with its effect (`IdempotencyContext::commit`).
const OUTCOME: &str = "outcome";

/// What the store holds for an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRecord {
    /// A request with the key started its handler and no response is stored yet: it runs
    /// still, or it ended without one (its instance stopped, paused past its lease, or its
    /// client's retry found it so).
    Started {
        /// The fingerprint of the request that started.
        fingerprint: String,
        /// What its handler committed with its effect, if it did
        /// ([`IdempotencyContext::commit`](super::IdempotencyContext::commit)).
        committed: Option<Bytes>,
    },
    /// The response the first request was answered.
    Answered(Box<StoredResponse>),
}

impl KeyRecord {
    /// The fingerprint of the request that made the record.
    pub fn fingerprint(&self) -> &str {
        match self {
            Self::Started { fingerprint, .. } => fingerprint,
            Self::Answered(stored) => stored.fingerprint(),
        }
    }

    /// Reads it from the fields of its hash; `None` for a hash that holds no record.
    fn from_fields(fields: Vec<(String, Vec<u8>)>, ttl: Option<Duration>) -> Option<Self> {
        let field = |name: &str| fields.iter().find(|(field, _)| field == name);
        if field(STATUS).is_some() {
            return StoredResponse::from_fields(fields, ttl)
                .map(|stored| Self::Answered(Box::new(stored)));
        }
        let fingerprint = String::from_utf8(field(FINGERPRINT)?.1.clone()).ok()?;
        field(STATE)?;
        let committed = field(OUTCOME).map(|(_, outcome)| Bytes::from(outcome.clone()));
        Some(Self::Started {
            fingerprint,
            committed,
        })
    }
}

/// The writes that mark a key's record started by the request with `fingerprint`.
pub(crate) fn started_writes(key: &str, fingerprint: &str, ttl: Duration) -> GuardedWrites {
    let fields = [
        (FINGERPRINT, fingerprint.as_bytes()),
        (STATE, b"started".as_slice()),
    ];
    GuardedWrites::new().hset(key, fields).pexpire(key, ttl)
}

/// The writes that keep `outcome` as what the handler of the request with `fingerprint`
/// committed.
pub(crate) fn committed_writes(
    key: &str,
    fingerprint: &str,
    outcome: &[u8],
    ttl: Duration,
) -> GuardedWrites {
    let fields = [
        (FINGERPRINT, fingerprint.as_bytes()),
        (STATE, b"committed".as_slice()),
        (OUTCOME, outcome),
    ];
    GuardedWrites::new().hset(key, fields).pexpire(key, ttl)
}

/// What the first request with an idempotency key was answered, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    fingerprint: String,
    status: StatusCode,
    headers: HeaderMap,
    trailers: Option<HeaderMap>,
    /// `None` when the body was over the store's bound and was not kept.
    body: Option<Bytes>,
    ttl: Option<Duration>,
}

impl StoredResponse {
    pub(crate) fn new(
        fingerprint: String,
        status: StatusCode,
        headers: HeaderMap,
        trailers: Option<HeaderMap>,
        body: Option<Bytes>,
    ) -> Self {
        Self {
            fingerprint,
            status,
            headers,
            trailers,
            body,
            ttl: None,
        }
    }

    /// The fingerprint of the request it answered (hex SHA-256 of method, path and query,
    /// and body).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The response's status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The response headers the layer keeps.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The response's trailers (a gRPC response's status), if it had any.
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_ref()
    }

    /// The body; `None` when it was longer than the store's bound and was not kept, so the
    /// response cannot be replayed.
    pub fn body(&self) -> Option<&Bytes> {
        self.body.as_ref()
    }

    /// How long the store keeps it still, as read.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The writes that store it under `key` for `ttl`, in one script that checks the lock.
    pub(crate) fn writes(&self, key: &str, ttl: Duration) -> GuardedWrites {
        let mut fields: Vec<(&str, Vec<u8>)> = vec![
            (FINGERPRINT, self.fingerprint.clone().into_bytes()),
            (STATUS, self.status.as_str().as_bytes().to_vec()),
            (HEADERS, encode_headers(&self.headers)),
        ];
        if let Some(trailers) = &self.trailers {
            fields.push((TRAILERS, encode_headers(trailers)));
        }
        match &self.body {
            Some(body) => {
                fields.push((KEPT, b"whole".to_vec()));
                fields.push((BODY, body.to_vec()));
            }
            None => fields.push((KEPT, b"over_bound".to_vec())),
        }
        GuardedWrites::new().hset(key, fields).pexpire(key, ttl)
    }

    /// Reads it from the fields of its hash; `None` for a hash that holds no response.
    fn from_fields(fields: Vec<(String, Vec<u8>)>, ttl: Option<Duration>) -> Option<Self> {
        let mut stored = Self::new(String::new(), StatusCode::OK, HeaderMap::new(), None, None);
        let mut kept_whole = false;
        let mut status_read = false;
        for (field, value) in fields {
            match field.as_str() {
                FINGERPRINT => stored.fingerprint = String::from_utf8(value).ok()?,
                STATUS => {
                    stored.status = StatusCode::from_bytes(&value).ok()?;
                    status_read = true;
                }
                HEADERS => stored.headers = decode_headers(&value),
                TRAILERS => stored.trailers = Some(decode_headers(&value)),
                BODY => stored.body = Some(value.into()),
                KEPT => kept_whole = value == b"whole",
                _ => {}
            }
        }
        if !kept_whole {
            stored.body = None;
        } else if stored.body.is_none() {
            stored.body = Some(Bytes::new());
        }
        stored.ttl = ttl;
        (status_read && !stored.fingerprint.is_empty()).then_some(stored)
    }
}

/// Headers as lines of `name:value`: neither a name nor a value may hold a line feed, and
/// no name holds a colon.
fn encode_headers(headers: &HeaderMap) -> Vec<u8> {
    let mut encoded = Vec::new();
    for (name, value) in headers {
        encoded.extend_from_slice(name.as_str().as_bytes());
        encoded.push(b':');
        encoded.extend_from_slice(value.as_bytes());
        encoded.push(b'\n');
    }
    encoded
}

fn decode_headers(encoded: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in encoded.split(|byte| *byte == b'\n') {
        let Some(colon) = line.iter().position(|byte| *byte == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    headers
}

/// The stored responses of idempotency keys: the idempotency layer's store, and a way for
/// operators (`lockctl idempotent`) and tests to look one up.
#[derive(Debug, Clone)]
pub struct IdempotencyRecords {
    client: LockClient,
    key_prefix: String,
    durability: DurabilityCheck,
}

impl IdempotencyRecords {
    /// The records of the layers whose key prefix is `key_prefix` (default `""`), on `client`.
    pub fn new(client: LockClient, key_prefix: &str) -> Self {
        Self {
            client,
            key_prefix: key_prefix.to_owned(),
            durability: DurabilityCheck::default(),
        }
    }

    /// Warns once, when the server that keeps `lock`'s record would lose records on a
    /// restart.
    pub(crate) fn check_durability(&self, lock: &Lock) {
        self.durability.once(lock);
    }

    /// The client the records are kept with.
    pub fn client(&self) -> &LockClient {
        &self.client
    }

    /// The lock that runs the requests of `key` in `scope` one at a time. Its name is
    /// `<key prefix>idempotency:` then each scope part as `<length>:<part>:`, then the key:
    /// the lengths keep `a:b` + `c` apart from `a` + `b:c`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`](crate::ErrorKind::InvalidName) when the name is too long.
    pub fn lock(&self, scope: &[String], key: &str) -> Result<Lock> {
        let mut name = format!("{}idempotency:", self.key_prefix);
        for part in scope {
            name.push_str(&format!("{}:{part}:", part.len()));
        }
        name.push_str(key);
        self.client.lock(&name)
    }

    /// The cluster hash tag of the record of `key` in `scope`: what
    /// [`IdempotencyContext::hash_tag`](super::IdempotencyContext::hash_tag) tells its
    /// handler, for code that reads the keys a handler committed.
    ///
    /// # Errors
    ///
    /// As [`IdempotencyRecords::lock`].
    pub fn hash_tag(&self, scope: &[String], key: &str) -> Result<String> {
        Ok(self.lock(scope, key)?.keys().hash_tag().to_owned())
    }

    /// The stored response of `key` in `scope`, if there is one.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Errors
    ///
    /// As [`IdempotencyRecords::lock`], and as [`Lock::inspect`] when Redis fails.
    pub async fn get(&self, scope: &[String], key: &str) -> Result<Option<StoredResponse>> {
        Ok(match self.record(scope, key).await? {
            Some(KeyRecord::Answered(stored)) => Some(*stored),
            _ => None,
        })
    }

    /// The whole record of `key` in `scope`: started, committed, or answered.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Errors
    ///
    /// As [`IdempotencyRecords::get`].
    pub async fn record(&self, scope: &[String], key: &str) -> Result<Option<KeyRecord>> {
        read(&self.lock(scope, key)?).await
    }
}

/// The key of the stored response of the idempotency key `lock` serializes.
pub(crate) fn record_key(lock: &Lock) -> String {
    format!("{}:response", lock.keys().hash())
}

/// The record beside `lock`, if there is one: its fields and its time to live, in one round
/// trip.
pub(crate) async fn read(lock: &Lock) -> Result<Option<KeyRecord>> {
    let key = record_key(lock);
    let connections = &lock.client().engine.shared.connections;
    let (fields, pttl): (Vec<(String, Vec<u8>)>, i64) = connections
        .run(&key, |mut conn| {
            let key = key.clone();
            async move {
                redis::pipe()
                    .cmd("HGETALL")
                    .arg(&key)
                    .cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
            }
        })
        .await?;
    let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
    Ok(KeyRecord::from_fields(fields, ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_survive_their_encoding() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "application/json".parse().unwrap());
        headers.append("set-cookie", "a=1".parse().unwrap());
        headers.append("set-cookie", "b=2; Path=/".parse().unwrap());
        headers.insert("x-odd", HeaderValue::from_bytes(b"caf\xe9 : x").unwrap());
        assert_eq!(decode_headers(&encode_headers(&headers)), headers);
    }

    #[test]
    fn a_response_is_read_back_from_its_fields() {
        let fields = |kept: &str| {
            vec![
                (FINGERPRINT.to_owned(), b"ab".to_vec()),
                (STATUS.to_owned(), b"201".to_vec()),
                (HEADERS.to_owned(), b"location:/orders/1\n".to_vec()),
                (KEPT.to_owned(), kept.as_bytes().to_vec()),
                (BODY.to_owned(), b"{}".to_vec()),
            ]
        };
        let whole = StoredResponse::from_fields(fields("whole"), None).unwrap();
        assert_eq!(whole.status(), StatusCode::CREATED);
        assert_eq!(whole.headers()["location"], "/orders/1");
        assert_eq!(whole.body().unwrap(), "{}");
        let over = StoredResponse::from_fields(fields("over_bound"), None).unwrap();
        assert_eq!(over.body(), None);
        assert_eq!(StoredResponse::from_fields(Vec::new(), None), None);
    }

    #[test]
    fn a_record_is_started_committed_or_answered_by_its_fields() {
        let field = |name: &str, value: &str| (name.to_owned(), value.as_bytes().to_vec());
        let started = vec![field(FINGERPRINT, "ab"), field(STATE, "started")];
        let read = KeyRecord::from_fields(started.clone(), None).unwrap();
        assert_eq!(
            read,
            KeyRecord::Started {
                fingerprint: "ab".into(),
                committed: None
            }
        );
        let mut committed = started.clone();
        committed.push(field(STATE, "committed"));
        committed.push(field(OUTCOME, "{\"id\":1}"));
        let read = KeyRecord::from_fields(committed.clone(), None).unwrap();
        let KeyRecord::Started {
            committed: Some(outcome),
            ..
        } = read
        else {
            panic!("not committed: {read:?}");
        };
        assert_eq!(outcome, "{\"id\":1}");
        let mut answered = committed;
        answered.push(field(STATUS, "201"));
        answered.push(field(KEPT, "whole"));
        let read = KeyRecord::from_fields(answered, None).unwrap();
        assert!(matches!(read, KeyRecord::Answered(ref stored) if stored.status() == 201));
        assert_eq!(read.fingerprint(), "ab");
        // A hash with neither a state nor a status is no record (a fingerprint alone).
        assert_eq!(
            KeyRecord::from_fields(vec![field(FINGERPRINT, "ab")], None),
            None
        );
    }
}
