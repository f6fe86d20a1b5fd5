//! Rendered MetalLB objects against MetalLB's own CRD schema (`fixtures/metallb-crds.yaml`,
//! a copy of `../shared/thirdparty/metallb-crds.yaml`).
//!
//! The validator below implements the parts of OpenAPI v3 structural schemas these CRDs use —
//! `type`, `required`, `properties`, `additionalProperties`, `items`, `enum`, `minimum`,
//! `maximum`, `nullable`, `x-kubernetes-preserve-unknown-fields` — and treats a field the
//! schema does not know as an error, since the API server would silently prune it.

use kipam::render::TemplateData;
use serde_json::{Value, json};

use super::{cluster, metallb, prefix, range};

const CRDS: &str = include_str!("fixtures/metallb-crds.yaml");

/// The `openAPIV3Schema` of a served version of the CRD for `apiVersion` and `kind`.
fn schema_for(api_version: &str, kind: &str) -> Option<Value> {
    let crds: Vec<Value> = serde_saphyr::from_multiple(CRDS).ok()?;
    let (group, version) = api_version.split_once('/')?;
    crds.into_iter()
        .filter(|crd| crd["spec"]["group"] == group && crd["spec"]["names"]["kind"] == kind)
        .flat_map(|crd| {
            crd["spec"]["versions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .find(|v| v["name"] == version && v["served"] == true)
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
}

/// Every way `value` breaks `schema`, as `path: problem` lines.
fn validate(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let here = if path.is_empty() { "." } else { path };
    if value.is_null() {
        if schema["nullable"] != true {
            errors.push(format!("{here}: null is not allowed"));
        }
        return;
    }
    if let Some(expected) = schema["type"].as_str() {
        let ok = match expected {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            other => {
                errors.push(format!(
                    "{here}: schema type {other:?} is not known to this validator"
                ));
                return;
            }
        };
        if !ok {
            errors.push(format!("{here}: expected {expected}, got {value}"));
            return;
        }
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        errors.push(format!("{here}: {value} is not one of {allowed:?}"));
    }
    if let Some(number) = value.as_f64() {
        if let Some(min) = schema["minimum"].as_f64()
            && number < min
        {
            errors.push(format!("{here}: {number} is below the minimum {min}"));
        }
        if let Some(max) = schema["maximum"].as_f64()
            && number > max
        {
            errors.push(format!("{here}: {number} is above the maximum {max}"));
        }
    }
    if let Some(items) = value.as_array() {
        for (i, item) in items.iter().enumerate() {
            validate(&schema["items"], item, &format!("{path}[{i}]"), errors);
        }
    }
    let Some(object) = value.as_object() else {
        return;
    };
    for field in schema["required"].as_array().into_iter().flatten() {
        if let Some(field) = field.as_str()
            && !object.contains_key(field)
        {
            errors.push(format!("{here}: required field {field} is missing"));
        }
    }
    if path == ".metadata" {
        validate_object_meta(value, errors);
        return;
    }
    for (key, child) in object {
        let child_path = format!("{path}.{key}");
        if let Some(property) = schema["properties"].get(key) {
            validate(property, child, &child_path, errors);
        } else if schema["additionalProperties"].is_object() {
            validate(&schema["additionalProperties"], child, &child_path, errors);
        } else if schema["additionalProperties"] != true
            && schema["x-kubernetes-preserve-unknown-fields"] != true
        {
            errors.push(format!(
                "{child_path}: unknown field (the API server would prune it)"
            ));
        }
    }
}

/// The API server checks `metadata` as ObjectMeta whatever the CRD says (`type: object`):
/// the parts kipam writes are the name, the namespace and string labels.
fn validate_object_meta(metadata: &Value, errors: &mut Vec<String>) {
    if metadata["name"].as_str().is_none_or(str::is_empty) {
        errors.push(".metadata.name: a non-empty string is required".to_string());
    }
    if !(metadata["namespace"].is_null() || metadata["namespace"].is_string()) {
        errors.push(".metadata.namespace: expected a string".to_string());
    }
    if let Some(labels) = metadata.get("labels") {
        let ok = labels
            .as_object()
            .is_some_and(|labels| labels.values().all(Value::is_string));
        if !ok {
            errors.push(".metadata.labels: expected a map of strings".to_string());
        }
    }
}

/// Checks one object against the schema of its kind; `Err` lists every problem.
fn check(object: &Value) -> Result<(), Vec<String>> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let Some(schema) = schema_for(api_version, kind) else {
        return Err(vec![format!(
            "no served CRD version for {api_version} {kind}"
        )]);
    };
    let mut errors = Vec::new();
    validate(&schema, object, "", &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Every shape of cluster the MetalLB addon distinguishes.
fn scenarios() -> Vec<TemplateData> {
    let user_pool = "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: mine\n  namespace: metallb-system\nspec:\n  addresses: [172.30.0.0/29]\n  autoAssign: false\n";
    vec![
        TemplateData::new(
            cluster("range", "dc")
                .with_allocation("metallb", range("dc", &["192.168.1.0-192.168.1.7"])),
        ),
        TemplateData::new(
            cluster("prefix", "dc").with_allocation("metallb", prefix("dc", "192.168.1.0/30")),
        ),
        TemplateData::new(
            cluster("v6", "dc").with_allocation("metallb", prefix("dc", "2001:db8::/120")),
        ),
        TemplateData::new(cluster("pieces", "dc").with_allocation(
            "metallb",
            range(
                "dc",
                &["192.168.1.0-192.168.1.7", "192.168.1.16-192.168.1.23"],
            ),
        )),
        TemplateData::new(
            cluster("dual", "dc")
                .with_allocation("metallb", prefix("dc", "192.168.2.0/30"))
                .with_allocation("metallb-ipv4", range("dc", &["10.0.0.0-10.0.0.7"]))
                .with_allocation("metallb-ipv6", prefix("dc", "2001:db8:1::/120")),
        ),
        TemplateData::new(cluster("none", "dc")),
        TemplateData::new(
            cluster("user", "dc").with_allocation("metallb", prefix("dc", "192.168.3.0/30")),
        )
        .with_variable("addressPoolYaml", json!(user_pool)),
        TemplateData::new(
            cluster("off", "dc").with_allocation("metallb", prefix("dc", "192.168.3.0/30")),
        )
        .with_variable("disableAutoIPAMAllocation", json!(true)),
    ]
}

#[test]
fn rendered_metallb_objects_satisfy_metallb_crds() {
    let mut checked = std::collections::BTreeMap::<String, usize>::new();
    for data in scenarios() {
        for object in metallb(&data).objects {
            assert_eq!(object["apiVersion"], "metallb.io/v1beta1", "{object}");
            if let Err(errors) = check(&object) {
                panic!("{object} breaks MetalLB's schema:\n{}", errors.join("\n"));
            }
            *checked
                .entry(object["kind"].as_str().unwrap_or_default().to_string())
                .or_default() += 1;
        }
    }
    assert_eq!(checked.get("IPAddressPool"), Some(&8));
    assert_eq!(checked.get("L2Advertisement"), Some(&8));
}

#[test]
fn the_validator_catches_what_metallb_would_refuse() {
    let pool = |spec: Value| {
        json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
               "metadata": {"name": "p", "namespace": "metallb-system"}, "spec": spec})
    };
    let cases = [
        (
            pool(json!({"addresses": "10.0.0.0/30"})),
            ".spec.addresses: expected array",
        ),
        (
            pool(json!({})),
            ".spec: required field addresses is missing",
        ),
        (
            pool(json!({"addresses": [], "adresses": []})),
            ".spec.adresses: unknown field",
        ),
        (
            pool(json!({"addresses": [], "autoAssign": "yes"})),
            ".spec.autoAssign: expected boolean",
        ),
        (
            pool(json!({"addresses": [7]})),
            ".spec.addresses[0]: expected string",
        ),
        (
            json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "p"}}),
            ".: required field spec is missing",
        ),
        (
            json!({"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "a"},
                   "spec": {"preferredNodeSelectors": [{"preference": {}, "weight": 0}]}}),
            ".spec.preferredNodeSelectors[0].weight: 0 is below the minimum 1",
        ),
        (
            json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                   "metadata": {"name": "p", "labels": {"a": 1}}, "spec": {"addresses": []}}),
            ".metadata.labels: expected a map of strings",
        ),
        (
            json!({"apiVersion": "metallb.io/v2", "kind": "IPAddressPool", "metadata": {"name": "p"}}),
            "no served CRD version for metallb.io/v2 IPAddressPool",
        ),
    ];
    for (object, expected) in cases {
        match check(&object) {
            Ok(()) => panic!("{object} passed"),
            Err(errors) => assert!(
                errors.iter().any(|e| e.starts_with(expected)),
                "{object}: expected {expected:?}, got {errors:?}"
            ),
        }
    }
}
