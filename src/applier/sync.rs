//! One user cluster's sync: render its Addons, apply every object with server-side apply, prune
//! what is no longer rendered, write the statuses.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersion;
use kube::core::PartialObjectMeta;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::drift::Stamp;
use super::metrics::Metrics;
use super::summary::{self, Failure, Outcome, Reason};
use super::{FIELD_MANAGER, FINALIZER, kubeconfig};
use crate::desired::template_data;
use crate::render::Renderer;
use crate::resources::bounds::MAX_APPLIED_OBJECTS;
use crate::resources::{Addon, AddonStatus, AppliedObject, Cluster, IPAMAllocation};
use crate::seed::ledger::Entry;
use crate::seed::{Context, preconditions, tenants};

/// Everything one sync of a user cluster looks at, taken from the caches at one moment.
pub struct TenantInput {
    pub cluster_name: String,
    pub namespace: String,
    pub cluster: Option<Arc<Cluster>>,
    pub addons: Vec<Arc<Addon>>,
    /// The cluster's allocations, from the ledger.
    pub allocations: Vec<Arc<Entry>>,
    /// The kubeconfig Secret's metadata, when the Cluster names one and it exists.
    pub secret: Option<Arc<PartialObjectMeta<Secret>>>,
    /// The pools of those allocations, for their networks.
    pub pools: Vec<Arc<crate::resources::IPAMPool>>,
    /// The failure this replica last said in its log for the cluster (see
    /// [`SyncReport::said`]).
    pub said: Option<String>,
}

/// A user cluster's parsed configuration and what discovery found there, kept between syncs
/// until the Secret changes.
pub struct TenantClient {
    /// `uid/resourceVersion/key` of the Secret it was built from.
    pub source: String,
    /// The user cluster's shared client (`seed::tenants`): one connection for the syncs and
    /// the watches of every room.
    pub client: Client,
    /// `apiVersion` -> the resources discovery found there.
    pub kinds: HashMap<String, Vec<(ApiResource, ApiCapabilities)>>,
    /// Addon name -> what this process last applied there.
    pub applied: HashMap<String, Memory>,
    /// Per object, what this process's last apply of it returned (for the drift watches,
    /// which share it once the sync ends; a sync that changes it makes its own copy).
    pub stamps: Arc<BTreeMap<AppliedObject, Stamp>>,
}

/// What this process knows it applied for one Addon. The Addon's status says the same once
/// the watch cache catches up with kipam's own status write; until then this is the truth, so
/// a sync right after another never forgets an object (and so never fails to prune it).
#[derive(Clone, Debug, Default)]
pub struct Memory {
    /// Hash of the output last applied completely; `None` after a failure.
    pub hash: Option<String>,
    /// Every object that may exist in the user cluster because of this Addon.
    pub objects: Vec<AppliedObject>,
    /// The status this process last wrote.
    pub written: Option<AddonStatus>,
}

impl TenantClient {
    /// The cached status with the remembered objects added to its inventory.
    fn with_memory(&self, addon: &str, cached: &AddonStatus) -> AddonStatus {
        let mut status = cached.clone();
        if let Some(memory) = self.applied.get(addon) {
            status.applied_objects =
                summary::inventory_after_failure(&cached.applied_objects, &memory.objects, &[]);
        }
        status
    }
}

/// What the scheduler learns from a sync.
pub struct SyncReport {
    /// Everything in sync (or nothing to do): no retry before the next change or resync.
    pub settled: bool,
    /// The `AddonsReady` condition written, `(status, reason, message)`.
    pub addons_ready: Option<(bool, String, String)>,
    /// A failure only a change mends, said once in the log: kept so that a sync run again
    /// before the Addons' statuses showing it reach the cache does not say it again.
    pub said: Option<String>,
}

/// What the caller keeps per user cluster across syncs.
pub type ClientSlot = Option<TenantClient>;

