//! Lock keys from a JSON request body (feature `json`): [`JsonKeys`] names them (JSON
//! pointers, or a closure over the parsed body); its body layer ([`JsonKeys::layer`])
//! reads the body up to a bound, finds the keys and hands the request on with its body
//! intact; a `LockLayer` given the same `JsonKeys` takes them.
//!
//! `JsonKeysLayer` → [`JsonKeysService`] → [`JsonKeysFuture`]. The body layer must run
//! first, outside the lock layer: it reads the body before any lock is asked for, so a slow
//! upload holds no lock and a refused body never reaches Redis.

mod find;
mod future;
mod layer;
mod service;

pub use find::JsonKeys;
pub use future::JsonKeysFuture;
pub use layer::JsonKeysLayer;
pub use service::JsonKeysService;
