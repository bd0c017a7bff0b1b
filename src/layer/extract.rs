//! Where the lock keys of a request come from: a small trait, closures, and ready-made
//! extractors for headers, gRPC metadata, path segments, route parameters, the gRPC method
//! and one constant key.

use std::fmt;

use http::{HeaderName, Request};

/// The lock keys of one request: none (the request runs unlocked, or is rejected), one, or
/// several (all taken, in one canonical order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keys(Vec<String>);

impl Keys {
    /// No key.
    pub fn none() -> Self {
        Self(Vec::new())
    }

    /// Whether there is no key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The keys.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    pub(crate) fn into_vec(self) -> Vec<String> {
        self.0
    }
}

impl From<String> for Keys {
    fn from(key: String) -> Self {
        Self(vec![key])
    }
}

impl From<&str> for Keys {
    fn from(key: &str) -> Self {
        Self(vec![key.to_owned()])
    }
}

impl From<Option<String>> for Keys {
    fn from(key: Option<String>) -> Self {
        Self(key.into_iter().collect())
    }
}

impl From<Vec<String>> for Keys {
    fn from(keys: Vec<String>) -> Self {
        Self(keys)
    }
}

/// A key was present but unusable (not text, say); the request is answered 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidKey(String);

impl InvalidKey {
    /// An invalid key, with why.
    pub fn new(reason: impl Into<String>) -> Self {
        Self(reason.into())
    }
}

impl fmt::Display for InvalidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidKey {}

/// Finds the lock keys of a request.
///
/// Closures `Fn(&Request<B>) -> K` where `K: Into<Keys>` (a `String`, an `Option<String>`,
/// a `Vec<String>`) are extractors too.
pub trait KeyExtractor<B>: Clone + Send + Sync + 'static {
    /// The request's keys; `Err` answers the request 400 (gRPC `INVALID_ARGUMENT`).
    ///
    /// # Errors
    ///
    /// [`InvalidKey`] when a key is present but unusable.
    fn extract(&self, request: &Request<B>) -> Result<Keys, InvalidKey>;
}

impl<B, F, K> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> K + Clone + Send + Sync + 'static,
    K: Into<Keys>,
{
    fn extract(&self, request: &Request<B>) -> Result<Keys, InvalidKey> {
        Ok(self(request).into())
    }
}

/// The value of one header: `HeaderKey::new("x-tenant-id")`. No header, no key; a value that
/// is not visible ASCII, or the header sent more than once (which value would the handler
/// act on?), is an invalid key.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

/// gRPC metadata is sent as HTTP/2 headers: `MetadataKey::new("account-id")`.
pub type MetadataKey = HeaderKey;

