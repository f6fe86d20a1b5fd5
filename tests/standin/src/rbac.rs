//! Authorisation by RBAC (opt-in, [`crate::ApiServer::enable_rbac`]): every request, and every
//! `SubjectAccessReview`, is decided from the `ClusterRole`s, `Role`s and their bindings stored
//! in the instance, with the real authoriser's rules:
//!
//! - the `system:masters` group may do anything (the real server's privileged group);
//! - a `ClusterRoleBinding` grants its `ClusterRole` everywhere; a `RoleBinding` grants its
//!   `Role` (same namespace) or `ClusterRole` in its own namespace only;
//! - a subject is a `User` (by name), a `Group` (one of the user's groups) or a
//!   `ServiceAccount` (`system:serviceaccount:<namespace>:<name>`);
//! - a rule allows a resource request when its `verbs` hold the verb (or `*`), its `apiGroups`
//!   the group (or `*`), its `resources` the resource — `plural/subresource` for a subresource,
//!   `*` for anything, `*/subresource` for that subresource of anything — and its
//!   `resourceNames`, when given, the object's name (so never a `create`, `list` or `watch`);
//! - a rule allows a non-resource request (`/api`, `/version`…) when its `verbs` hold the verb
//!   and its `nonResourceURLs` the path (exactly, `*`, or a prefix ending in `*`);
//! - a binding whose role does not exist grants nothing, and the denial's reason says so
//!   (`RBAC: clusterrole.rbac.authorization.k8s.io "x" not found`), as the real one does.
//!
//! Not modelled: aggregated `ClusterRole`s (`aggregationRule` is not filled in), the escalation
//! checks on writing roles and bindings, and the `Node` authoriser.

use serde_json::Value;

use crate::resources::ResourceType;
use crate::reviews::{AccessRequest, ResourceAttributes};
use crate::store::Store;

const GROUP: &str = "rbac.authorization.k8s.io";

/// The group whose members may do anything.
pub(crate) const PRIVILEGED_GROUP: &str = "system:masters";

/// An authoriser's answer: allowed or not, and why (empty when RBAC has nothing to say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    pub allowed: bool,
    pub reason: String,
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn text<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn rbac_type(store: &Store, plural: &str) -> Option<ResourceType> {
    store.registry.lookup(GROUP, "v1", plural).cloned()
}

/// Whether a rule's `resources` cover `resource` (`plural` or `plural/sub`).
fn resource_matches(rule_resources: &[String], combined: &str, sub: &str) -> bool {
    rule_resources.iter().any(|r| {
        r == "*"
            || r == combined
            || (!sub.is_empty() && r.strip_prefix("*/").is_some_and(|s| s == sub))
    })
}

fn url_matches(urls: &[String], path: &str) -> bool {
    urls.iter().any(|u| {
        u == "*"
            || u == path
            || u.strip_suffix('*')
                .is_some_and(|prefix| path.starts_with(prefix))
    })
}

/// Whether one `PolicyRule` allows the request.
pub(crate) fn rule_allows(rule: &Value, req: &AccessRequest) -> bool {
    let verbs = strings(rule, "verbs");
    let verb_ok = |verb: &str| verbs.iter().any(|v| v == "*" || v == verb);
    if let Some(r) = &req.resource {
        let combined = if r.subresource.is_empty() {
            r.resource.clone()
        } else {
            format!("{}/{}", r.resource, r.subresource)
        };
        let names = strings(rule, "resourceNames");
        verb_ok(&r.verb)
            && strings(rule, "apiGroups")
                .iter()
                .any(|g| g == "*" || *g == r.group)
            && resource_matches(&strings(rule, "resources"), &combined, &r.subresource)
            && (names.is_empty() || names.contains(&r.name))
    } else if let Some(n) = &req.non_resource {
        verb_ok(&n.verb) && url_matches(&strings(rule, "nonResourceURLs"), &n.path)
    } else {
        false
    }
}

/// Whether a binding's subjects include the user.
fn applies_to(binding: &Value, req: &AccessRequest) -> Option<String> {
    let user = &req.user;
    binding
        .get("subjects")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find_map(|s| {
            let name = text(s, &["name"]);
            let hit = match text(s, &["kind"]) {
                "User" => user.username == name,
                "Group" => user.groups.iter().any(|g| g == name),
                "ServiceAccount" => {
                    let ns = text(s, &["namespace"]);
                    !ns.is_empty() && user.username == format!("system:serviceaccount:{ns}:{name}")
                }
                _ => false,
            };
            hit.then(|| {
                let kind = text(s, &["kind"]);
                match kind {
                    "ServiceAccount" => format!("{kind} \"{}/{name}\"", text(s, &["namespace"])),
                    _ => format!("{kind} \"{name}\""),
                }
            })
        })
}