pub async fn sync_tenant(
    ctx: &Context,
    metrics: &Metrics,
    renderer: &Arc<Renderer>,
    timeout: std::time::Duration,
    input: TenantInput,
    force: bool,
    slot: &mut ClientSlot,
) -> SyncReport {
    let now = crate::resources::now_rfc3339();
    let cluster = match &input.cluster {
        Some(c) if c.metadata.deletion_timestamp.is_none() => c.clone(),
        _ => {
            // Nothing more is applied there, so nothing is watched there either.
            if let Some(t) = slot.as_mut() {
                t.stamps = Arc::default();
            }
            return release_addons(ctx, &input).await;
        }
    };

    // Finalizers first: an Addon deleted after this point still gets its objects pruned.
    let mut settled = true;
    let mut live = Vec::new();
    let mut deleting = Vec::new();
    for addon in &input.addons {
        if addon.metadata.deletion_timestamp.is_some() {
            if has_finalizer(addon) {
                deleting.push(addon.clone());
            }
            continue;
        }
        if !has_finalizer(addon)
            && let Err(e) = add_finalizer(ctx, addon).await
        {
            tracing::warn!(cluster = %cluster_of(addon), addon = %key(addon), error = %preconditions::short(&e), "cannot add the addon finalizer (retrying)");
            settled = false;
            continue;
        }
        live.push(addon.clone());
    }

    // A deleted Addon that never applied anything goes at once, reachable user cluster or not
    // (a Cluster without a usable kubeconfig must not keep its Addons forever).
    let mut with_objects = Vec::new();
    for addon in deleting {
        let name = addon.name_any();
        let cached = addon.status.clone().unwrap_or_default();
        let remembered = slot
            .as_ref()
            .and_then(|t| t.applied.get(&name))
            .is_some_and(|m| !m.objects.is_empty());
        if cached.applied_objects.is_empty() && !remembered {
            if let Err(e) = remove_finalizer(ctx, &addon).await {
                tracing::warn!(cluster = %cluster_of(&addon), addon = %key(&addon), error = %preconditions::short(&e), "cannot remove the addon finalizer (retrying)");
                settled = false;
            }
        } else {
            with_objects.push(addon);
        }
    }
    let deleting = with_objects;

    // Render every live Addon (no network; each render runs in the memory-bounded sandbox
    // process, so it waits on a pipe: off the async runtime).
    let rendered: Vec<(Arc<Addon>, Rendered)> = {
        let (renderer, cluster, addons) = (renderer.clone(), cluster.clone(), live.clone());
        let allocations: Vec<IPAMAllocation> =
            input.allocations.iter().map(|a| a.to_object()).collect();
        let pools = input.pools.clone();
        let job = tokio::task::spawn_blocking(move || {
            addons
                .iter()
                .map(|addon| {
                    (
                        addon.clone(),
                        render(&renderer, &cluster, addon, &allocations, &pools),
                    )
                })
                .collect()
        });
        match job.await {
            Ok(rendered) => rendered,
            Err(e) => live
                .iter()
                .map(|addon| {
                    let failure = Failure {
                        reason: Reason::TemplateError,
                        message: format!("rendering stopped: {e}"),
                    };
                    (addon.clone(), Err(failure))
                })
                .collect(),
        }
    };

    let client = match client_for(ctx, &cluster, input.secret.as_deref(), slot, timeout).await {
        Ok(client) => client,
        Err((message, transient)) => {
            let failure = Failure {
                reason: Reason::KubeconfigInvalid,
                message,
            };
            metrics.addon_failed(failure.reason.as_str());
            // Unless the Secret could not be read (tried again with backoff), only a change of
            // the Cluster or of its Secret mends this, and either syncs the cluster again at
            // once (so does the periodic resync). Retrying meanwhile would only delay that
            // sync behind a grown backoff, and say the same thing again: one line when the
            // failure is news.
            if input.said.as_deref() == Some(failure.message.as_str())
                || every_addon_reports(&rendered, &failure)
            {
                tracing::debug!(
                    cluster = %input.cluster_name,
                    reason = failure.reason.as_str(),
                    "{} (unchanged)",
                    failure.message
                );
            } else {
                tracing::warn!(
                    cluster = %input.cluster_name,
                    reason = failure.reason.as_str(),
                    "{} ({})",
                    failure.message,
                    if transient {
                        "retrying with backoff"
                    } else {
                        "kipam tries again when the Cluster or its kubeconfig Secret changes"
                    }
                );
            }
            let mut statuses = Vec::new();
            for (addon, result) in &rendered {
                let cached = addon.status.clone().unwrap_or_default();
                let previous = match slot.as_ref() {
                    Some(t) => t.with_memory(&addon.name_any(), &cached),
                    None => cached.clone(),
                };
                let next = summary::unreachable_status(
                    &previous,
                    result.as_ref().map(|_| ()),
                    &failure,
                    addon.metadata.generation,
                    &now,
                );
                write_status(ctx, addon, &cached, None, &next).await;
                statuses.push((addon.name_any(), next));
            }
            let ready = summary::addons_ready(&statuses);
            let written = write_addons_ready(ctx, &cluster, &ready, &now).await;
            return SyncReport {
                // A failed read of the Secret is tried again, with backoff.
                settled: written && !transient,
                addons_ready: Some(ready),
                said: Some(failure.message),
            };
        }
    };
    let Some(tenant) = slot.as_mut() else {
        return SyncReport {
            settled: false,
            addons_ready: None,
            said: None,
        };
    };

    let claims = Claims::new(&rendered, tenant.client.default_namespace());
    let mut statuses = Vec::new();
    for (addon, result) in rendered {
        if !ctx.leader.holds() {
            return SyncReport {
                settled: false,
                addons_ready: None,
                said: None,
            };
        }
        let cached = addon.status.clone().unwrap_or_default();
        let name = addon.name_any();
        let previous = tenant.with_memory(&name, &cached);
        let remembered = tenant.applied.get(&name).cloned().unwrap_or_default();
        let result = result.and_then(|(objects, hash)| match claims.taken(&name, &objects) {
            Some(message) => Err(Failure {
                reason: Reason::TemplateError,
                message,
            }),
            None => Ok((objects, hash)),
        });
        let skipped = !force
            && matches!(&result, Ok((_, hash)) if remembered.hash.as_deref() == Some(hash.as_str()));
        let outcome = match result {
            Err(failure) => Outcome::RenderFailed(failure),
            // Applied by this process with exactly this output, and nothing failed since: a
            // change elsewhere that renders the same needs no request (the next resync still
            // re-applies, repairing drift).
            Ok((_, hash)) if skipped => Outcome::Synced {
                applied: remembered.objects,
                hash,
            },
            Ok((objects, hash)) => {
                apply_addon(
                    ctx, metrics, &client, tenant, &claims, &addon, &previous, objects, hash,
                )
                .await
            }
        };
        if !matches!(outcome, Outcome::Synced { .. }) {
            settled = false;
        }
        let last = tenant.applied.get(&name).and_then(|m| m.written.clone());
        if let Outcome::ApplyFailed { failure, .. } | Outcome::RenderFailed(failure) = &outcome {
            metrics.addon_failed(failure.reason.as_str());
            if already_reported(last.as_ref(), failure) {
                tracing::debug!(
                    cluster = %input.cluster_name,
                    addon = %key(&addon),
                    reason = failure.reason.as_str(),
                    "still failing (retrying with backoff)"
                );
            } else {
                tracing::warn!(
                    cluster = %input.cluster_name,
                    addon = %key(&addon),
                    reason = failure.reason.as_str(),
                    "{} (retrying with backoff)",
                    failure.message
                );
            }
        }
        let mut next = summary::addon_status(&previous, &outcome, addon.metadata.generation, &now);
        if skipped
            && let Some(at) = last
                .as_ref()
                .and_then(|w| w.last_applied_time.clone())
                .or_else(|| previous.last_applied_time.clone())
        {
            // Nothing was sent: the last apply is still the one before.
            next.last_applied_time = Some(at);
        }
        tenant.applied.insert(
            name.clone(),
            Memory {
                hash: match &outcome {
                    Outcome::Synced { hash, .. } => Some(hash.clone()),
                    _ => None,
                },
                objects: next.applied_objects.clone(),
                written: Some(next.clone()),
            },
        );
        write_status(ctx, &addon, &cached, last.as_ref(), &next).await;
        statuses.push((name, next));
    }

    for addon in deleting {
        if !ctx.leader.holds() {
            return SyncReport {
                settled: false,
                addons_ready: None,
                said: None,
            };
        }
        let cached = addon.status.clone().unwrap_or_default();
        let name = addon.name_any();
        let previous = tenant.with_memory(&name, &cached);
        let mut left = Vec::new();
        let mut failure = None;
        for object in &previous.applied_objects {
            if claims.rendered_by_other(&name, object) {
                // Another Addon of this cluster renders it now: it stays.
                continue;
            }
            if let Err(f) = delete_object(ctx, metrics, &client, tenant, object).await {
                failure.get_or_insert(f);
                left.push(object.clone());
            }
        }
        match failure {
            None => {
                tenant.applied.remove(&name);
                if let Err(e) = remove_finalizer(ctx, &addon).await {
                    tracing::warn!(cluster = %cluster_of(&addon), addon = %key(&addon), error = %preconditions::short(&e), "cannot remove the addon finalizer (retrying)");
                    settled = false;
                }
            }
            Some(failure) => {
                settled = false;
                metrics.addon_failed(failure.reason.as_str());
                tracing::warn!(
                    cluster = %input.cluster_name,
                    addon = %key(&addon),
                    reason = failure.reason.as_str(),
                    "the deleted Addon's objects cannot be pruned yet: {} (retrying with backoff)",
                    failure.message
                );
                let next = summary::addon_status(
                    &previous,
                    &Outcome::ApplyFailed {
                        failure,
                        applied: Vec::new(),
                        not_pruned: left.clone(),
                    },
                    addon.metadata.generation,
                    &now,
                );
                let next = AddonStatus {
                    applied_objects: left,
                    ..next
                };
                let last = tenant.applied.get(&name).and_then(|m| m.written.clone());
                tenant.applied.insert(
                    name.clone(),
                    Memory {
                        hash: None,
                        objects: next.applied_objects.clone(),
                        written: Some(next.clone()),
                    },
                );
                write_status(ctx, &addon, &cached, last.as_ref(), &next).await;
            }
        }
    }

    let ready = summary::addons_ready(&statuses);
    let written = write_addons_ready(ctx, &cluster, &ready, &now).await;
    SyncReport {
        settled: settled && written,
        addons_ready: Some(ready),
        said: None,
    }
}