impl HeaderKey {
    /// The header called `name` (lowercase).
    ///
    /// # Panics
    ///
    /// When `name` is not a valid lowercase header name; it is meant to be a constant.
    pub fn new(name: &'static str) -> Self {
        Self {
            name: HeaderName::from_static(name),
        }
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    fn extract(&self, request: &Request<B>) -> Result<Keys, InvalidKey> {
        let mut values = request.headers().get_all(&self.name).iter();
        let Some(value) = values.next() else {
            return Ok(Keys::none());
        };
        if values.next().is_some() {
            return Err(InvalidKey::new(format!(
                "header {} is sent more than once",
                self.name
            )));
        }
        value
            .to_str()
            .map(Keys::from)
            .map_err(|_| InvalidKey::new(format!("header {} is not visible ASCII", self.name)))
    }
}

/// One segment of the path, counted from 0 after the leading `/`:
/// `PathSegmentKey::new(1)` takes `acme` from `/tenants/acme/orders`. The segment is
/// percent-decoded, as routers decode path parameters, so `/tenants/%61cme` locks `acme`
/// too; a segment that does not decode to UTF-8 is an invalid key.
#[derive(Debug, Clone, Copy)]
pub struct PathSegmentKey {
    index: usize,
}

impl PathSegmentKey {
    /// The segment at `index`.
    pub fn new(index: usize) -> Self {
        Self { index }
    }
}

impl<B> KeyExtractor<B> for PathSegmentKey {
    fn extract(&self, request: &Request<B>) -> Result<Keys, InvalidKey> {
        let segment = request
            .uri()
            .path()
            .split('/')
            .skip(1)
            .nth(self.index)
            .filter(|segment| !segment.is_empty());
        segment.map(decode_segment).transpose().map(Keys::from)
    }
}

/// A parameter of a route template:
/// `RouteParamKey::new("/tenants/{tenant}/orders", "tenant")`. The path must match the
/// template's segments (literal segments equal, parameters non-empty); further segments are
/// allowed, so `/tenants/{tenant}` covers every route below a tenant. Works outside the
/// router, where the matched route is not known yet. Like a router, it matches literal
/// segments as sent and percent-decodes the parameter; a parameter that does not decode to
/// UTF-8 is an invalid key.
#[derive(Debug, Clone)]
pub struct RouteParamKey {
    template: Vec<TemplateSegment>,
    param: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TemplateSegment {
    Literal(String),
    Param,
}

impl RouteParamKey {
    /// The parameter `param` of `template`.
    ///
    /// # Panics
    ///
    /// When the template has no `{param}` segment; it is meant to be a constant.
    pub fn new(template: &str, param: &str) -> Self {
        let wanted = format!("{{{param}}}");
        let mut position = None;
        let template = template
            .trim_start_matches('/')
            .split('/')
            .enumerate()
            .map(|(index, segment)| {
                if segment == wanted {
                    position = Some(index);
                }
                if segment.starts_with('{') && segment.ends_with('}') {
                    TemplateSegment::Param
                } else {
                    TemplateSegment::Literal(segment.to_owned())
                }
            })
            .collect();
        let param = position.unwrap_or_else(|| panic!("the template has no {wanted} segment"));
        Self { template, param }
    }
}

impl<B> KeyExtractor<B> for RouteParamKey {
    fn extract(&self, request: &Request<B>) -> Result<Keys, InvalidKey> {
        let mut segments = request.uri().path().trim_start_matches('/').split('/');
        let mut key = None;
        for (index, expected) in self.template.iter().enumerate() {
            let Some(segment) = segments.next() else {
                return Ok(Keys::none());
            };
            match expected {
                TemplateSegment::Literal(literal) if literal != segment => return Ok(Keys::none()),
                TemplateSegment::Param if segment.is_empty() => return Ok(Keys::none()),
                _ => {}
            }
            if index == self.param {
                key = Some(segment);
            }
        }
        key.map(decode_segment).transpose().map(Keys::from)
    }
}

/// A path segment as the handler sees it: percent-decoded (`%61cme` and `acme` name one
/// tenant, so they must name one lock).
fn decode_segment(segment: &str) -> Result<String, InvalidKey> {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|_| InvalidKey::new("a path segment does not decode to UTF-8"))
}

/// The gRPC method (`/package.Service/Method`): one critical section per method.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMethodKey;

impl<B> KeyExtractor<B> for GrpcMethodKey {
    fn extract(&self, request: &Request<B>) -> Result<Keys, InvalidKey> {
        Ok(Keys::from(request.uri().path()))
    }
}

/// The same key for every request: one global critical section.
#[derive(Debug, Clone)]
pub struct ConstantKey(String);

impl ConstantKey {
    /// Every request takes the lock `key`.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }
}

impl<B> KeyExtractor<B> for ConstantKey {
    fn extract(&self, _request: &Request<B>) -> Result<Keys, InvalidKey> {
        Ok(Keys::from(self.0.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str) -> Request<()> {
        Request::builder()
            .uri(path)
            .header("x-tenant-id", "acme")
            .body(())
            .unwrap()
    }

    fn keys(extractor: &impl KeyExtractor<()>, path: &str) -> Vec<String> {
        extractor.extract(&request(path)).unwrap().into_vec()
    }

    #[test]
    fn headers_give_their_value_or_nothing() {
        assert_eq!(keys(&HeaderKey::new("x-tenant-id"), "/"), ["acme"]);
        assert!(keys(&HeaderKey::new("x-other"), "/").is_empty());
        let binary = Request::builder()
            .header("x-tenant-id", &b"\xff"[..])
            .body(())
            .unwrap();
        assert!(HeaderKey::new("x-tenant-id").extract(&binary).is_err());
    }

    #[test]
    fn a_header_sent_twice_is_an_invalid_key() {
        let twice = Request::builder()
            .header("x-tenant-id", "acme")
            .header("x-tenant-id", "globex")
            .body(())
            .unwrap();
        let err = HeaderKey::new("x-tenant-id").extract(&twice).unwrap_err();
        assert!(err.to_string().contains("more than once"), "{err}");
    }

    #[test]
    fn path_keys_are_percent_decoded_like_router_parameters() {
        let second = PathSegmentKey::new(1);
        assert_eq!(keys(&second, "/tenants/%61cme/orders"), ["acme"]);
        assert_eq!(keys(&second, "/tenants/a%7Bb%7D%25/orders"), ["a{b}%"]);
        assert_eq!(keys(&second, "/tenants/caf%C3%A9"), ["café"]);
        // A stray '%' that starts no escape stays as sent.
        assert_eq!(keys(&second, "/tenants/100%/orders"), ["100%"]);
        assert!(second.extract(&request("/tenants/%FF%FE")).is_err());

        let tenant = RouteParamKey::new("/tenants/{tenant}/orders", "tenant");
        assert_eq!(keys(&tenant, "/tenants/%61cme/orders"), ["acme"]);
        assert_eq!(keys(&tenant, "/tenants/a%2Fb/orders"), ["a/b"]);
        assert!(tenant.extract(&request("/tenants/%C3/orders")).is_err());
        // Literal segments are matched as sent, as a router matches them.
        assert!(keys(&tenant, "/%74enants/acme/orders").is_empty());
    }

    #[test]
    fn path_segments_count_from_zero() {
        let second = PathSegmentKey::new(1);
        assert_eq!(keys(&second, "/tenants/acme/orders"), ["acme"]);
        assert!(keys(&second, "/tenants").is_empty());
        assert!(keys(&second, "/tenants//orders").is_empty());
    }

    #[test]
    fn route_params_match_the_template() {
        let tenant = RouteParamKey::new("/tenants/{tenant}/orders", "tenant");
        assert_eq!(keys(&tenant, "/tenants/acme/orders"), ["acme"]);
        assert_eq!(keys(&tenant, "/tenants/acme/orders/7"), ["acme"]);
        assert!(keys(&tenant, "/tenants/acme/invoices").is_empty());
        assert!(keys(&tenant, "/accounts/acme/orders").is_empty());
        assert!(keys(&tenant, "/tenants/acme").is_empty());
        let any = RouteParamKey::new("/tenants/{tenant}", "tenant");
        assert_eq!(keys(&any, "/tenants/acme/invoices"), ["acme"]);
    }

    #[test]
    fn grpc_method_constant_and_closures() {
        assert_eq!(
            keys(&GrpcMethodKey, "/bank.Accounts/Deposit"),
            ["/bank.Accounts/Deposit"]
        );
        assert_eq!(keys(&ConstantKey::new("global"), "/x"), ["global"]);
        let both = |request: &Request<()>| {
            let path = request.uri().path().to_owned();
            vec![path, "audit".to_owned()]
        };
        assert_eq!(keys(&both, "/a"), ["/a", "audit"]);
    }
}
