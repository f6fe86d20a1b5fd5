//! A watch of a user cluster's objects that holds nothing between events.
//!
//! kube's `watcher` reads a watch response through a line decoder whose buffer is 8 KiB from
//! the start and never shrinks, plus the state of a general stream around it. With growth on,
//! kipam holds three watches open in every user cluster for as long as it serves it (two
//! drift watches and the demand reader's Services), so at 10,000 user clusters those buffers
//! alone were about 250 MB of mostly empty memory. This watch keeps, between events, only the
//! response it reads from (a stream on the user cluster's one HTTP/2 connection), the last
//! `resourceVersion` and its parameters: an event's line is read into a buffer made for it and
//! dropped once the event is decoded.
//!
//! It yields what kube's `watcher` yields, in the same order and with the same errors, so the
//! rooms and kube's backoff treat both alike:
//! - `Init`, an `InitApply` for every listed object, `InitDone` (a list in pages of
//!   [`PAGE`]), then `Apply` and `Delete` from a watch that starts at the list's
//!   `resourceVersion` with bookmarks on.
//! - A watch the server ends (its `timeoutSeconds`, [`TIMEOUT`]) or that stays silent
//!   [`IDLE_MARGIN`] longer is started again from the last `resourceVersion` seen, without an
//!   error and without listing again.
//! - An `ERROR` event is passed on as `WatchError`; a `410 Expired` one (the history was
//!   compacted) makes the next step list again, as does an object without a
//!   `resourceVersion` (`NoResourceVersion`).
//! - A failed list is `InitialListFailed` (the next step lists again), a refused watch
//!   `WatchStartFailed` and a broken response `WatchFailed` (the next step watches again from
//!   the last `resourceVersion`); a line that is not an event is `WatchFailed` and the watch
//!   goes on. Backing off between failures is the caller's (kube's `default_backoff`).
//!
//! Only what kipam asks of user clusters is offered: selectors, and metadata-only reads for a
//! `PartialObjectMeta` (as kube's `Api` decides them); no streaming lists.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{AsyncBufRead, AsyncBufReadExt, StreamExt};
use kube::api::{ListParams, WatchParams};
use kube::core::{ObjectList, Request, WatchEvent};
use kube::runtime::watcher::{Error, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Objects per list page (client-go's and kube's default).
pub const PAGE: u32 = 500;
/// The `timeoutSeconds` of a watch request unless [`Params::timeout`] says otherwise (kube's
/// default).
pub const TIMEOUT: u32 = 290;
/// How much longer than its `timeoutSeconds` a watch may stay silent, bookmarks included,
/// before it is started again: only a response that hangs meets it.
pub const IDLE_MARGIN: Duration = Duration::from_secs(5);

/// What a watch asks for beyond its resource.
#[derive(Clone, Debug, Default)]
pub struct Params {
    pub labels: Option<String>,
    pub fields: Option<String>,
    /// The `timeoutSeconds` of each watch request ([`TIMEOUT`] when `None`).
    pub timeout: Option<u32>,
}

/// Watches `api`'s objects (its resource and namespace); see the module's documentation.
pub fn watch<K>(api: Api<K>, params: Params) -> BoxStream<'static, Result<Event<K>, Error>>
where
    K: Resource + Clone + DeserializeOwned + Send + 'static,
{
    let watch = Watch {
        request: Request::new(api.resource_url()),
        client: api.into_client(),
        params,
        metadata_only: K::metadata_api(),
    };
    futures::stream::unfold((watch, State::Empty), |(watch, state)| async move {
        let mut state = state;
        loop {
            let (event, next) = watch.step(state).await;
            state = next;
            if let Some(event) = event {
                return Some((event, (watch, state)));
            }
        }
    })
    .boxed()
}

struct Watch {
    client: Client,
    request: Request,
    params: Params,
    /// Metadata only (`K` is a `PartialObjectMeta`): the server sends no spec or status.
    metadata_only: bool,
}

/// A response to a watch request, read a line at a time.
type Body = Pin<Box<dyn AsyncBufRead + Send>>;

enum State<K> {
    /// Nothing listed yet, or the list must be made again.
    Empty,
    /// A list page is being handed out.
    Page {
        objects: VecDeque<K>,
        continue_token: Option<String>,
        resource_version: Option<String>,
    },
    /// Listed up to `resource_version`; a watch is to be started from there.
    Listed { resource_version: String },
    Watching {
        resource_version: String,
        body: Body,
    },
}

impl Watch {
    fn list_params(&self, continue_token: Option<String>) -> ListParams {
        ListParams {
            label_selector: self.params.labels.clone(),
            field_selector: self.params.fields.clone(),
            limit: Some(PAGE),
            continue_token,
            ..ListParams::default()
        }
    }

    fn timeout(&self) -> u32 {
        self.params.timeout.unwrap_or(TIMEOUT)
    }

    fn watch_params(&self) -> WatchParams {
        WatchParams {
            label_selector: self.params.labels.clone(),
            field_selector: self.params.fields.clone(),
            timeout: Some(self.timeout()),
            bookmarks: true,
            send_initial_events: false,
        }
    }

    async fn list<K: Clone + DeserializeOwned>(
        &self,
        continue_token: Option<String>,
    ) -> Result<ObjectList<K>, kube::Error> {
        let params = self.list_params(continue_token);
        let request = if self.metadata_only {
            self.request.list_metadata(&params)
        } else {
            self.request.list(&params)
        }
        .map_err(kube::Error::BuildRequest)?;
        self.client.request::<ObjectList<K>>(request).await
    }

    async fn start(&self, resource_version: &str) -> Result<Body, kube::Error> {
        let params = self.watch_params();
        let request = if self.metadata_only {
            self.request.watch_metadata(&params, resource_version)
        } else {
            self.request.watch(&params, resource_version)
        }
        .map_err(kube::Error::BuildRequest)?;
        Ok(Box::pin(self.client.request_stream(request).await?))
    }

    /// One step: at most one event, and the state to go on from.
    async fn step<K>(&self, state: State<K>) -> (Option<Result<Event<K>, Error>>, State<K>)
    where
        K: Resource + Clone + DeserializeOwned,
    {
        match state {
            State::Empty => (
                Some(Ok(Event::Init)),
                State::Page {
                    objects: VecDeque::new(),
                    continue_token: None,
                    resource_version: None,
                },
            ),
            State::Page {
                mut objects,
                continue_token,
                resource_version,
            } => {
                if let Some(object) = objects.pop_front() {
                    let next = State::Page {
                        objects,
                        continue_token,
                        resource_version,
                    };
                    return (Some(Ok(Event::InitApply(object))), next);
                }
                if continue_token.is_none()
                    && let Some(resource_version) = resource_version
                {
                    return (
                        Some(Ok(Event::InitDone)),
                        State::Listed { resource_version },
                    );
                }
                // Boxed, here and below: a request's future is large, and the stream would
                // otherwise be sized by it for as long as it watches.
                match Box::pin(self.list::<K>(continue_token)).await {
                    Ok(list) => {
                        let resource_version =
                            list.metadata.resource_version.filter(|v| !v.is_empty());
                        let continue_token = list.metadata.continue_.filter(|c| !c.is_empty());
                        if resource_version.is_none() && continue_token.is_none() {
                            return (Some(Err(Error::NoResourceVersion)), State::Empty);
                        }
                        let next = State::Page {
                            objects: list.items.into(),
                            continue_token,
                            resource_version,
                        };
                        (None, next)
                    }
                    Err(e) => (Some(Err(Error::InitialListFailed(e))), State::Empty),
                }
            }
            State::Listed { resource_version } => {
                match Box::pin(self.start(&resource_version)).await {
                    Ok(body) => (
                        None,
                        State::Watching {
                            resource_version,
                            body,
                        },
                    ),
                    Err(e) => (
                        Some(Err(Error::WatchStartFailed(e))),
                        State::Listed { resource_version },
                    ),
                }
            }
            State::Watching {
                resource_version,
                mut body,
            } => {
                // Made for this event and dropped with it: nothing is held while the watch
                // waits.
                let mut line = Vec::new();
                let idle = Duration::from_secs(self.timeout().into()) + IDLE_MARGIN;
                let read = tokio::time::timeout(idle, body.read_until(b'\n', &mut line)).await;
                match read {
                    // The server ended the response, or it hung: watch again from here.
                    Err(_) | Ok(Ok(0)) => (None, State::Listed { resource_version }),
                    Ok(Err(e)) => (
                        Some(Err(Error::WatchFailed(kube::Error::ReadEvents(e)))),
                        State::Listed { resource_version },
                    ),
                    // A last line cut short: the response ended in it.
                    Ok(Ok(_)) if line.last() != Some(&b'\n') => {
                        (None, State::Listed { resource_version })
                    }
                    Ok(Ok(_)) => Self::event(&line, resource_version, body),
                }
            }
        }
    }

    /// What one line of a watch response means.
    fn event<K>(
        line: &[u8],
        resource_version: String,
        body: Body,
    ) -> (Option<Result<Event<K>, Error>>, State<K>)
    where
        K: Resource + Clone + DeserializeOwned,
    {
        let watching = |resource_version| State::Watching {
            resource_version,
            body,
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            return (None, watching(resource_version));
        }
        let event = match serde_json::from_slice::<WatchEvent<K>>(line) {
            Ok(event) => event,
            Err(e) => {
                let e = Error::WatchFailed(kube::Error::SerdeError(e));
                return (Some(Err(e)), watching(resource_version));
            }
        };
        let (object, deleted) = match event {
            WatchEvent::Added(object) | WatchEvent::Modified(object) => (object, false),
            WatchEvent::Deleted(object) => (object, true),
            WatchEvent::Bookmark(mark) => {
                return (None, watching(mark.metadata.resource_version));
            }
            WatchEvent::Error(status) => {
                let next = if status.code == 410 {
                    State::Empty
                } else {
                    watching(resource_version)
                };
                return (Some(Err(Error::WatchError(status))), next);
            }
        };
        let Some(seen) = object.resource_version().filter(|v| !v.is_empty()) else {
            return (Some(Err(Error::NoResourceVersion)), State::Empty);
        };
        let event = if deleted {
            Event::Delete(object)
        } else {
            Event::Apply(object)
        };
        (Some(Ok(event)), watching(seen))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::PartialObjectMeta;
    use kube_standin::ApiServer;
    use serde_json::json;

    use super::*;
    use crate::seed::tenants::client_of;

    fn config_map(user: &ApiServer, name: &str, labelled: bool) {
        let labels = if labelled {
            json!({"watched": "yes"})
        } else {
            json!({})
        };
        user.apply(&json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "data": {"k": "v"},
        }))
        .expect("config map");
    }

    /// What a step of the watch yielded, in a form a test can compare.
    fn said<K: Resource<DynamicType = ()>>(event: Option<Result<Event<K>, Error>>) -> String {
        let name = |k: &K| k.meta().name.clone().unwrap_or_default();
        match event {
            None => "ended".to_string(),
            Some(Ok(Event::Init)) => "init".to_string(),
            Some(Ok(Event::InitApply(k))) => format!("listed {}", name(&k)),
            Some(Ok(Event::InitDone)) => "listed all".to_string(),
            Some(Ok(Event::Apply(k))) => format!("apply {}", name(&k)),
            Some(Ok(Event::Delete(k))) => format!("delete {}", name(&k)),
            Some(Err(Error::WatchError(status))) => format!("error {}", status.code),
            Some(Err(e)) => format!("failed: {e}"),
        }
    }

    async fn next<K: Resource<DynamicType = ()>>(
        events: &mut BoxStream<'static, Result<Event<K>, Error>>,
    ) -> String {
        match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
            Ok(event) => said(event),
            Err(_) => "nothing for 10 s".to_string(),
        }
    }

    /// Lists what the selector picks, then follows it; a watch the server ends is started
    /// again from where it was, with no new list and nothing missed or repeated.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lists_then_follows_and_resumes_a_watch_the_server_ended() {
        let user = ApiServer::start().await.expect("stand-in");
        config_map(&user, "a", true);
        config_map(&user, "b", true);
        config_map(&user, "other", false);
        let api: Api<ConfigMap> = Api::namespaced(client_of(&user).await, "default");
        let params = Params {
            labels: Some("watched=yes".to_string()),
            timeout: Some(1),
            ..Params::default()
        };
        let mut events = watch(api, params);
        let mut first = Vec::new();
        for _ in 0..4 {
            first.push(next(&mut events).await);
        }
        assert_eq!(first, ["init", "listed a", "listed b", "listed all"]);

        config_map(&user, "c", true);
        assert_eq!(next(&mut events).await, "apply c");
        // The server ends each watch after a second: this change comes on a later one.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        config_map(&user, "other", false);
        user.delete("configmaps", Some("default"), "a")
            .expect("delete");
        assert_eq!(next(&mut events).await, "delete a");
        let stats = user.stats();
        assert_eq!(stats.count("list", "configmaps"), 1, "{stats:?}");
        assert_eq!(stats.count("watch", "configmaps"), 2, "{stats:?}");
    }

    /// A watch that can no longer resume (the history it starts from was compacted) says
    /// `410` and lists again, so what changed meanwhile is not lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_expired_resource_version_lists_again() {
        let user = ApiServer::start().await.expect("stand-in");
        config_map(&user, "a", true);
        let api: Api<ConfigMap> = Api::namespaced(client_of(&user).await, "default");
        let mut events = watch(api, Params::default());
        for expected in ["init", "listed a", "listed all"] {
            assert_eq!(next(&mut events).await, expected);
        }
        // Listed; the watch starts with the next step, from a version compacted by then.
        config_map(&user, "b", true);
        user.compact_history();
        let mut then = Vec::new();
        for _ in 0..5 {
            then.push(next(&mut events).await);
        }
        assert_eq!(
            then,
            ["error 410", "init", "listed a", "listed b", "listed all"]
        );
        assert_eq!(user.stats().count("list", "configmaps"), 2);
    }

    /// A `PartialObjectMeta` watch asks for metadata only, and the server sends no data.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_metadata_watch_receives_no_data() {
        let user = ApiServer::start().await.expect("stand-in");
        config_map(&user, "a", true);
        let api: Api<PartialObjectMeta<ConfigMap>> =
            Api::namespaced(client_of(&user).await, "default");
        let mut events = watch(api, Params::default());
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let event = tokio::time::timeout(Duration::from_secs(10), events.next())
                .await
                .expect("an event")
                .expect("not ended");
            match event.expect("no error") {
                Event::InitDone => config_map(&user, "b", true),
                Event::InitApply(m) | Event::Apply(m) => seen.push(m),
                _ => {}
            }
        }
        let names: Vec<_> = seen.iter().map(|m| m.name_any()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(seen.iter().all(|m| m.types.as_ref().map(|t| t.kind.as_str())
            == Some("PartialObjectMetadata")));
    }
}
