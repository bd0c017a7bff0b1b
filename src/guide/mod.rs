//! The guide, chapter by chapter. The crate's front page has the quick start and the
//! concepts; the layer, idempotent requests and the lock kinds are in their modules'
//! pages ([`crate::layer`], [`crate::idempotency`], [`crate::kinds`]); the rest is here.
//!
//! Each chapter is a Markdown file beside this one, so it reads the same in the repository.

#[doc = include_str!("client.md")]
pub mod client {}

#[doc = include_str!("configuration.md")]
pub mod configuration {}

#[doc = include_str!("safety.md")]
pub mod safety {}

#[doc = include_str!("singleton.md")]
pub mod singleton {}

#[doc = include_str!("topologies.md")]
pub mod topologies {}

#[doc = include_str!("operating.md")]
pub mod operating {}

#[doc = include_str!("security.md")]
pub mod security {}

#[doc = include_str!("internals.md")]
pub mod internals {}
