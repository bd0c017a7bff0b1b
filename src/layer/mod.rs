#![doc = include_str!("guide.md")]

pub(crate) mod answer;
#[cfg(feature = "axum")]
mod axum_support;
mod body;
pub(crate) mod buffer;
mod context;
mod extract;
pub(crate) mod held;
#[cfg(feature = "json")]
mod json_keys;
#[allow(clippy::module_inception)]
mod layer;
pub(crate) mod log;
mod policy;
pub(crate) mod reject;
mod service;

pub mod future;

pub use crate::rejection_kind::RejectionKind;
#[cfg(feature = "axum")]
pub use axum_support::{MissingLockContext, PathParamKey};
pub use body::RejectionBody;
pub use buffer::{BufferedBody, DEFAULT_MAX_BODY};
pub use context::LockContext;
pub use extract::{
    ConstantKey, GrpcMethodKey, HeaderKey, InvalidKey, KeyExtractor, Keys, MetadataKey,
    PathSegmentKey, RouteParamKey,
};
pub use future::ResponseFuture;
#[cfg(feature = "json")]
pub use json_keys::{JsonKeys, JsonKeysFuture, JsonKeysLayer, JsonKeysService};
pub use layer::LockLayer;
pub use policy::{
    DEFAULT_MAX_KEYS, DEFAULT_RETRY_AFTER, DEFAULT_WAIT, OnLeaseLost, OnMissingKey,
    OnRedisUnavailable, Sharing,
};
pub use reject::{DefaultRejection, ProblemJson, Reject, Rejection};
pub use service::LockService;