/// Decides one request from the roles and bindings stored in `store`.
pub(crate) fn authorize(store: &Store, req: &AccessRequest) -> Decision {
    if req.user.groups.iter().any(|g| g == PRIVILEGED_GROUP) {
        return Decision {
            allowed: true,
            reason: String::new(),
        };
    }
    let mut errors: Vec<String> = Vec::new();
    let (Some(crb), Some(cr)) = (
        rbac_type(store, "clusterrolebindings"),
        rbac_type(store, "clusterroles"),
    ) else {
        return Decision {
            allowed: false,
            reason: String::new(),
        };
    };
    let role_rules = |kind: &str, name: &str, ns: Option<&str>, errors: &mut Vec<String>| {
        let found = match kind {
            "ClusterRole" => store.object(&cr, None, name),
            "Role" => rbac_type(store, "roles").and_then(|rt| store.object(&rt, ns, name)),
            _ => None,
        };
        match found {
            Some(role) => role
                .get("rules")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            None => {
                errors.push(format!(
                    "{}.{GROUP} \"{name}\" not found",
                    kind.to_ascii_lowercase()
                ));
                Vec::new()
            }
        }
    };
    for binding in store.objects_of(&crb, None) {
        let Some(subject) = applies_to(&binding, req) else {
            continue;
        };
        let role = text(&binding, &["roleRef", "name"]);
        if text(&binding, &["roleRef", "kind"]) != "ClusterRole" {
            continue;
        }
        if role_rules("ClusterRole", role, None, &mut errors)
            .iter()
            .any(|r| rule_allows(r, req))
        {
            return Decision {
                allowed: true,
                reason: format!(
                    "RBAC: allowed by ClusterRoleBinding \"{}\" of ClusterRole \"{role}\" to {subject}",
                    text(&binding, &["metadata", "name"])
                ),
            };
        }
    }
    let namespace = req
        .resource
        .as_ref()
        .map(|r: &ResourceAttributes| r.namespace.as_str())
        .unwrap_or("");
    if !namespace.is_empty()
        && let Some(rb) = rbac_type(store, "rolebindings")
    {
        for binding in store.objects_of(&rb, Some(namespace)) {
            let Some(subject) = applies_to(&binding, req) else {
                continue;
            };
            let kind = text(&binding, &["roleRef", "kind"]);
            let role = text(&binding, &["roleRef", "name"]);
            if role_rules(kind, role, Some(namespace), &mut errors)
                .iter()
                .any(|r| rule_allows(r, req))
            {
                return Decision {
                    allowed: true,
                    reason: format!(
                        "RBAC: allowed by RoleBinding \"{}/{namespace}\" of {kind} \"{role}\" to {subject}",
                        text(&binding, &["metadata", "name"])
                    ),
                };
            }
        }
    }
    let reason = match errors.len() {
        0 => String::new(),
        1 => format!("RBAC: {}", errors[0]),
        _ => format!("RBAC: [{}]", errors.join(", ")),
    };
    Decision {
        allowed: false,
        reason,
    }
}

/// The roles every real cluster starts with that matter to a client: discovery, version and
/// health for every authenticated user (`system:discovery`, `system:public-info-viewer`), and
/// self reviews (`system:basic-user`), each with its binding of the same name.
pub(crate) fn bootstrap_objects() -> Vec<Value> {
    let role = |name: &str, rules: Value| {
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "rules": rules,
        })
    };
    let binding = |name: &str, groups: &[&str]| {
        let subjects: Vec<Value> = groups
            .iter()
            .map(|g| serde_json::json!({"apiGroup": GROUP, "kind": "Group", "name": g}))
            .collect();
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": name},
            "subjects": subjects,
        })
    };
    vec![
        role(
            "system:discovery",
            serde_json::json!([{
                "verbs": ["get"],
                "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez",
                    "/openapi", "/openapi/*", "/readyz", "/version", "/version/"],
            }]),
        ),
        binding("system:discovery", &["system:authenticated"]),
        role(
            "system:public-info-viewer",
            serde_json::json!([{
                "verbs": ["get"],
                "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
            }]),
        ),
        binding(
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
        role(
            "system:basic-user",
            serde_json::json!([{
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                "verbs": ["create"],
            }, {
                "apiGroups": ["authentication.k8s.io"],
                "resources": ["selfsubjectreviews"],
                "verbs": ["create"],
            }]),
        ),
        binding("system:basic-user", &["system:authenticated"]),
    ]
}

