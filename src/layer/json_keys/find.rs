//! `JsonKeys`: which lock keys a JSON body names (JSON pointers, or a closure over the
//! parsed value), and the key extractor that hands the keys its body layer found to a
//! `LockLayer`.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use http::{Extensions, Request};
use serde_json::Value;

use super::super::buffer::DEFAULT_MAX_BODY;
use super::super::extract::{InvalidKey, KeyExtractor, Keys};
use crate::rejection_kind::RejectionKind;

/// Lock keys read from a JSON request body: both the body layer that reads them
/// ([`JsonKeys::layer`]) and the [`KeyExtractor`] a [`LockLayer`](super::super::LockLayer)
/// takes them from. Give both the same `JsonKeys` (or clones of it), the body layer
/// outside, so it runs first:
///
/// ```no_run
/// use axum::{Router, routing::post};
/// use tower_redis_lock::{JsonKeys, LockClient, LockLayer};
///
/// async fn transfer(body: String) -> String {
///     body // runs alone for both accounts, across every instance
/// }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
/// let keys = JsonKeys::pointers(["/from_account", "/to_account"]);
/// let app: Router = Router::new()
///     .route("/transfers", post(transfer))
///     .layer(LockLayer::new(locks, keys.clone()))
///     .layer(keys.layer()); // added last: runs first
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
///
/// The body is read up to [`JsonKeys::max_body`] bytes (default
/// [`DEFAULT_MAX_BODY`](super::super::DEFAULT_MAX_BODY), 64 KiB), parsed once to find the
/// keys, and handed on intact. A key is a JSON string, taken as it is, or an integer, taken
/// in decimal (`7` and `"7"` name one lock); other values are refused rather than guessed
/// at. The body's `content-type` is not checked: the handler's own JSON extractor does that.
#[derive(Clone)]
pub struct JsonKeys {
    find: Find,
    max_body: usize,
    /// Which body layer's keys are this extractor's: those of its clones. Another
    /// `JsonKeys` around the same request (a second pair of layers) keeps its own.
    id: u64,
    /// Whether the missing body layer was logged at ERROR (once: a configuration mistake
    /// shows on every request, and the 400s are logged by the lock layer anyway).
    told_missing_layer: Arc<AtomicBool>,
}

/// A user's closure over the parsed body.
type FindFn = dyn Fn(&Value) -> Result<Keys, InvalidKey> + Send + Sync;

#[derive(Clone)]
enum Find {
    /// Each pointer must name a key.
    Pointers(Arc<[String]>),
    /// The user's closure.
    With(Arc<FindFn>),
}

/// The layer's refusal of a body: what a rejection says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) kind: RejectionKind,
    /// The keys found before the body was refused (none when it was not JSON).
    pub(crate) keys: Vec<String>,
    pub(crate) detail: String,
}

impl Refusal {
    fn invalid(keys: Vec<String>, detail: String) -> Self {
        Self {
            kind: RejectionKind::InvalidKey,
            keys,
            detail,
        }
    }
}

impl JsonKeys {
    /// The keys at `pointers` (RFC 6901, as `serde_json::Value::pointer` reads them:
    /// `"/from_account"`, `"/order/customer_id"`, `"/lines/0/sku"`), in that order. Every
    /// pointer is required: a body in which one is absent or `null` (or an empty body) is
    /// answered 400 ([`RejectionKind::MissingKey`]); a body that is not JSON, or a pointer
    /// at anything but a string or an integer, 400 ([`RejectionKind::InvalidKey`]).
    ///
    /// # Panics
    ///
    /// When a pointer is neither empty (the whole body) nor starts with `/`; pointers are
    /// meant to be constants.
    pub fn pointers<I, P>(pointers: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        let pointers: Arc<[String]> = pointers.into_iter().map(Into::into).collect();
        for pointer in pointers.iter() {
            assert!(
                pointer.is_empty() || pointer.starts_with('/'),
                "{pointer:?} is not a JSON pointer: it must start with '/'"
            );
        }
        Self::new(Find::Pointers(pointers))
    }

    /// The keys `find` returns for the parsed body (`serde_json::Value::Null` for an empty
    /// body). `Err` answers 400 ([`RejectionKind::InvalidKey`]) with its reason, as does a
    /// body that is not JSON; no key hands the request on keyless, for the lock layer's
    /// [`OnMissingKey`](super::super::OnMissingKey) to decide.
    ///
    /// ```
    /// use serde_json::Value;
    /// use tower_redis_lock::JsonKeys;
    /// use tower_redis_lock::layer::{InvalidKey, Keys};
    ///
    /// // Every SKU of an order's lines.
    /// let skus = JsonKeys::with(|order: &Value| -> Result<Keys, InvalidKey> {
    ///     let lines = order["lines"].as_array().ok_or(InvalidKey::new("no lines"))?;
    ///     let skus = lines.iter().filter_map(|line| line["sku"].as_str());
    ///     Ok(Keys::from(skus.map(str::to_owned).collect::<Vec<_>>()))
    /// });
    /// # let _ = skus;
    /// ```
    pub fn with<F>(find: F) -> Self
    where
        F: Fn(&Value) -> Result<Keys, InvalidKey> + Send + Sync + 'static,
    {
        Self::new(Find::With(Arc::new(find)))
    }