/// True when every Addon's `Applied` condition already says `failure`.
fn every_addon_reports(rendered: &[(Arc<Addon>, Rendered)], failure: &Failure) -> bool {
    rendered.iter().all(|(addon, _)| {
        addon
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Applied"))
            .is_some_and(|c| c.reason == failure.reason.as_str() && c.message == failure.message)
    })
}

/// The Cluster is gone or being deleted: nothing is applied or pruned in its user cluster (it
/// may well be unreachable for good); the Addons' finalizers are dropped so the namespace can
/// go. Before dropping one that still tracks objects, the Cluster's absence is confirmed with a
/// GET, so a lagging cache never leaves objects behind in a cluster that still exists.
async fn release_addons(ctx: &Context, input: &TenantInput) -> SyncReport {
    let mut settled = true;
    let deleting: Vec<&Arc<Addon>> = input
        .addons
        .iter()
        .filter(|a| a.metadata.deletion_timestamp.is_some() && has_finalizer(a))
        .collect();
    if deleting.is_empty() {
        return SyncReport {
            settled,
            addons_ready: None,
            said: None,
        };
    }
    if input.cluster.is_none()
        && deleting.iter().any(|a| {
            a.status
                .as_ref()
                .is_some_and(|s| !s.applied_objects.is_empty())
        })
    {
        // RBAC: src/rbac.rs (clusters get).
        let api: Api<Cluster> = Api::all(ctx.writer.clone());
        match api.get_opt(&input.cluster_name).await {
            Ok(None) => {}
            Ok(Some(c)) if c.metadata.deletion_timestamp.is_some() => {}
            Ok(Some(_)) | Err(_) => {
                return SyncReport {
                    settled: false,
                    addons_ready: None,
                    said: None,
                };
            }
        }
    }
    for addon in deleting {
        if let Err(e) = remove_finalizer(ctx, addon).await {
            tracing::warn!(cluster = %cluster_of(addon), addon = %key(addon), error = %preconditions::short(&e), "cannot remove the addon finalizer (retrying)");
            settled = false;
        }
    }
    SyncReport {
        settled,
        addons_ready: None,
        said: None,
    }
}

