//! The resource types an instance serves: a fixed table of built-in kinds plus whatever
//! `CustomResourceDefinition`s register at run time.

use crate::error::ApiError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the server does with requests for a resource type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Behaviour {
    /// Objects are kept in the store (the usual case).
    Stored,
    /// `authentication.k8s.io/v1 TokenReview`: create only, answered by the scripted function.
    TokenReview,
    /// `authorization.k8s.io/v1 SubjectAccessReview` and `LocalSubjectAccessReview`.
    SubjectAccessReview,
    /// `authorization.k8s.io/v1 SelfSubjectAccessReview`: the user comes from the request's token.
    SelfSubjectAccessReview,
}

/// How object names of a type are validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameRule {
    /// Lowercase RFC 1123 subdomain: `[a-z0-9]([-a-z0-9.]*[a-z0-9])?`, at most 253 characters.
    Subdomain,
    /// Lowercase RFC 1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
    Label,
    /// Anything that is a valid URL path segment (RBAC objects allow `system:foo`).
    PathSegment,
}

/// One served resource type at one version.
#[derive(Debug, Clone)]
pub struct ResourceType {
    /// API group (`""` for core).
    pub group: String,
    /// Version served (`v1`, `v1alpha1`, ...).
    pub version: String,
    /// Plural resource name used in URLs.
    pub plural: String,
    /// Singular name (discovery and kubectl-style lookups).
    pub singular: String,
    /// Kind of the objects.
    pub kind: String,
    /// Kind of lists (`<Kind>List` unless a CRD says otherwise).
    pub list_kind: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Whether the type has a `/status` subresource.
    pub status: bool,
    /// Short names announced in discovery (`cm`, `ns`, ...).
    pub short_names: Vec<String>,
    /// Categories announced in discovery (`all`, ...).
    pub categories: Vec<String>,
    pub(crate) behaviour: Behaviour,
    /// `metadata.generation` is maintained.
    pub(crate) generation: bool,
    /// A PUT without `metadata.resourceVersion` is accepted.
    pub(crate) unconditional_update: bool,
    /// A PUT of a missing object creates it.
    pub(crate) create_on_update: bool,
    /// Strategic merge patches are accepted (custom resources refuse them with 415).
    pub(crate) strategic_merge: bool,
    pub(crate) name_rule: NameRule,
    /// The CRD that registered this type, if any.
    pub(crate) crd: Option<String>,
    /// The version's `openAPIV3Schema`, used to prune, default and validate custom resources.
    pub(crate) schema: Option<Arc<Value>>,
}

impl ResourceType {
    /// A stored resource type with the defaults of a built-in kind: generation tracking off,
    /// unconditional updates allowed, strategic merge accepted. Adjust with the `with_*` methods
    /// and register it with [`crate::ApiServer::register_resource`].
    pub fn new(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        ResourceType {
            group: group.to_string(),
            version: version.to_string(),
            plural: plural.to_string(),
            singular: kind.to_ascii_lowercase(),
            kind: kind.to_string(),
            list_kind: format!("{kind}List"),
            namespaced,
            status: false,
            short_names: Vec::new(),
            categories: Vec::new(),
            behaviour: Behaviour::Stored,
            generation: false,
            unconditional_update: true,
            create_on_update: false,
            strategic_merge: true,
            name_rule: NameRule::Subdomain,
            crd: None,
            schema: None,
        }
    }

    /// Adds a `/status` subresource.
    pub fn with_status(mut self) -> Self {
        self.status = true;
        self
    }

    /// Maintains `metadata.generation`.
    pub fn with_generation(mut self) -> Self {
        self.generation = true;
        self
    }

    /// Sets the short names.
    pub fn with_short_names(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    fn create_on_update(mut self) -> Self {
        self.create_on_update = true;
        self
    }

    fn names(mut self, rule: NameRule) -> Self {
        self.name_rule = rule;
        self
    }

    fn review(mut self, b: Behaviour) -> Self {
        self.behaviour = b;
        self
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Where objects of this type live in the store: all versions of a resource share it.
    pub(crate) fn storage_key(&self) -> StorageKey {
        (self.group.clone(), self.plural.clone())
    }

    /// The verbs announced in discovery for the main resource.
    pub(crate) fn verbs(&self) -> Vec<&'static str> {
        match self.behaviour {
            Behaviour::Stored => vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ],
            _ => vec!["create"],
        }
    }
}

/// `(group, plural)`: the identity of a resource's storage.
pub(crate) type StorageKey = (String, String);

