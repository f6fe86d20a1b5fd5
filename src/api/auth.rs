//! Authentication by bearer token (a `TokenReview` on the seed's API server) and
//! authorisation by Kubernetes RBAC (a `SubjectAccessReview` per verb and resource). Both
//! answers are cached for a short time; tokens are kept only as cache keys in memory and
//! never written to a log or an error message.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use super::error::ApiError;

/// Entries per cache; when full, expired entries go, and if none had expired, all go.
const MAX_ENTRIES: usize = 4096;

/// Who a token belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a request wants to do, as RBAC sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    pub verb: &'static str,
    /// `ipampools` or `ipamallocations`.
    pub resource: &'static str,
    pub name: Option<String>,
}

struct Cache<K, V> {
    entries: HashMap<K, (Instant, V)>,
}

impl<K: std::hash::Hash + Eq, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Cache {
            entries: HashMap::new(),
        }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(until, _)| *until > now)
            .map(|(_, v)| v.clone())
    }

    fn put(&mut self, key: K, value: V, until: Instant, now: Instant) {
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.retain(|_, (u, _)| *u > now);
            if self.entries.len() >= MAX_ENTRIES {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (until, value));
    }
}

/// Asks the API server who a token is and what they may do.
pub struct Gate {
    client: Client,
    ttl: Duration,
    tokens: Mutex<Cache<String, Option<User>>>,
    decisions: Mutex<Cache<(User, Access), bool>>,
}

/// The bearer token of a request, or a 401 saying what is missing.
pub fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| {
            ApiError::unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        })?;
    let text = value
        .to_str()
        .map_err(|_| ApiError::unauthorized("the Authorization header is not readable text"))?;
    let (scheme, token) = text.split_once(' ').ok_or_else(|| {
        ApiError::unauthorized("the Authorization header must be \"Bearer <token>\"")
    })?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(ApiError::unauthorized(
            "the Authorization header must be \"Bearer <token>\"",
        ));
    }
    Ok(token)
}

impl Gate {
    /// `ttl` zero turns caching off.
    pub fn new(client: Client, ttl: Duration) -> Self {
        Gate {
            client,
            ttl,
            tokens: Mutex::new(Cache::new()),
            decisions: Mutex::new(Cache::new()),
        }
    }

    /// The user behind the request's token; 401 for a missing, invalid or anonymous token.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<User, ApiError> {
        let token = bearer(headers)?;
        let now = Instant::now();
        let cached = self
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&token.to_string(), now);
        let user = match cached {
            Some(user) => user,
            None => {
                let user = self.review_token(token).await?;
                if !self.ttl.is_zero() {
                    self.tokens.lock().unwrap_or_else(|p| p.into_inner()).put(
                        token.to_string(),
                        user.clone(),
                        now + self.ttl,
                        now,
                    );
                }
                user
            }
        };
        user.ok_or_else(|| ApiError::unauthorized("the token is not valid"))
    }

    /// 403 unless RBAC lets `user` do `access`.
    pub async fn authorize(&self, user: &User, access: Access) -> Result<(), ApiError> {
        let now = Instant::now();
        let key = (user.clone(), access);
        let cached = self
            .decisions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key, now);
        let allowed = match cached {
            Some(allowed) => allowed,
            None => {
                let allowed = self.review_access(&key.0, &key.1).await?;
                if !self.ttl.is_zero() {
                    self.decisions
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .put(key.clone(), allowed, now + self.ttl, now);
                }
                allowed
            }
        };
        if allowed {
            Ok(())
        } else {
            let (user, access) = key;
            let target = match &access.name {
                Some(n) => format!("{}.ipam.kipam.dev {n:?}", access.resource),
                None => format!("{}.ipam.kipam.dev", access.resource),
            };
            Err(ApiError::forbidden(format!(
                "user {:?} may not {} {target}",
                user.name, access.verb
            )))
        }
    }

    /// `None` when the API server does not accept the token (or it is anonymous).
    async fn review_token(&self, token: &str) -> Result<Option<User>, ApiError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        // RBAC: src/rbac.rs (tokenreviews create).
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| review_failed(e, "TokenReview"))?;
        let Some(status) = answer.status else {
            return Ok(None);
        };
        if status.authenticated != Some(true) {
            return Ok(None);
        }
        let Some(info) = status.user else {
            return Ok(None);
        };
        let name = info.username.unwrap_or_default();
        let groups = info.groups.unwrap_or_default();
        // Anonymous access is never allowed, whatever the API server's settings.
        if name.is_empty()
            || name == "system:anonymous"
            || groups.iter().any(|g| g == "system:unauthenticated")
        {
            return Ok(None);
        }
        Ok(Some(User {
            name,
            uid: info.uid,
            groups,
            extra: info.extra.unwrap_or_default().into_iter().collect(),
        }))
    }

    async fn review_access(&self, user: &User, access: &Access) -> Result<bool, ApiError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone().into_iter().collect()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some("ipam.kipam.dev".into()),
                    version: Some("v1alpha1".into()),
                    resource: Some(access.resource.into()),
                    verb: Some(access.verb.into()),
                    name: access.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        // RBAC: src/rbac.rs (subjectaccessreviews create).
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| review_failed(e, "SubjectAccessReview"))?;
        Ok(answer
            .status
            .is_some_and(|s| s.allowed && s.denied != Some(true)))
    }
}

/// A review that could not be made is never a pass: 503 (or 502 when kipam itself may not
/// create reviews), and the reason is logged without the token.
fn review_failed(e: kube::Error, what: &str) -> ApiError {
    let error = ApiError::from_kube(e, &format!("creating a {what}"));
    tracing::warn!(status = error.status.as_u16(), "{}", error.message);
    if error.status.is_client_error() {
        // Whatever the API server said about kipam's review is kipam's problem.
        return ApiError::new(axum::http::StatusCode::BAD_GATEWAY, error.message);
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::AUTHORIZATION,
            HeaderValue::from_str(value).unwrap(),
        );
        h
    }

    #[test]
    fn bearer_needs_the_scheme_and_a_token() {
        assert_eq!(bearer(&headers("Bearer abc")).unwrap(), "abc");
        assert_eq!(bearer(&headers("bearer  abc ")).unwrap(), "abc");
        for bad in ["Basic abc", "Bearer", "Bearer ", "abc"] {
            let e = bearer(&headers(bad)).unwrap_err();
            assert_eq!(e.status.as_u16(), 401, "{bad}");
            assert!(
                !e.message.contains("abc"),
                "the token is never echoed: {}",
                e.message
            );
        }
        assert_eq!(bearer(&HeaderMap::new()).unwrap_err().status.as_u16(), 401);
    }

    #[test]
    fn cache_entries_expire_and_the_cache_stays_bounded() {
        let mut c: Cache<u32, bool> = Cache::new();
        let now = Instant::now();
        c.put(1, true, now + Duration::from_secs(1), now);
        assert_eq!(c.get(&1, now), Some(true));
        assert_eq!(c.get(&1, now + Duration::from_secs(2)), None);
        for i in 0..(MAX_ENTRIES as u32 * 2) {
            c.put(i, true, now + Duration::from_secs(1), now);
        }
        assert!(c.entries.len() <= MAX_ENTRIES);
    }
}