/// The user cluster an Addon belongs to (from its namespace), for log fields.
fn cluster_of(addon: &Addon) -> String {
    addon
        .namespace()
        .as_deref()
        .and_then(crate::resources::cluster_of_namespace)
        .unwrap_or_default()
        .to_string()
}

fn key(addon: &Addon) -> String {
    format!(
        "{}/{}",
        addon.namespace().unwrap_or_default(),
        addon.name_any()
    )
}

fn has_finalizer(addon: &Addon) -> bool {
    addon.finalizers().iter().any(|f| f == FINALIZER)
}

async fn add_finalizer(ctx: &Context, addon: &Addon) -> Result<(), kube::Error> {
    let mut finalizers = addon.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    patch_finalizers(ctx, addon, finalizers).await
}

async fn remove_finalizer(ctx: &Context, addon: &Addon) -> Result<(), kube::Error> {
    let finalizers: Vec<String> = addon
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch_finalizers(ctx, addon, finalizers).await
}

/// Sets the finalizer list, conditional on the cached version so that a finalizer someone else
/// added meanwhile is never dropped (a stale version answers 409 and is retried).
async fn patch_finalizers(
    ctx: &Context,
    addon: &Addon,
    finalizers: Vec<String>,
) -> Result<(), kube::Error> {
    if !ctx.leader.holds() {
        return Ok(());
    }
    // RBAC: src/rbac.rs (addons patch, addons/status patch).
    let api: Api<Addon> =
        Api::namespaced(ctx.writer.clone(), &addon.namespace().unwrap_or_default());
    ctx.metrics.wrote("patch", "addons");
    let r = api
        .patch(
            &addon.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "finalizers": finalizers,
                "resourceVersion": addon.resource_version(),
            }})),
        )
        .await;
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => {
            ctx.metrics.write_failed("Addon", preconditions::reason(&e));
            Err(e)
        }
    }
}

