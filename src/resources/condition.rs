//! Status conditions, as Kubernetes conventions describe them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds::*;

/// One aspect of an object's current state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type, e.g. `Ready`, `IPAMReady`, `CapacityWarning`.
    #[serde(rename = "type")]
    #[schemars(length(max = MAX_CONDITION_TYPE))]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(extend("enum" = ["True", "False", "Unknown"]))]
    pub status: String,
    /// A CamelCase word saying why the condition last changed.
    #[serde(default)]
    #[schemars(
        length(max = MAX_CONDITION_REASON),
        pattern(PATTERN_CONDITION_REASON)
    )]
    pub reason: String,
    /// A human-readable explanation.
    #[serde(default)]
    #[schemars(length(max = MAX_MESSAGE))]
    pub message: String,
    /// When the status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_TIMESTAMP), extend("format" = "date-time"))]
    pub last_transition_time: Option<String>,
    /// The `metadata.generation` the condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
}
