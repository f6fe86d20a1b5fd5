//! Every Kubernetes permission `kipam controller` uses on its seed, in one table.
//!
//! This is the single list the Helm chart's `ClusterRole` and `Role`
//! (`charts/kipam/templates/rbac.yaml`) are checked against, in both directions, by
//! `tests/chart`: a verb the code uses and the chart does not grant fails the test, and so does
//! a verb the chart grants that is not listed here. Whoever adds an API call adds its verb here
//! (next to the call, a `// RBAC: src/rbac.rs` comment names this table) and to the chart.
//! The end-to-end test `tests/controller/rbac.rs` holds the table against what the controller
//! does: run with exactly these grants on a server that enforces RBAC, it fails on a refusal,
//! on a permission used that is not here, and on a verb here that its run never used.
//!
//! User clusters are reached with the kubeconfigs their Secrets hold; what those credentials
//! may do is the user cluster's business and not part of this table.

/// Where a permission is granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// A `ClusterRole` (cluster-scoped kinds, or namespaced kinds in every namespace).
    Cluster,
    /// A `Role` in the namespace kipam runs in (`--namespace`).
    OwnNamespace,
}

/// Which objects of the resource a permission covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Names {
    /// Any object (`create`, `list` and `watch` cannot be narrowed by name).
    Any,
    /// The leader Lease, `kipam-<--seed-name>`.
    LeaderLease,
    /// The Secret holding the self-signed webhook certificate (`--webhook-secret`).
    WebhookSecret,
    /// The `ValidatingWebhookConfiguration` whose `caBundle` kipam keeps (`--webhook-config-name`).
    WebhookConfiguration,
}

/// When a permission is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Needed {
    Always,
    /// Only when kipam makes its own webhook certificate (`--webhook-self-signed`).
    SelfSignedCertificate,
}

/// One rule: these verbs on this resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// Plural resource, with `/subresource` where it applies.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub scope: Scope,
    pub names: Names,
    pub needed: Needed,
    /// The code that uses it.
    pub used_by: &'static str,
}

const IPAM: &str = "ipam.kipam.dev";
/// Cluster API's IPAM group (`IPAddressClaim`, `IPAddress`): kipam serves claims naming its
/// pools.
const CAPI_IPAM: &str = "ipam.cluster.x-k8s.io";
/// Cluster API's core group (`Cluster`: kipam reads only whether it is paused).
const CAPI: &str = "cluster.x-k8s.io";

const fn rule(
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    used_by: &'static str,
) -> Permission {
    Permission {
        group,
        resource,
        verbs,
        scope: Scope::Cluster,
        names: Names::Any,
        needed: Needed::Always,
        used_by,
    }
}

