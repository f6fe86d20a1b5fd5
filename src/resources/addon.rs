//! `Addon`: manifests rendered for one cluster and applied inside it.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;
use super::bounds::*;

/// An addon installed in one user cluster. Lives in the cluster's namespace; `spec.name`
/// picks the templates (`addons/<name>/`).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.kipam.dev",
    version = "v1alpha1",
    kind = "Addon",
    plural = "addons",
    singular = "addon",
    doc = "An addon installed in one user cluster.",
    namespaced,
    status = "AddonStatus",
    printcolumn = r#"{"name":"Addon","type":"string","jsonPath":".spec.name"}"#,
    printcolumn = r#"{"name":"Applied","type":"string","jsonPath":".status.conditions[?(@.type==\"Applied\")].status"}"#,
    printcolumn = r#"{"name":"In Sync","type":"string","jsonPath":".status.conditions[?(@.type==\"InSync\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AddonSpec {
    /// The addon to render, a directory under the addons directory (e.g. `metallb`).
    #[schemars(length(max = MAX_LABEL), pattern(PATTERN_DNS_LABEL))]
    pub name: String,
    /// Free-form values the templates see as `Variables`.
    #[serde(default)]
    #[schemars(schema_with = "super::free_form_object", extend("maxProperties" = MAX_VARIABLES))]
    pub variables: serde_json::Map<String, serde_json::Value>,
}

/// Observed state of an addon.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddonStatus {
    /// `Rendered`, `Applied`, `InSync`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_CONDITIONS))]
    pub conditions: Vec<Condition>,
    /// The objects last applied to the user cluster (used to prune what is no longer rendered).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_APPLIED_OBJECTS))]
    pub applied_objects: Vec<AppliedObject>,
    /// Hash of the last applied manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_HASH))]
    pub last_applied_hash: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// When every rendered object was last applied successfully (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_TIMESTAMP), extend("format" = "date-time"))]
    pub last_applied_time: Option<String>,
}

/// One object applied to a user cluster.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct AppliedObject {
    /// `group/version`, or `version` for the core group.
    #[schemars(length(max = MAX_API_VERSION))]
    pub api_version: String,
    /// Kind of the object.
    #[schemars(length(max = MAX_KIND))]
    pub kind: String,
    /// Namespace of the object; empty for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = MAX_LABEL))]
    pub namespace: String,
    /// Name of the object.
    #[schemars(length(max = MAX_SUBDOMAIN))]
    pub name: String,
}