/// The built-in resource types every instance serves.
fn builtins() -> Vec<ResourceType> {
    use NameRule::*;
    let core = |kind: &str, plural: &str, ns: bool| ResourceType::new("", "v1", kind, plural, ns);
    let g = |group: &str, version: &str, kind: &str, plural: &str, ns: bool| {
        ResourceType::new(group, version, kind, plural, ns)
    };
    vec![
        core("Namespace", "namespaces", false)
            .with_status()
            .with_short_names(&["ns"])
            .names(Label),
        core("ConfigMap", "configmaps", true).with_short_names(&["cm"]),
        core("Secret", "secrets", true),
        core("ServiceAccount", "serviceaccounts", true).with_short_names(&["sa"]),
        core("Service", "services", true)
            .with_status()
            .with_short_names(&["svc"])
            .names(Label),
        core("Endpoints", "endpoints", true)
            .with_short_names(&["ep"])
            .create_on_update(),
        core("Event", "events", true)
            .with_short_names(&["ev"])
            .create_on_update(),
        core("Pod", "pods", true)
            .with_status()
            .with_generation()
            .with_short_names(&["po"]),
        core("Node", "nodes", false)
            .with_status()
            .with_short_names(&["no"]),
        core("PersistentVolumeClaim", "persistentvolumeclaims", true)
            .with_status()
            .with_short_names(&["pvc"]),
        core("PersistentVolume", "persistentvolumes", false)
            .with_status()
            .with_short_names(&["pv"]),
        g("events.k8s.io", "v1", "Event", "events", true)
            .with_short_names(&["ev"])
            .create_on_update(),
        g("coordination.k8s.io", "v1", "Lease", "leases", true).create_on_update(),
        g(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
        )
        .with_status()
        .with_generation()
        .with_short_names(&["crd", "crds"]),
        g(
            "authentication.k8s.io",
            "v1",
            "TokenReview",
            "tokenreviews",
            false,
        )
        .review(Behaviour::TokenReview),
        g(
            "authorization.k8s.io",
            "v1",
            "SubjectAccessReview",
            "subjectaccessreviews",
            false,
        )
        .review(Behaviour::SubjectAccessReview),
        g(
            "authorization.k8s.io",
            "v1",
            "LocalSubjectAccessReview",
            "localsubjectaccessreviews",
            true,
        )
        .review(Behaviour::SubjectAccessReview),
        g(
            "authorization.k8s.io",
            "v1",
            "SelfSubjectAccessReview",
            "selfsubjectaccessreviews",
            false,
        )
        .review(Behaviour::SelfSubjectAccessReview),
        g("apps", "v1", "Deployment", "deployments", true)
            .with_status()
            .with_generation()
            .with_short_names(&["deploy"]),
        g("apps", "v1", "StatefulSet", "statefulsets", true)
            .with_status()
            .with_generation()
            .with_short_names(&["sts"]),
        g("apps", "v1", "DaemonSet", "daemonsets", true)
            .with_status()
            .with_generation()
            .with_short_names(&["ds"]),
        g("apps", "v1", "ReplicaSet", "replicasets", true)
            .with_status()
            .with_generation()
            .with_short_names(&["rs"]),
        g("batch", "v1", "Job", "jobs", true)
            .with_status()
            .with_generation(),
        g("batch", "v1", "CronJob", "cronjobs", true)
            .with_status()
            .with_generation()
            .with_short_names(&["cj"]),
        g("rbac.authorization.k8s.io", "v1", "Role", "roles", true).names(PathSegment),
        g(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            true,
        )
        .names(PathSegment),
        g(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            false,
        )
        .names(PathSegment),
        g(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
        )
        .names(PathSegment),
        g(
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
            "networkpolicies",
            true,
        )
        .with_generation()
        .with_short_names(&["netpol"]),
        g("networking.k8s.io", "v1", "Ingress", "ingresses", true)
            .with_status()
            .with_generation()
            .with_short_names(&["ing"]),
        g(
            "networking.k8s.io",
            "v1",
            "IngressClass",
            "ingressclasses",
            false,
        )
        .with_generation(),
        g(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
        )
        .with_status()
        .with_generation()
        .with_short_names(&["pdb"]),
        g(
            "autoscaling",
            "v2",
            "HorizontalPodAutoscaler",
            "horizontalpodautoscalers",
            true,
        )
        .with_status()
        .with_generation()
        .with_short_names(&["hpa"]),
        g(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            false,
        )
        .with_generation(),
        g(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            false,
        )
        .with_generation(),
        g(
            "storage.k8s.io",
            "v1",
            "StorageClass",
            "storageclasses",
            false,
        )
        .with_short_names(&["sc"]),
        g(
            "scheduling.k8s.io",
            "v1",
            "PriorityClass",
            "priorityclasses",
            false,
        )
        .with_short_names(&["pc"]),
        g(
            "apiregistration.k8s.io",
            "v1",
            "APIService",
            "apiservices",
            false,
        )
        .with_status()
        .names(PathSegment),
    ]
}