/// The table.
pub const PERMISSIONS: &[Permission] = &[
    rule(
        IPAM,
        "ipampools",
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
        "controller caches, which the addon applier reads too (list/watch); planning/records.rs, a pool view \
         confirmed by a fresh list; pass/lifecycle.rs finalizers (patch); \
         api/mod.rs REST create, get, replace (update), delete",
    ),
    rule(
        IPAM,
        "ipampools/finalizers",
        &["update"],
        "src/desired/address.rs: an IPAddress's owner reference to its pool (blockOwnerDeletion, \
         as Cluster API's contract asks; OwnerReferencesPermissionEnforcement)",
    ),
    rule(
        IPAM,
        "ipampools/status",
        &["update"],
        "controller/pass/statuses.rs pool usage and conditions (replace_status)",
    ),
    rule(
        IPAM,
        "clusters",
        &["get", "list", "watch", "patch"],
        "controller cache, which the applier reads too (list/watch); fresh reads (get) in \
         pass/inputs.rs, pass/statuses.rs (a status update that met a conflict) and \
         applier/sync.rs; pass/lifecycle.rs finalizers (patch)",
    ),
    rule(
        IPAM,
        "clusters/finalizers",
        &["update"],
        "pass/lifecycle.rs: the namespace cluster-<name> is owned by its Cluster with \
         blockOwnerDeletion, which a server running OwnerReferencesPermissionEnforcement allows \
         only to who may update the owner's finalizers",
    ),
    rule(
        IPAM,
        "clusters/status",
        &["patch"],
        "controller/pass/statuses.rs allocation conditions; applier/sync.rs addon conditions",
    ),
    rule(
        IPAM,
        "ipamallocations",
        &["get", "list", "watch", "create", "update", "delete"],
        "controller ledger watch and rebuild (list/watch), which the applier, webhook and API \
         read; pass/allocations.rs get, create, replace (update), delete",
    ),
    rule(
        IPAM,
        "ipamallocations/status",
        &["update"],
        "controller/pass/allocations.rs (replace_status)",
    ),
    rule(
        IPAM,
        "ipampoolrecords",
        &["get", "list", "watch", "create", "patch", "delete"],
        "controller/records.rs get, create, merge patch of the changed entries, delete; \
         rebuild (list); every replica's read-only view for the page and the webhook \
         (seed/watches.rs, list/watch)",
    ),
    rule(
        IPAM,
        "addons",
        &["list", "watch", "patch"],
        "applier/mod.rs cache (list/watch); applier/sync.rs finalizers (patch)",
    ),
    rule(
        IPAM,
        "addons/status",
        &["patch"],
        "applier/sync.rs addon status",
    ),
    rule(
        CAPI_IPAM,
        "ipaddressclaims",
        &["get", "list", "watch", "patch"],
        "src/seed/watches.rs cache of Cluster API claims (list/watch); \
         src/planning/pass/claims.rs get (a holder missing from the cache), finalizer \
         ReleaseAddress (patch)",
    ),
    rule(
        CAPI_IPAM,
        "ipaddressclaims/finalizers",
        &["update"],
        "src/desired/address.rs: an IPAddress's owner reference to its claim \
         (blockOwnerDeletion; OwnerReferencesPermissionEnforcement)",
    ),
    rule(
        CAPI_IPAM,
        "ipaddressclaims/status",
        &["patch"],
        "src/planning/pass/claims.rs claim status (addressRef, Ready condition)",
    ),
    rule(
        CAPI_IPAM,
        "ipaddresses",
        &["get", "list", "watch", "create", "patch", "delete"],
        "src/seed/watches.rs cache of IPAddresses (list/watch); src/planning/pass/claims.rs \
         create, finalizer ProtectAddress (patch), delete; src/planning/pass/inputs.rs a \
         hand-made one confirmed gone before its record entry is released (get)",
    ),
    rule(
        CAPI,
        "clusters",
        &["list", "watch"],
        "src/seed/watches.rs cache of Cluster API clusters (list/watch): whether a claim's \
         cluster is paused (src/planning/pass/claims.rs)",
    ),
    rule(
        "",
        "namespaces",
        &["list", "watch", "create", "patch"],
        "controller cache of cluster namespaces (list/watch); pass/lifecycle.rs \
         cluster-<name> (create; patch adds the label to one made by hand)",
    ),
    rule(
        "",
        "secrets",
        &["list", "watch"],
        "applier/mod.rs cache of user-cluster kubeconfigs (metadata); seed/mod.rs reads one \
         when a user cluster's client is built (list of one name)",
    ),
    rule(
        "events.k8s.io",
        "events",
        &["create", "patch"],
        "controller/pass events through kube's Recorder (create, patch for a repeat)",
    ),
    rule(
        "authentication.k8s.io",
        "tokenreviews",
        &["create"],
        "api/auth.rs bearer tokens of REST API callers",
    ),
    rule(
        "authorization.k8s.io",
        "subjectaccessreviews",
        &["create"],
        "api/auth.rs access decisions for REST API callers",
    ),
    Permission {
        scope: Scope::OwnNamespace,
        ..rule(
            "coordination.k8s.io",
            "leases",
            &["create"],
            "controller/leader.rs first acquisition",
        )
    },
    Permission {
        scope: Scope::OwnNamespace,
        names: Names::LeaderLease,
        ..rule(
            "coordination.k8s.io",
            "leases",
            &["get", "update"],
            "controller/leader.rs renew, take over, release",
        )
    },
    Permission {
        scope: Scope::OwnNamespace,
        needed: Needed::SelfSignedCertificate,
        ..rule(
            "",
            "secrets",
            &["create"],
            "webhook/selfsigned.rs first certificate",
        )
    },
    Permission {
        scope: Scope::OwnNamespace,
        names: Names::WebhookSecret,
        needed: Needed::SelfSignedCertificate,
        ..rule(
            "",
            "secrets",
            &["get", "update"],
            "webhook/selfsigned.rs read the shared certificate, renew it",
        )
    },
    Permission {
        names: Names::WebhookConfiguration,
        needed: Needed::SelfSignedCertificate,
        ..rule(
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            &["get", "update"],
            "webhook/selfsigned.rs keeps the caBundle",
        )
    },
];

/// The owners kipam marks `blockOwnerDeletion: true`, by the kind of the object it writes:
/// `(group, resource)` of each. A server running the `OwnerReferencesPermissionEnforcement`
/// admission plugin lets a client set that only with `update` on the owner's `finalizers`
/// subresource, which [`PERMISSIONS`] grants for each of them (a test checks).
pub const BLOCKING_OWNERS: &[(&str, &[(&str, &str)])] = &[
    (
        "IPAddress",
        &[(CAPI_IPAM, "ipaddressclaims"), (IPAM, "ipampools")],
    ),
    ("Namespace", &[(IPAM, "clusters")]),
];

/// The owners of [`BLOCKING_OWNERS`] for objects of `kind`.
pub fn blocking_owners(kind: &str) -> &'static [(&'static str, &'static str)] {
    BLOCKING_OWNERS
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, owners)| *owners)
        .unwrap_or(&[])
}

/// One granted verb, flattened: (scope, group, resource, verb, names).
pub type Grant = (Scope, &'static str, &'static str, &'static str, Names);

/// Every verb needed, one entry each; `self_signed` adds the self-signed certificate's.
pub fn grants(self_signed: bool) -> Vec<Grant> {
    let mut out: Vec<Grant> = PERMISSIONS
        .iter()
        .filter(|p| p.needed == Needed::Always || self_signed)
        .flat_map(|p| {
            p.verbs
                .iter()
                .map(move |v| (p.scope, p.group, p.resource, *v, p.names))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_verb_is_listed_twice_and_names_only_narrow_what_can_be_narrowed() {
        let all = grants(true);
        let mut seen = std::collections::BTreeSet::new();
        for g in &all {
            assert!(seen.insert(*g), "{g:?} listed twice");
            if g.4 != Names::Any {
                assert!(
                    !["create", "list", "watch"].contains(&g.3),
                    "{g:?}: RBAC cannot narrow {} by name",
                    g.3
                );
            }
        }
        assert!(grants(false).len() < all.len());
    }

    #[test]
    fn every_blocking_owner_s_finalizers_may_be_updated() {
        let all = grants(false);
        for (kind, owners) in BLOCKING_OWNERS {
            for (group, resource) in *owners {
                let finalizers = format!("{resource}/finalizers");
                assert!(
                    all.iter().any(|g| g.0 == Scope::Cluster
                        && g.1 == *group
                        && g.2 == finalizers
                        && g.3 == "update"
                        && g.4 == Names::Any),
                    "{kind} is written with blockOwnerDeletion on its {resource} owner: \
                     `update` on {finalizers} ({group}) must be granted"
                );
            }
        }
    }
}