    fn new(find: Find) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Self {
            find,
            max_body: DEFAULT_MAX_BODY,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            told_missing_layer: Arc::default(),
        }
    }

    /// The longest body read, in bytes (default
    /// [`DEFAULT_MAX_BODY`](super::super::DEFAULT_MAX_BODY), 64 KiB). A longer one is
    /// answered 413 ([`RejectionKind::BodyTooLarge`], gRPC `RESOURCE_EXHAUSTED`): at once
    /// when its `Content-Length` says so, else as soon as the bytes read pass the bound.
    #[must_use]
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    pub(crate) fn max_body_bytes(&self) -> usize {
        self.max_body
    }

    /// The keys `body` names, or why it is refused.
    pub(crate) fn find(&self, body: &[u8]) -> Result<Keys, Refusal> {
        match &self.find {
            Find::Pointers(pointers) if body.is_empty() => Err(Refusal {
                kind: RejectionKind::MissingKey,
                keys: Vec::new(),
                detail: format!(
                    "the body is empty; it must be JSON with {}",
                    pointers.join(", ")
                ),
            }),
            Find::Pointers(pointers) => at_pointers(pointers, &parse(body)?),
            Find::With(find) if body.is_empty() => closure_keys(find.as_ref(), &Value::Null),
            Find::With(find) => closure_keys(find.as_ref(), &parse(body)?),
        }
    }

    /// Leaves `keys` in `extensions` for this extractor (and its clones).
    pub(crate) fn store(&self, extensions: &mut Extensions, keys: Keys) {
        match extensions.get_mut::<FoundKeys>() {
            Some(found) => {
                found.0.retain(|(id, _)| *id != self.id);
                found.0.push((self.id, keys));
            }
            None => {
                extensions.insert(FoundKeys(vec![(self.id, keys)]));
            }
        }
    }
}

impl fmt::Debug for JsonKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("JsonKeys");
        match &self.find {
            Find::Pointers(pointers) => debug.field("pointers", pointers),
            Find::With(_) => debug.field("with", &"<closure>"),
        };
        debug.field("max_body", &self.max_body).finish()
    }
}

/// The keys the body layers of a request found, by the id of their `JsonKeys`.
#[derive(Debug, Clone)]
struct FoundKeys(Vec<(u64, Keys)>);

/// The keys the body layer found, for the lock layer.
impl<B> KeyExtractor<B> for JsonKeys {
    /// # Errors
    ///
    /// [`InvalidKey`], naming the body layer, when it did not run before this extractor: it
    /// is missing, or inside the lock layer instead of outside.
    fn extract(&self, request: &Request<B>) -> Result<Keys, InvalidKey> {
        let found = request
            .extensions()
            .get::<FoundKeys>()
            .and_then(|found| found.0.iter().find(|(id, _)| *id == self.id));
        if let Some((_, keys)) = found {
            return Ok(keys.clone());
        }
        if !self.told_missing_layer.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "JsonKeys found no keys of its body layer in a request: add `keys.layer()` \
                 outside the LockLayer, from the same JsonKeys (or a clone); with axum, \
                 `.layer(LockLayer::new(locks, keys.clone())).layer(keys.layer())`, with \
                 ServiceBuilder, `.layer(keys.layer()).layer(LockLayer::new(…))` (logged once)"
            );
        }
        Err(InvalidKey::new(
            "the JsonKeys body layer did not run before the lock layer (it must be outside it, \
             from the same JsonKeys)",
        ))
    }
}

fn parse(body: &[u8]) -> Result<Value, Refusal> {
    serde_json::from_slice(body)
        .map_err(|error| Refusal::invalid(Vec::new(), format!("the body is not JSON ({error})")))
}

fn closure_keys(find: &FindFn, body: &Value) -> Result<Keys, Refusal> {
    find(body).map_err(|invalid| Refusal::invalid(Vec::new(), invalid.to_string()))
}

/// The key at each pointer: all of them, or why not (the keys found so far with it).
fn at_pointers(pointers: &[String], body: &Value) -> Result<Keys, Refusal> {
    let mut keys = Vec::with_capacity(pointers.len());
    let mut missing = Vec::new();
    let mut wrong = None;
    for pointer in pointers {
        match body.pointer(pointer) {
            None | Some(Value::Null) => missing.push(pointer.as_str()),
            Some(Value::String(key)) => keys.push(key.clone()),
            Some(Value::Number(number)) if number.is_i64() || number.is_u64() => {
                keys.push(number.to_string());
            }
            Some(other) => {
                wrong.get_or_insert_with(|| {
                    format!("{pointer} is {}, not a string or an integer", what(other))
                });
            }
        }
    }
    if let Some(detail) = wrong {
        return Err(Refusal::invalid(keys, detail));
    }
    if !missing.is_empty() {
        return Err(Refusal {
            kind: RejectionKind::MissingKey,
            keys,
            detail: format!("the body has no {}", missing.join(", ")),
        });
    }
    Ok(Keys::from(keys))
}

