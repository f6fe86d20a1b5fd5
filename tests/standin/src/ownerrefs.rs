//! The `OwnerReferencesPermissionEnforcement` admission plugin (opt-in,
//! [`crate::ApiServer::enable_owner_references_permission_enforcement`]), with the real
//! plugin's rules and words:
//!
//! - only creates and updates are looked at, and not `pods/status`;
//! - nothing is checked unless the write changes `metadata.ownerReferences` (any reference on
//!   a create);
//! - an update that changes them needs `delete` on the object itself (with its subresource):
//!   `cannot set an ownerRef on a resource you can't delete: <reason>, <nil>`;
//! - every reference that becomes `blockOwnerDeletion: true` (new, or `false`/unset before)
//!   needs `update` on the owner's `finalizers` subresource, by name, in the object's namespace
//!   when the owner's kind is namespaced: `cannot set blockOwnerDeletion if an ownerReference
//!   refers to a resource you can't set finalizers on: <reason>, <nil>`; an owner kind the
//!   server does not serve is refused too (`cannot set blockOwnerDeletion in this case because
//!   cannot find RESTMapping for APIVersion … Kind …: no matches for kind …`).
//!
//! The refusal is a 403 `Forbidden` on the object written
//! (`ipaddresses.ipam.cluster.x-k8s.io "x" is forbidden: …`). The authoriser's reason is empty
//! for a plain RBAC denial, hence the real server's odd `: , <nil>` tail, kept here.

use serde_json::Value;

use crate::Shared;
use crate::error::ApiError;
use crate::resources::{ResourceType, split_api_version};
use crate::reviews::{AccessRequest, ResourceAttributes, UserInfo};

/// What the plugin is shown of a write.
pub(crate) struct Write<'a> {
    pub rt: &'a ResourceType,
    pub sub: Option<&'a str>,
    /// `CREATE` or `UPDATE`.
    pub operation: &'a str,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
    pub user: &'a UserInfo,
}

fn owners(obj: Option<&Value>) -> Vec<Value> {
    obj.and_then(|o| o.get("metadata"))
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn blocking(r: &Value) -> bool {
    r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true)
}

/// References that become blocking: new blocking ones (by uid), and ones that were not.
fn newly_blocking(new: &[Value], old: Option<&[Value]>) -> Vec<Value> {
    new.iter()
        .filter(|r| blocking(r))
        .filter(|r| {
            let Some(old) = old else {
                return true;
            };
            match old.iter().find(|o| o.get("uid") == r.get("uid")) {
                None => true,
                Some(o) => !blocking(o),
            }
        })
        .cloned()
        .collect()
}

/// Checks one write; `Ok(())` when the plugin lets it through.
pub(crate) fn check(
    shared: &Shared,
    w: &Write<'_>,
    decide: impl Fn(&AccessRequest) -> crate::rbac::Decision,
) -> Result<(), ApiError> {
    if w.rt.group.is_empty() && w.rt.plural == "pods" && w.sub == Some("status") {
        return Ok(());
    }
    if !matches!(w.operation, "CREATE" | "UPDATE") {
        return Ok(());
    }
    let new = owners(w.object);
    let old = w.old_object.map(|o| owners(Some(o)));
    let changing = match &old {
        None => !new.is_empty(),
        Some(old) => *old != new,
    };
    if !changing {
        return Ok(());
    }
    let refuse = |why: String| ApiError::forbidden_on(&w.rt.group, &w.rt.plural, w.name, &why);
    let namespace = w.namespace.unwrap_or("").to_string();
    if w.operation != "CREATE" {
        let own = AccessRequest {
            user: w.user.clone(),
            resource: Some(ResourceAttributes {
                namespace: namespace.clone(),
                verb: "delete".into(),
                group: w.rt.group.clone(),
                version: w.rt.version.clone(),
                resource: w.rt.plural.clone(),
                subresource: w.sub.unwrap_or("").to_string(),
                name: w.name.to_string(),
            }),
            non_resource: None,
        };
        let d = decide(&own);
        if !d.allowed {
            return Err(refuse(format!(
                "cannot set an ownerRef on a resource you can't delete: {}, <nil>",
                d.reason
            )));
        }
    }
    for r in newly_blocking(&new, old.as_deref()) {
        let api_version = r.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = r.get("kind").and_then(Value::as_str).unwrap_or("");
        let owner_name = r.get("name").and_then(Value::as_str).unwrap_or("");
        let mapping = shared
            .lock_store()
            .registry
            .by_kind(api_version, kind)
            .cloned();
        let Some(owner) = mapping else {
            let (group, version) = split_api_version(api_version);
            let gv = if group.is_empty() {
                version.to_string()
            } else {
                format!("{group}/{version}")
            };
            return Err(refuse(format!(
                "cannot set blockOwnerDeletion in this case because cannot find RESTMapping for \
                 APIVersion {api_version} Kind {kind}: no matches for kind \"{kind}\" in version \"{gv}\""
            )));
        };
        let finalizers = AccessRequest {
            user: w.user.clone(),
            resource: Some(ResourceAttributes {
                namespace: if owner.namespaced {
                    namespace.clone()
                } else {
                    String::new()
                },
                verb: "update".into(),
                group: owner.group.clone(),
                version: owner.version.clone(),
                resource: owner.plural.clone(),
                subresource: "finalizers".into(),
                name: owner_name.to_string(),
            }),
            non_resource: None,
        };
        let d = decide(&finalizers);
        if !d.allowed {
            return Err(refuse(format!(
                "cannot set blockOwnerDeletion if an ownerReference refers to a resource you \
                 can't set finalizers on: {}, <nil>",
                d.reason
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_references_that_become_blocking_are_checked() {
        let a = json!({"uid": "a", "blockOwnerDeletion": true});
        let b = json!({"uid": "b"});
        let b_blocking = json!({"uid": "b", "blockOwnerDeletion": true});
        assert_eq!(
            newly_blocking(&[a.clone(), b.clone()], None),
            vec![a.clone()]
        );
        assert!(newly_blocking(&[a.clone(), b.clone()], Some(std::slice::from_ref(&a))).is_empty());
        assert_eq!(
            newly_blocking(&[a.clone(), b_blocking.clone()], Some(&[a.clone(), b])),
            vec![b_blocking]
        );
    }
}