/// Orders versions the way Kubernetes prefers them: GA before beta before alpha, higher
/// numbers first, anything unparseable last (alphabetically).
pub(crate) fn version_priority(v: &str) -> (u8, i64, i64, String) {
    let parse = || -> Option<(u8, i64, i64)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: i64 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((0, -major, 0));
        }
        let (level, num) = if let Some(n) = tail.strip_prefix("beta") {
            (1, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (2, n)
        } else {
            return None;
        };
        let minor: i64 = if num.is_empty() { 0 } else { num.parse().ok()? };
        Some((level, -major, -minor))
    };
    match parse() {
        Some((l, a, b)) => (l, a, b, String::new()),
        None => (3, 0, 0, v.to_string()),
    }
}

/// All served resource types of one instance.
#[derive(Debug, Clone)]
pub(crate) struct Registry {
    types: BTreeMap<(String, String, String), ResourceType>,
}

impl Registry {
    pub(crate) fn new() -> Self {
        let mut r = Registry {
            types: BTreeMap::new(),
        };
        for t in builtins() {
            r.register(t);
        }
        r
    }

    pub(crate) fn register(&mut self, t: ResourceType) {
        self.types
            .insert((t.group.clone(), t.version.clone(), t.plural.clone()), t);
    }

    /// Drops every type a CRD registered.
    pub(crate) fn unregister_crd(&mut self, crd_name: &str) {
        self.types.retain(|_, t| t.crd.as_deref() != Some(crd_name));
    }

    pub(crate) fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
    }

    /// The type for an object's `apiVersion` and `kind`.
    pub(crate) fn by_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceType> {
        let (group, version) = split_api_version(api_version);
        self.types
            .values()
            .find(|t| t.group == group && t.version == version && t.kind == kind)
    }

    /// Resolves a name the way kubectl does: `plural`, `singular`, `Kind` or a short name,
    /// optionally qualified with `.group`. The core group wins ties, then the preferred version.
    pub(crate) fn resolve(&self, name: &str) -> Option<&ResourceType> {
        let mut candidates: Vec<&ResourceType> = self
            .types
            .values()
            .filter(|t| {
                let matches = |n: &str| {
                    n == t.plural
                        || n == t.singular
                        || n.eq_ignore_ascii_case(&t.kind)
                        || t.short_names.iter().any(|s| s == n)
                };
                matches(name)
                    || name
                        .split_once('.')
                        .is_some_and(|(n, g)| g == t.group && matches(n))
            })
            .collect();
        candidates.sort_by_key(|t| {
            (
                !t.group.is_empty(),
                t.group.clone(),
                version_priority(&t.version),
            )
        });
        candidates.into_iter().next()
    }

    /// All versions of a stored resource, preferred first.
    pub(crate) fn versions_of(&self, group: &str, plural: &str) -> Vec<&ResourceType> {
        let mut v: Vec<&ResourceType> = self
            .types
            .values()
            .filter(|t| t.group == group && t.plural == plural)
            .collect();
        v.sort_by_key(|t| version_priority(&t.version));
        v
    }

    /// Groups with their versions, preferred version first (core group excluded).
    pub(crate) fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in self.types.values() {
            if t.group.is_empty() {
                continue;
            }
            let vs = groups.entry(t.group.clone()).or_default();
            if !vs.contains(&t.version) {
                vs.push(t.version.clone());
            }
        }
        groups
            .into_iter()
            .map(|(g, mut vs)| {
                vs.sort_by_key(|v| version_priority(v));
                (g, vs)
            })
            .collect()
    }

    /// Resource types served at one group/version.
    pub(crate) fn in_group_version<'a>(
        &'a self,
        group: &'a str,
        version: &'a str,
    ) -> impl Iterator<Item = &'a ResourceType> + 'a {
        self.types
            .values()
            .filter(move |t| t.group == group && t.version == version)
    }

    pub(crate) fn has_group_version(&self, group: &str, version: &str) -> bool {
        self.in_group_version(group, version).next().is_some()
    }

    /// True when the group/version is served by the server itself (built-in types, or types
    /// registered with `register_resource`), not only by CRDs. A real server answers an
    /// unknown resource there with a `Status`, and anything else it does not serve (a group
    /// nobody serves, or an unknown resource of a CRD's group) with a plain-text 404.
    pub(crate) fn serves_natively(&self, group: &str, version: &str) -> bool {
        self.in_group_version(group, version)
            .any(|t| t.crd.is_none())
    }
}

