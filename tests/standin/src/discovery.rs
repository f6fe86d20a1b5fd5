//! Discovery documents, in the plain form (`/api`, `/api/v1`, `/apis`, `/apis/{g}`,
//! `/apis/{g}/{v}`) and the aggregated `apidiscovery.k8s.io/v2` form, built from the
//! registry so that CRDs appear as soon as they are created.

use crate::resources::{Registry, ResourceType};
use serde_json::{Value, json};

/// The media type of an aggregated discovery answer.
pub(crate) const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Whether an `Accept` header asks for aggregated discovery.
pub(crate) fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| {
        first.contains("as=APIGroupDiscoveryList") && first.contains("g=apidiscovery.k8s.io")
    })
}

/// `/version`.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "37",
        "emulationMajor": "1",
        "emulationMinor": "37",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "36",
        "gitVersion": "v1.37.0-standin",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.26",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn resource_entries(t: &ResourceType) -> Vec<Value> {
    let mut main = json!({
        "name": t.plural,
        "singularName": t.singular,
        "namespaced": t.namespaced,
        "kind": t.kind,
        "verbs": t.verbs(),
    });
    if !t.short_names.is_empty() {
        main["shortNames"] = json!(t.short_names);
    }
    if !t.categories.is_empty() {
        main["categories"] = json!(t.categories);
    }
    let mut out = vec![main];
    if t.status {
        out.push(json!({
            "name": format!("{}/status", t.plural),
            "singularName": "",
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    out
}

/// `/api/v1` or `/apis/{group}/{version}`; `None` when nothing is served there.
pub(crate) fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    if !reg.has_group_version(group, version) {
        return None;
    }
    let resources: Vec<Value> = reg
        .in_group_version(group, version)
        .flat_map(resource_entries)
        .collect();
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }))
}

fn group_entry(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({
        "name": group,
        "versions": vs,
        "preferredVersion": preferred,
    })
}

/// `/apis`.
pub(crate) fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg
        .groups()
        .iter()
        .map(|(g, vs)| group_entry(g, vs))
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `/apis/{group}`; `None` for an unknown group.
pub(crate) fn group(reg: &Registry, group: &str) -> Option<Value> {
    reg.groups()
        .into_iter()
        .find(|(g, _)| g == group)
        .map(|(g, vs)| {
            let mut e = group_entry(&g, &vs);
            e["kind"] = json!("APIGroup");
            e["apiVersion"] = json!("v1");
            e
        })
}

fn aggregated_resource(t: &ResourceType) -> Value {
    let mut r = json!({
        "resource": t.plural,
        "responseKind": {"group": t.group, "version": t.version, "kind": t.kind},
        "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": t.singular,
        "verbs": t.verbs(),
    });
    if !t.short_names.is_empty() {
        r["shortNames"] = json!(t.short_names);
    }
    if !t.categories.is_empty() {
        r["categories"] = json!(t.categories);
    }
    if t.status {
        r["subresources"] = json!([{
            "subresource": "status",
            "responseKind": {"group": t.group, "version": t.version, "kind": t.kind},
            "verbs": ["get", "patch", "update"],
        }]);
    }
    r
}

fn aggregated_group(reg: &Registry, group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| {
            let resources: Vec<Value> = reg
                .in_group_version(group, v)
                .map(aggregated_resource)
                .collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({
        "metadata": {"name": group, "creationTimestamp": null},
        "versions": vs,
    })
}

/// Aggregated discovery for `/api` (`core`) or `/apis`.
pub(crate) fn aggregated(reg: &Registry, core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group(reg, "", &["v1".to_string()])]
    } else {
        reg.groups()
            .iter()
            .map(|(g, vs)| aggregated_group(reg, g, vs))
            .collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}