/// Which Addon of a cluster renders which object, so that one Addon never prunes what another
/// renders, and two Addons never fight over one object (the first by name keeps it).
struct Claims {
    /// `(apiVersion, kind, name)` -> `(namespace as rendered, or the default; Addon)`.
    by_name: HashMap<(String, String, String), Vec<(String, String)>>,
    default_namespace: String,
}

impl Claims {
    fn new(rendered: &[(Arc<Addon>, Rendered)], default_namespace: &str) -> Claims {
        let mut by_name: HashMap<(String, String, String), Vec<(String, String)>> = HashMap::new();
        for (addon, result) in rendered {
            let Ok((objects, _)) = result else { continue };
            for object in objects {
                let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
                let namespace = object["metadata"]["namespace"]
                    .as_str()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(default_namespace)
                    .to_string();
                by_name
                    .entry((
                        field(&object["apiVersion"]),
                        field(&object["kind"]),
                        field(&object["metadata"]["name"]),
                    ))
                    .or_default()
                    .push((namespace, addon.name_any()));
            }
        }
        Claims {
            by_name,
            default_namespace: default_namespace.to_string(),
        }
    }

    /// Addons other than `addon` rendering this object. An empty namespace (a cluster-scoped
    /// object) matches any.
    fn others<'a>(
        &'a self,
        addon: &'a str,
        api_version: &str,
        kind: &str,
        namespace: &'a str,
        name: &str,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.by_name
            .get(&(api_version.to_string(), kind.to_string(), name.to_string()))
            .into_iter()
            .flatten()
            .filter(move |(ns, other)| {
                other != addon && (namespace.is_empty() || ns.is_empty() || ns == namespace)
            })
            .map(|(_, other)| other.as_str())
    }

    fn rendered_by_other(&self, addon: &str, object: &AppliedObject) -> bool {
        self.others(
            addon,
            &object.api_version,
            &object.kind,
            &object.namespace,
            &object.name,
        )
        .next()
        .is_some()
    }

    /// Why `addon` may not apply `objects`: one of them is rendered by an Addon before it by
    /// name.
    fn taken(&self, addon: &str, objects: &[Value]) -> Option<String> {
        for object in objects {
            let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
            let (api_version, kind, name) = (
                field(&object["apiVersion"]),
                field(&object["kind"]),
                field(&object["metadata"]["name"]),
            );
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or(&self.default_namespace)
                .to_string();
            let first = self
                .others(addon, &api_version, &kind, &namespace, &name)
                .filter(|other| *other < addon)
                .min();
            if let Some(other) = first {
                return Some(format!(
                    "renders {kind} {name} ({api_version}), which Addon {other} of this cluster renders too; an object belongs to one Addon"
                ));
            }
        }
        None
    }
}

/// An Addon's rendered objects and their hash, or why it does not render.
type Rendered = Result<(Vec<Value>, String), Failure>;

/// Renders one Addon with its cluster's allocations and their pools' networks: the objects and
/// the hash of their canonical YAML.
fn render(
    renderer: &Renderer,
    cluster: &Cluster,
    addon: &Addon,
    allocations: &[IPAMAllocation],
    pools: &[Arc<crate::resources::IPAMPool>],
) -> Rendered {
    let mut data = template_data(
        &cluster.name_any(),
        &cluster.spec.datacenter,
        allocations.iter(),
        addon.spec.variables.clone(),
    );
    crate::desired::add_networks(&mut data, pools.iter().map(|p| p.as_ref()));
    let rendered = renderer
        .render(&addon.spec.name, &data)
        .map_err(|e| Failure {
            reason: Reason::TemplateError,
            message: e.to_string(),
        })?;
    if rendered.objects.len() > MAX_APPLIED_OBJECTS as usize {
        return Err(Failure {
            reason: Reason::TemplateError,
            message: format!(
                "the addon renders {} objects, more than the {MAX_APPLIED_OBJECTS} kipam tracks \
                 per Addon",
                rendered.objects.len()
            ),
        });
    }
    let hash = summary::manifest_hash(&rendered.to_yaml());
    Ok((rendered.objects, hash))
}

