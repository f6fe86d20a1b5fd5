//! Watch streams: one JSON event per line over a chunked response, fed by a per-watcher
//! unbounded channel so that a slow reader never holds up writers.

use crate::Shared;
use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::selectors::Selectors;
use crate::store::{Change, ChangeKind, Shown, Subscription};
use crate::util::meta_mut;
use axum::body::{Body, Bytes};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

/// What a watch request asked for.
pub(crate) struct WatchOptions {
    /// Changes at or below this rv are not sent.
    pub after: u64,
    pub selectors: Selectors,
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: end the initial ADDED events with an `initial-events-end` bookmark.
    pub send_initial: bool,
    pub timeout: Option<Duration>,
    /// Answer `PartialObjectMetadata` instead of full objects.
    pub metadata_only: bool,
    pub bookmark_interval: Duration,
    /// Holds every change back this long before sending it (a lagging watch cache).
    pub delay: Duration,
}

/// Why a waiting watch stream woke up.
enum Wake {
    Stop,
    Change(Arc<Change>),
    Release,
    Bookmark,
}

struct WatchState {
    shared: Arc<Shared>,
    rt: ResourceType,
    opts: WatchOptions,
    pending: VecDeque<Bytes>,
    /// Changes received but held back by the configured delay, with their release time.
    delayed: VecDeque<(Instant, Arc<Change>)>,
    rx: Option<UnboundedReceiver<Arc<Change>>>,
    last_rv: u64,
    deadline: Option<Instant>,
    next_bookmark: Instant,
    shutdown: tokio::sync::watch::Receiver<bool>,
    done: bool,
}

/// One event line, `{"object":...,"type":...}` (the key order a JSON map gives them).
fn line(kind: &str, object: &impl Serialize) -> Bytes {
    #[derive(Serialize)]
    struct Event<'a, T> {
        object: &'a T,
        #[serde(rename = "type")]
        kind: &'a str,
    }
    // Writing JSON values into memory cannot fail.
    let mut out = serde_json::to_vec(&Event { object, kind }).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