/// `group/version` → `(group, version)`; a bare `v1` is the core group.
pub(crate) fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}

/// Reads a `CustomResourceDefinition` and returns the resource types it serves, or the
/// validation errors the real server would report.
pub(crate) fn types_from_crd(crd: &Value) -> Result<Vec<ResourceType>, ApiError> {
    let name = crate::util::meta_str(crd, "name").to_string();
    let invalid = |causes: Vec<String>| {
        ApiError::invalid(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            &name,
            &causes,
        )
    };
    let spec = crd.get("spec").cloned().unwrap_or(Value::Null);
    let s = |v: &Value, p: &str| {
        crate::util::get_dotted(v, p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let group = s(&spec, "group");
    let plural = s(&spec, "names.plural");
    let kind = s(&spec, "names.kind");
    let scope = s(&spec, "scope");
    let mut causes = Vec::new();
    if group.is_empty() {
        causes.push("spec.group: Required value".to_string());
    } else if !group.contains('.') {
        causes.push(format!(
            "spec.group: Invalid value: {group:?}: should be a domain with at least one dot"
        ));
    }
    if plural.is_empty() {
        causes.push("spec.names.plural: Required value".to_string());
    }
    if kind.is_empty() {
        causes.push("spec.names.kind: Required value".to_string());
    }
    if scope != "Namespaced" && scope != "Cluster" {
        causes.push(format!(
            "spec.scope: Unsupported value: {scope:?}: supported values: \"Cluster\", \"Namespaced\""
        ));
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(format!(
            "metadata.name: Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"
        ));
    }
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        causes.push("spec.versions: Invalid value: must have at least one version".to_string());
    }
    let storage_count = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if !versions.is_empty() && storage_count != 1 {
        causes.push(
            "spec.versions: Invalid value: must have exactly one version marked as storage version"
                .to_string(),
        );
    }
    if versions.iter().any(|v| {
        v.get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
    }) {
        causes.push("spec.versions[].name: Required value".to_string());
    }
    if !causes.is_empty() {
        return Err(invalid(causes));
    }

    let singular = match s(&spec, "names.singular") {
        s if s.is_empty() => kind.to_ascii_lowercase(),
        s => s,
    };
    let list_kind = match s(&spec, "names.listKind") {
        s if s.is_empty() => format!("{kind}List"),
        s => s,
    };
    let strings = |p: &str| -> Vec<String> {
        crate::util::get_dotted(&spec, p)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let short_names = strings("names.shortNames");
    let categories = strings("names.categories");
    let mut out = Vec::new();
    for v in &versions {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let version = s(v, "name");
        let status = crate::util::get_dotted(v, "subresources.status").is_some();
        let schema = crate::util::get_dotted(v, "schema.openAPIV3Schema")
            .cloned()
            .map(Arc::new);
        out.push(ResourceType {
            group: group.clone(),
            version,
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            list_kind: list_kind.clone(),
            namespaced: scope == "Namespaced",
            status,
            short_names: short_names.clone(),
            categories: categories.clone(),
            behaviour: Behaviour::Stored,
            generation: true,
            unconditional_update: false,
            create_on_update: false,
            strategic_merge: false,
            name_rule: NameRule::Subdomain,
            crd: Some(name.clone()),
            schema,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_like_kubernetes() {
        let mut v = vec!["v1alpha1", "v2", "v1beta2", "v1", "foo", "v1beta1", "v10"];
        v.sort_by_key(|x| version_priority(x));
        assert_eq!(
            v,
            vec!["v10", "v2", "v1", "v1beta2", "v1beta1", "v1alpha1", "foo"]
        );
    }

    #[test]
    fn resolves_kubectl_style_names() {
        let r = Registry::new();
        assert_eq!(r.resolve("cm").map(|t| t.kind.as_str()), Some("ConfigMap"));
        assert_eq!(r.resolve("events").map(|t| t.group.as_str()), Some(""));
        assert_eq!(
            r.resolve("events.events.k8s.io").map(|t| t.group.as_str()),
            Some("events.k8s.io")
        );
        assert_eq!(
            r.resolve("Lease").map(|t| t.plural.as_str()),
            Some("leases")
        );
        assert!(r.resolve("nothing").is_none());
    }
}