/// The user cluster's client: the shared one (`seed::tenants`) while the Secret has not
/// changed, else one built from the Secret, read from the seed then (`secret` is its metadata,
/// as the applier's watch shows it), parsed and checked again. Every room uses the same
/// client, so a sync sends its requests over the connection the watches already hold. The
/// error says what failed, and whether trying again may mend it (the Secret could not be
/// read) or only a change of the Cluster or the Secret will.
async fn client_for(
    ctx: &Context,
    cluster: &Cluster,
    secret: Option<&PartialObjectMeta<Secret>>,
    slot: &mut ClientSlot,
    timeout: std::time::Duration,
) -> Result<Client, (String, bool)> {
    // On every failure below the slot is left as it is: its client is never used (the
    // source no longer matches), but its memory of applied objects is kept.
    let Some((namespace, name, key)) = kubeconfig::secret_location(cluster) else {
        return Err((
            format!(
                "Cluster {} has no spec.kubeconfig.secretRef: kipam cannot reach the user cluster",
                cluster.name_any()
            ),
            false,
        ));
    };
    let Some(secret) = secret else {
        return Err((
            format!(
                "the kubeconfig Secret {namespace}/{name} does not exist (or kipam may not read it)"
            ),
            false,
        ));
    };
    let watched = tenants::source(
        &secret.uid().unwrap_or_default(),
        &secret.resource_version().unwrap_or_default(),
        &key,
    );
    let cluster_name = cluster.name_any();
    let kept = slot
        .as_ref()
        .filter(|t| t.source == watched)
        .map(|t| t.client.clone());
    let (source, client) = match (ctx.tenants.cached(&cluster_name, &watched), kept) {
        (Some(client), _) => (watched, client),
        // Shared again (the shared set lets go of clients when this replica stops leading).
        (None, Some(client)) => {
            let client = ctx.tenants.share(&cluster_name, &watched, client);
            (watched, client)
        }
        // Read now, it may be newer than the watch showed: the client is kept under the
        // version it was built from. A read that failed is worth trying again; a Secret gone
        // meanwhile, or a kubeconfig that cannot be used, waits for the Secret to change.
        (None, None) => {
            let read = ctx.kubeconfig_secret(&namespace, &name).await;
            let secret = read.map_err(|why| (why, true))?.ok_or_else(|| {
                (
                    format!("the kubeconfig Secret {namespace}/{name} does not exist"),
                    false,
                )
            })?;
            ctx.tenant_client_from(&cluster_name, &secret, &key, timeout)
                .await
                .map_err(|why| (why, false))?
        }
    };
    if slot.as_ref().is_some_and(|t| t.source == source) {
        return Ok(client);
    }
    let (applied, stamps) = slot
        .take()
        .map(|t| (t.applied, t.stamps))
        .unwrap_or_default();
    *slot = Some(TenantClient {
        source,
        client: client.clone(),
        kinds: HashMap::new(),
        applied,
        stamps,
    });
    Ok(client)
}

/// Classifies an error of the user cluster.
fn failure(e: &kube::Error, what: &str) -> Failure {
    let reason = match preconditions::reason(e) {
        "Unreachable" | "Timeout" | "ServerError" | "TooManyRequests" => Reason::Unreachable,
        "Unauthorized" => Reason::Unauthorized,
        "Forbidden" => Reason::Forbidden,
        _ => Reason::ApplyFailed,
    };
    let hint = match reason {
        Reason::Unreachable => " (the user cluster does not answer)",
        Reason::Unauthorized => " (the user cluster refuses the kubeconfig's credentials)",
        Reason::Forbidden => {
            " (grant the kubeconfig's user kipam's ClusterRole, see docs/multicluster.md)"
        }
        _ => "",
    };
    Failure {
        reason,
        message: format!("{what}: {e}{hint}"),
    }
}

/// The kind of an object, through discovery: one request per group version, cached per user
/// cluster. A kind missing from a cached group version is looked up again (its CRD may have
/// been installed since), and only found kinds are cached.
async fn resolve(
    client: &Client,
    tenant: &mut TenantClient,
    api_version: &str,
    kind: &str,
) -> Result<(ApiResource, ApiCapabilities), Failure> {
    let find = |resources: &[(ApiResource, ApiCapabilities)]| {
        resources
            .iter()
            .find(|(r, _)| r.kind == kind && !r.plural.contains('/'))
            .cloned()
    };
    if let Some(found) = tenant.kinds.get(api_version).and_then(|r| find(r)) {
        return Ok(found);
    }
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), api_version.to_string()),
    };
    let gv = GroupVersion::gv(&group, &version);
    match kube::discovery::pinned_group(client, &gv).await {
        Ok(found) => {
            let resources = found.versioned_resources(&version);
            let kind_found = find(&resources);
            tenant.kinds.insert(api_version.to_string(), resources);
            kind_found.ok_or_else(|| missing_crd(api_version, kind))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Err(missing_crd(api_version, kind)),
        Err(kube::Error::Discovery(_)) => Err(missing_crd(api_version, kind)),
        Err(e) => Err(failure(&e, &format!("discovery of {api_version} {kind}"))),
    }
}