impl WatchState {
    /// The event line for `obj`, rendered straight from the stored object (a large object is
    /// serialized once per watcher, never copied).
    fn render(&self, kind: &str, obj: &Arc<Value>) -> Bytes {
        if self.opts.metadata_only {
            let partial = json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
            });
            line(kind, &partial)
        } else {
            line(kind, &*Shown::new(&self.rt, obj))
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let (api_version, kind) = if self.opts.metadata_only {
            (
                "meta.k8s.io/v1".to_string(),
                "PartialObjectMetadata".to_string(),
            )
        } else {
            (self.rt.api_version(), self.rt.kind.clone())
        };
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if initial_end {
            metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        line(
            "BOOKMARK",
            &json!({ "apiVersion": api_version, "kind": kind, "metadata": metadata }),
        )
    }

    /// Turns a stored change into what this watcher sees, selectors considered: an object
    /// that starts matching is ADDED, one that stops matching is DELETED.
    fn push_change(&mut self, c: &Change) {
        if c.rv <= self.opts.after {
            return;
        }
        self.last_rv = self.last_rv.max(c.rv);
        let sel = &self.opts.selectors;
        let now = sel.matches(&c.object);
        let before = c.previous.as_ref().is_some_and(|p| sel.matches(p));
        let event = match c.kind {
            ChangeKind::Added => now.then(|| self.render("ADDED", &c.object)),
            ChangeKind::Modified => match (before, now) {
                (true, true) => Some(self.render("MODIFIED", &c.object)),
                (false, true) => Some(self.render("ADDED", &c.object)),
                (true, false) => {
                    // The last state this watcher could see, stamped with the change's rv.
                    let mut last = c.previous.as_deref().cloned().unwrap_or(Value::Null);
                    if last.is_object() {
                        meta_mut(&mut last)
                            .insert("resourceVersion".into(), json!(c.rv.to_string()));
                    }
                    Some(self.render("DELETED", &Arc::new(last)))
                }
                (false, false) => None,
            },
            ChangeKind::Deleted => (before || now).then(|| self.render("DELETED", &c.object)),
        };
        if let Some(event) = event {
            self.pending.push_back(event);
        }
    }

    /// Queues everything already in the channel, then a bookmark no older than any of it.
    fn push_bookmark(&mut self) {
        let rv = self
            .shared
            .store
            .lock()
            .map(|s| s.current_rv())
            .unwrap_or(self.last_rv);
        let mut drained = Vec::new();
        if let Some(rx) = self.rx.as_mut() {
            while let Ok(c) = rx.try_recv() {
                drained.push(c);
            }
        }
        for c in drained {
            self.receive(c);
        }
        // While changes are held back, a bookmark may only claim what was actually sent.
        let rv = if self.delayed.is_empty() {
            rv.max(self.last_rv).max(self.opts.after)
        } else {
            self.last_rv.max(self.opts.after)
        };
        self.pending.push_back(self.bookmark(rv, false));
    }

    /// Sends a change now, or holds it back when a delay is configured.
    fn receive(&mut self, c: Arc<Change>) {
        if self.opts.delay.is_zero() {
            self.push_change(&c);
        } else {
            self.delayed
                .push_back((Instant::now() + self.opts.delay, c));
        }
    }

    /// Sends the held-back changes whose time has come.
    fn release(&mut self) {
        let now = Instant::now();
        while self.delayed.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, c)) = self.delayed.pop_front() {
                self.push_change(&c);
            }
        }
    }

    async fn next(mut self) -> Option<(Result<Bytes, Infallible>, Self)> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Some((Ok(b), self));
            }
            if self.done {
                return None;
            }
            let deadline = self.deadline;
            let bookmarks = self.opts.bookmarks;
            let next_bookmark = self.next_bookmark;
            let release_at = self.delayed.front().map(|(at, _)| *at);
            let rx = self.rx.as_mut()?;
            let wake = tokio::select! {
                biased;
                _ = self.shutdown.wait_for(|v| *v) => Wake::Stop,
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => Wake::Stop,
                msg = rx.recv() => match msg {
                    Some(c) => Wake::Change(c),
                    None => Wake::Stop,
                },
                _ = tokio::time::sleep_until(release_at.unwrap_or_else(Instant::now)), if release_at.is_some() => Wake::Release,
                _ = tokio::time::sleep_until(next_bookmark), if bookmarks => Wake::Bookmark,
            };
            match wake {
                Wake::Stop => self.done = true,
                Wake::Change(c) => self.receive(c),
                Wake::Release => self.release(),
                Wake::Bookmark => {
                    self.push_bookmark();
                    self.next_bookmark = Instant::now() + self.opts.bookmark_interval;
                }
            }
        }
    }
}

/// Builds the streaming body of a watch response. A subscription that failed (a resource
/// version older than the retained history) yields a single ERROR event, as the real server
/// does for `410 Expired`.
pub(crate) fn watch_body(
    shared: Arc<Shared>,
    rt: ResourceType,
    sub: Result<Subscription, ApiError>,
    opts: WatchOptions,
) -> Body {
    let shutdown = shared.shutdown.subscribe();
    let mut state = WatchState {
        shared,
        rt,
        pending: VecDeque::new(),
        delayed: VecDeque::new(),
        rx: None,
        last_rv: opts.after,
        deadline: opts.timeout.map(|t| Instant::now() + t),
        next_bookmark: Instant::now() + opts.bookmark_interval,
        shutdown,
        done: false,
        opts,
    };
    match sub {
        Err(e) => {
            state.pending.push_back(line("ERROR", &e.to_status()));
            state.done = true;
        }
        Ok(sub) => {
            for obj in &sub.initial {
                if state.opts.selectors.matches(obj) {
                    let event = state.render("ADDED", obj);
                    state.pending.push_back(event);
                }
            }
            for c in &sub.replay {
                state.push_change(c);
            }
            if state.opts.send_initial {
                let b = state.bookmark(sub.start_rv, true);
                state.pending.push_back(b);
            }
            state.rx = Some(sub.rx);
        }
    }
    Body::from_stream(futures::stream::unfold(state, WatchState::next))
}
