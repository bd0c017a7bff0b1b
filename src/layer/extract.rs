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
///
/// So are tuples of two to four extractors, several as one: the keys of every part, taken
/// all or nothing in one canonical order. `(HeaderKey::new("x-from-account"),
/// HeaderKey::new("x-to-account"))` locks both accounts of a transfer, and each part keeps its
/// own checks (a header sent twice is still refused). A request in which some parts find
/// their keys and others none is answered 400, since the handler would touch more than a
/// partial set locks; one in which no part finds a key has none (the layer's
/// `on_missing_key` decides).
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
    /// The header called `name`, in any case: header names are case-insensitive, so
    /// `"X-Tenant-Id"` and `"x-tenant-id"` name the same header.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid header name (empty, or with a space or another character
    /// header names cannot have); it is meant to be a constant.
    pub fn new(name: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| panic!("{name:?} is not a valid header name"));
        Self { name }
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

/// Implements [`KeyExtractor`] for a tuple of extractors (see the trait's docs).
macro_rules! tuple_extractor {
    ($($part:ident),+) => {
        impl<Body, $($part),+> KeyExtractor<Body> for ($($part,)+)
        where
            $($part: KeyExtractor<Body>,)+
        {
            #[allow(non_snake_case)]
            fn extract(&self, request: &Request<Body>) -> Result<Keys, InvalidKey> {
                let ($($part,)+) = self;
                all_or_none(vec![$($part.extract(request)?),+])
            }
        }
    };
}

tuple_extractor!(E1, E2);
tuple_extractor!(E1, E2, E3);
tuple_extractor!(E1, E2, E3, E4);

/// The keys of every part, when each found some; none when none did.
fn all_or_none(parts: Vec<Keys>) -> Result<Keys, InvalidKey> {
    let found = parts.iter().filter(|keys| !keys.is_empty()).count();
    if found == 0 {
        return Ok(Keys::none());
    }
    if let Some(missing) = parts.iter().position(Keys::is_empty) {
        return Err(InvalidKey::new(format!(
            "lock key {} of {} is missing while the others are present",
            missing + 1,
            parts.len()
        )));
    }
    Ok(Keys(parts.into_iter().flat_map(Keys::into_vec).collect()))
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
///
/// The template is matched against the path this layer sees, from its first segment: under
/// a prefix (axum's `nest("/api", …)` with the layer on the outer router sees
/// `/api/tenants/acme`) it must include the prefix, or the request has no key. With axum,
/// `PathParamKey` (feature `axum`) takes the parameter from the route axum matched instead.
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
    fn header_names_are_case_insensitive() {
        assert_eq!(keys(&HeaderKey::new("X-Tenant-Id"), "/"), ["acme"]);
        assert_eq!(keys(&HeaderKey::new("X-TENANT-ID"), "/"), ["acme"]);
    }

    #[test]
    #[should_panic(expected = "not a valid header name")]
    fn an_invalid_header_name_panics_with_its_name() {
        let _ = HeaderKey::new("x tenant");
    }

    #[test]
    fn tuples_take_the_keys_of_every_part_all_or_none() {
        let transfer = (HeaderKey::new("x-from"), HeaderKey::new("x-to"));
        let both = Request::builder()
            .header("x-from", "a")
            .header("x-to", "b")
            .body(())
            .unwrap();
        assert_eq!(transfer.extract(&both).unwrap().into_vec(), ["a", "b"]);
        let neither = Request::new(());
        assert!(transfer.extract(&neither).unwrap().is_empty());
        let half = Request::builder().header("x-to", "b").body(()).unwrap();
        let err = transfer.extract(&half).unwrap_err();
        assert!(err.to_string().contains("key 1 of 2 is missing"), "{err}");
        // Each part keeps its checks: a repeated header is refused inside a tuple too.
        let repeated = Request::builder()
            .header("x-from", "a")
            .header("x-to", "b")
            .header("x-to", "c")
            .body(())
            .unwrap();
        assert!(transfer.extract(&repeated).is_err());
        let three = (
            HeaderKey::new("x-tenant-id"),
            PathSegmentKey::new(1),
            ConstantKey::new("audit"),
        );
        assert_eq!(keys(&three, "/tenants/globex"), ["acme", "globex", "audit"]);
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