/// A kind the user cluster does not serve, naming the CRD that would serve it (its plural
/// worked out from the kind, as kube does) and what to install.
fn missing_crd(api_version: &str, kind: &str) -> Failure {
    let message = match api_version.split_once('/') {
        Some((group, version)) => {
            let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
            let crd = format!("{}.{group}", ApiResource::from_gvk(&gvk).plural);
            let todo = if group == "metallb.io" {
                "install MetalLB, or at least its CRDs, in the user cluster"
            } else {
                "install it in the user cluster"
            };
            format!(
                "the user cluster does not serve {kind} ({api_version}): the \
                 CustomResourceDefinition {crd} is not installed there; {todo}"
            )
        }
        None => format!("the user cluster does not serve {kind} ({api_version})"),
    };
    Failure {
        reason: Reason::MissingCRD,
        message,
    }
}

/// True when `status` (as this process last wrote it) already reports `failure`: it was said
/// in the log then, and saying it again on every retry would bury everything else.
fn already_reported(status: Option<&AddonStatus>, failure: &Failure) -> bool {
    let message = summary::bounded(failure.message.clone());
    status.is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == "InSync"
                && c.status == "False"
                && c.reason == failure.reason.as_str()
                && c.message == message
        })
    })
}

/// User-cluster objects: RBAC in the user cluster, not in src/rbac.rs (the seed's).
fn api_for(
    client: &Client,
    resource: &ApiResource,
    caps: &ApiCapabilities,
    namespace: &str,
) -> Api<DynamicObject> {
    if caps.scope == Scope::Namespaced {
        Api::namespaced_with(client.clone(), namespace, resource)
    } else {
        Api::all_with(client.clone(), resource)
    }
}