/// What a JSON value is, for a message.
fn what(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number with a fraction or an exponent",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer() -> JsonKeys {
        JsonKeys::pointers(["/from_account", "/to_account"])
    }

    fn keys(found: Result<Keys, Refusal>) -> Vec<String> {
        found.expect("keys").into_vec()
    }

    #[test]
    fn pointers_take_strings_and_integers_in_their_order() {
        let body = br#"{"to_account":"a2","from_account":"a1","amount":5}"#;
        assert_eq!(keys(transfer().find(body)), ["a1", "a2"]);
        let numbers = br#"{"from_account":7,"to_account":18446744073709551615}"#;
        assert_eq!(
            keys(transfer().find(numbers)),
            ["7", "18446744073709551615"]
        );
        let nested = JsonKeys::pointers(["/order/customer", "/lines/1/sku"]);
        let order = br#"{"order":{"customer":"c9"},"lines":[{"sku":"x"},{"sku":"y"}]}"#;
        assert_eq!(keys(nested.find(order)), ["c9", "y"]);
    }

    #[test]
    fn a_missing_or_null_key_is_missing_and_names_its_pointer() {
        let refusal = transfer()
            .find(br#"{"from_account":"a1","to_account":null}"#)
            .unwrap_err();
        assert_eq!(refusal.kind, RejectionKind::MissingKey);
        assert_eq!(refusal.keys, ["a1"]);
        assert_eq!(refusal.detail, "the body has no /to_account");
        let empty = transfer().find(b"").unwrap_err();
        assert_eq!(empty.kind, RejectionKind::MissingKey);
        assert!(
            empty.detail.contains("the body is empty"),
            "{}",
            empty.detail
        );
        let none = transfer().find(b"{}").unwrap_err();
        assert_eq!(none.detail, "the body has no /from_account, /to_account");
    }

    #[test]
    fn other_values_and_other_text_are_invalid() {
        for (body, detail) in [
            (
                &br#"{"from_account":1.5,"to_account":"a2"}"#[..],
                "/from_account is a number with a fraction or an exponent, not a string or an integer",
            ),
            (
                br#"{"from_account":"a1","to_account":{"id":2}}"#,
                "/to_account is an object, not a string or an integer",
            ),
            (
                br#"{"from_account":true}"#,
                "/from_account is a boolean, not a string or an integer",
            ),
        ] {
            let refusal = transfer().find(body).unwrap_err();
            assert_eq!(refusal.kind, RejectionKind::InvalidKey);
            assert_eq!(refusal.detail, detail);
        }
        let text = transfer().find(b"from_account=a1").unwrap_err();
        assert_eq!(text.kind, RejectionKind::InvalidKey);
        assert!(
            text.detail.starts_with("the body is not JSON"),
            "{}",
            text.detail
        );
    }

    #[test]
    fn a_closure_sees_the_parsed_body_and_null_for_an_empty_one() {
        let ids = JsonKeys::with(|body: &Value| match body {
            Value::Null => Ok(Keys::none()),
            Value::Array(items) => Ok(Keys::from(
                items
                    .iter()
                    .map(|item| item.to_string())
                    .collect::<Vec<_>>(),
            )),
            _ => Err(InvalidKey::new("not a list")),
        });
        assert_eq!(keys(ids.find(b"[1,\"b\"]")), ["1", "\"b\""]);
        assert!(keys(ids.find(b"")).is_empty());
        let refusal = ids.find(b"{}").unwrap_err();
        assert_eq!(
            (refusal.kind, refusal.detail.as_str()),
            (RejectionKind::InvalidKey, "not a list")
        );
        assert!(ids.find(b"[1,").is_err());
    }

    #[test]
    fn each_json_keys_reads_the_keys_its_own_body_layer_found() {
        let first = transfer();
        let clone = first.clone().max_body(10);
        let other = transfer();
        let mut request = Request::new(());
        assert!(first.extract(&request).is_err(), "no body layer ran");
        first.store(request.extensions_mut(), Keys::from("a1"));
        other.store(request.extensions_mut(), Keys::from("b1"));
        first.store(request.extensions_mut(), Keys::from("a2"));
        assert_eq!(clone.extract(&request).unwrap().into_vec(), ["a2"]);
        assert_eq!(other.extract(&request).unwrap().into_vec(), ["b1"]);
        let err = JsonKeys::pointers(["/x"]).extract(&request).unwrap_err();
        assert!(err.to_string().contains("body layer"), "{err}");
    }

    #[test]
    #[should_panic(expected = "is not a JSON pointer")]
    fn a_pointer_without_a_slash_panics() {
        let _ = JsonKeys::pointers(["from_account"]);
    }
}