/// The message of a refusal, as the real server words it:
/// `User "u" cannot get resource "pods/log" in API group "" in the namespace "ns"`.
pub(crate) fn forbidden_message(req: &AccessRequest) -> String {
    let username = &req.user.username;
    match (&req.resource, &req.non_resource) {
        (Some(r), _) => {
            let resource = if r.subresource.is_empty() {
                r.resource.clone()
            } else {
                format!("{}/{}", r.resource, r.subresource)
            };
            let scope = if r.namespace.is_empty() {
                "at the cluster scope".to_string()
            } else {
                format!("in the namespace \"{}\"", r.namespace)
            };
            format!(
                "User \"{username}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
                r.verb, r.group
            )
        }
        (None, Some(n)) => format!("User \"{username}\" cannot {} path \"{}\"", n.verb, n.path),
        (None, None) => format!("User \"{username}\" cannot do this"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reviews::{NonResourceAttributes, UserInfo};
    use serde_json::json;

    fn resource(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> AccessRequest {
        AccessRequest {
            user: UserInfo::new("u"),
            resource: Some(ResourceAttributes {
                namespace: "ns".into(),
                verb: verb.into(),
                group: group.into(),
                version: "v1".into(),
                resource: resource.into(),
                subresource: sub.into(),
                name: name.into(),
            }),
            non_resource: None,
        }
    }

    #[test]
    fn rules_match_like_the_real_authoriser() {
        let rule = json!({"apiGroups": ["g"], "resources": ["things"], "verbs": ["get"]});
        assert!(rule_allows(&rule, &resource("get", "g", "things", "", "a")));
        assert!(!rule_allows(
            &rule,
            &resource("get", "g", "things", "status", "a")
        ));
        assert!(!rule_allows(&rule, &resource("get", "", "things", "", "a")));
        assert!(!rule_allows(
            &rule,
            &resource("list", "g", "things", "", "")
        ));
        let sub =
            json!({"apiGroups": ["g"], "resources": ["things/finalizers"], "verbs": ["update"]});
        assert!(rule_allows(
            &sub,
            &resource("update", "g", "things", "finalizers", "a")
        ));
        assert!(!rule_allows(
            &sub,
            &resource("update", "g", "things", "", "a")
        ));
        let any_sub = json!({"apiGroups": ["*"], "resources": ["*/finalizers"], "verbs": ["*"]});
        assert!(rule_allows(
            &any_sub,
            &resource("update", "x", "y", "finalizers", "a")
        ));
        assert!(!rule_allows(
            &any_sub,
            &resource("update", "x", "y", "status", "a")
        ));
        let star = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
        assert!(rule_allows(
            &star,
            &resource("patch", "x", "y", "status", "a")
        ));
        let named = json!({"apiGroups": [""], "resources": ["leases"], "resourceNames": ["l"], "verbs": ["get", "create"]});
        assert!(rule_allows(&named, &resource("get", "", "leases", "", "l")));
        assert!(!rule_allows(
            &named,
            &resource("get", "", "leases", "", "m")
        ));
        assert!(!rule_allows(
            &named,
            &resource("create", "", "leases", "", "")
        ));
        let urls = json!({"nonResourceURLs": ["/apis/*", "/version"], "verbs": ["get"]});
        let path = |p: &str| AccessRequest {
            user: UserInfo::new("u"),
            resource: None,
            non_resource: Some(NonResourceAttributes {
                path: p.into(),
                verb: "get".into(),
            }),
        };
        assert!(rule_allows(&urls, &path("/apis/g/v1")));
        assert!(rule_allows(&urls, &path("/version")));
        assert!(!rule_allows(&urls, &path("/api")));
        assert!(!rule_allows(&rule, &path("/version")));
    }

    #[test]
    fn the_message_names_the_subresource_and_the_scope() {
        assert_eq!(
            forbidden_message(&resource("update", "g", "things", "finalizers", "a")),
            "User \"u\" cannot update resource \"things/finalizers\" in API group \"g\" in the namespace \"ns\""
        );
    }
}