/// Applies every object of one Addon, then prunes what it applied before and no longer
/// renders.
#[allow(clippy::too_many_arguments)]
async fn apply_addon(
    ctx: &Context,
    metrics: &Metrics,
    client: &Client,
    tenant: &mut TenantClient,
    claims: &Claims,
    addon: &Addon,
    previous: &AddonStatus,
    objects: Vec<Value>,
    hash: String,
) -> Outcome {
    let default_namespace = tenant.client.default_namespace().to_string();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut applied = Vec::new();
    for mut object in objects {
        let api_version = object["apiVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (resource, caps) = match resolve(client, tenant, &api_version, &kind).await {
            Ok(found) => found,
            Err(failure) => {
                return Outcome::ApplyFailed {
                    failure,
                    applied,
                    not_pruned: Vec::new(),
                };
            }
        };
        let namespace = if caps.scope == Scope::Namespaced {
            let ns = object["metadata"]["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or(&default_namespace)
                .to_string();
            object["metadata"]["namespace"] = Value::String(ns.clone());
            ns
        } else {
            if let Some(meta) = object["metadata"].as_object_mut() {
                meta.remove("namespace");
            }
            String::new()
        };
        let record = AppliedObject {
            api_version: api_version.clone(),
            kind: kind.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
        };
        if !ctx.leader.holds() {
            return Outcome::ApplyFailed {
                failure: Failure {
                    reason: Reason::ApplyFailed,
                    message: "this replica stopped leading".into(),
                },
                applied,
                not_pruned: Vec::new(),
            };
        }
        let api = api_for(client, &resource, &caps, &namespace);
        // Recorded before the request: an apply that times out may still have created it.
        applied.push(record.clone());
        let started = std::time::Instant::now();
        let result = api.patch(&name, &params, &Patch::Apply(&object)).await;
        metrics.addon_request("apply", result.is_ok(), started.elapsed());
        if let Ok(answer) = &result {
            Arc::make_mut(&mut tenant.stamps).insert(record, Stamp::of(answer, &object));
        }
        if let Err(e) = result {
            let what = if namespace.is_empty() {
                format!("apply {kind} {name}")
            } else {
                format!("apply {kind} {namespace}/{name}")
            };
            return Outcome::ApplyFailed {
                failure: failure(&e, &what),
                applied,
                not_pruned: Vec::new(),
            };
        }
        metrics.addon_objects_applied.inc();
    }
    applied.sort();
    applied.dedup();
    let mut not_pruned = Vec::new();
    let mut prune_failure = None;
    let addon_name = addon.name_any();
    for object in summary::to_prune(&previous.applied_objects, &applied) {
        if claims.rendered_by_other(&addon_name, &object) {
            // Moved to another Addon of this cluster, which applies it: not deleted.
            continue;
        }
        if let Err(f) = delete_object(ctx, metrics, client, tenant, &object).await {
            prune_failure.get_or_insert(f);
            not_pruned.push(object);
        }
    }
    match prune_failure {
        None => Outcome::Synced { applied, hash },
        Some(failure) => Outcome::ApplyFailed {
            failure,
            applied,
            not_pruned,
        },
    }
}

/// Deletes one object kipam applied earlier. Gone already, or its kind no longer served (so it
/// cannot exist), counts as done.
async fn delete_object(
    ctx: &Context,
    metrics: &Metrics,
    client: &Client,
    tenant: &mut TenantClient,
    object: &AppliedObject,
) -> Result<(), Failure> {
    let (resource, caps) = match resolve(client, tenant, &object.api_version, &object.kind).await {
        Ok(found) => found,
        Err(f) if f.reason == Reason::MissingCRD => return Ok(()),
        Err(f) => return Err(f),
    };
    if !ctx.leader.holds() {
        return Err(Failure {
            reason: Reason::ApplyFailed,
            message: "this replica stopped leading".into(),
        });
    }
    let api = api_for(client, &resource, &caps, &object.namespace);
    // Forgotten before the request: kipam's own delete is not drift.
    if tenant.stamps.contains_key(object) {
        Arc::make_mut(&mut tenant.stamps).remove(object);
    }
    let started = std::time::Instant::now();
    let result = api.delete(&object.name, &DeleteParams::default()).await;
    let gone = match &result {
        Ok(_) => true,
        Err(kube::Error::Api(s)) => s.code == 404,
        Err(_) => false,
    };
    metrics.addon_request("delete", gone, started.elapsed());
    match result {
        Ok(_) => {
            metrics.addon_objects_pruned.inc();
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(failure(
            &e,
            &format!("prune {} {}", object.kind, object.name),
        )),
    }
}

/// Writes an Addon's status when it differs from the cached one, or from the one this
/// process wrote last (the cache may not show that write yet, and must not make kipam skip
/// writing a status back to what the cache still shows).
async fn write_status(
    ctx: &Context,
    addon: &Addon,
    cached: &AddonStatus,
    last_written: Option<&AddonStatus>,
    next: &AddonStatus,
) {
    let current = cached == next && last_written.is_none_or(|w| w == next);
    if current || !ctx.leader.holds() {
        return;
    }
    let api: Api<Addon> =
        Api::namespaced(ctx.writer.clone(), &addon.namespace().unwrap_or_default());
    ctx.metrics.wrote("patch", "addons/status");
    if let Err(e) = api
        .patch_status(
            &addon.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": next })),
        )
        .await
    {
        ctx.metrics.write_failed("Addon", preconditions::reason(&e));
        tracing::warn!(cluster = %cluster_of(addon), addon = %key(addon), error = %preconditions::short(&e), "cannot write the addon status (retrying on the next sync)");
    }
}

/// Writes the Cluster's `AddonsReady` condition when it changed, keeping its other conditions.
async fn write_addons_ready(
    ctx: &Context,
    cluster: &Cluster,
    ready: &(bool, String, String),
    now: &str,
) -> bool {
    if !ctx.leader.holds() {
        return true;
    }
    let previous = cluster.status.clone().unwrap_or_default().conditions;
    let mut conditions = previous.clone();
    crate::status::set_condition(
        &mut conditions,
        "AddonsReady",
        ready.0,
        &ready.1,
        ready.2.clone(),
        cluster.metadata.generation,
        now,
    );
    if conditions == previous {
        return true;
    }
    // RBAC: src/rbac.rs (clusters/status patch).
    let api: Api<Cluster> = Api::all(ctx.writer.clone());
    ctx.metrics.wrote("patch", "clusters/status");
    // The conditions were read at this version: the planning loop writes `IPAMReady` in the
    // same list, and a patch from an older copy would put its old value back.
    let patch = json!({
        "metadata": { "resourceVersion": cluster.resource_version() },
        "status": { "conditions": conditions },
    });
    match api
        .patch_status(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 409 => {
            tracing::debug!(cluster = %cluster.name_any(), "cluster changed under its AddonsReady update; syncing again");
            false
        }
        Err(e) => {
            ctx.metrics
                .write_failed("Cluster", preconditions::reason(&e));
            tracing::warn!(cluster = %cluster.name_any(), error = %preconditions::short(&e), "cannot write AddonsReady (retrying with backoff)");
            false
        }
    }
}
