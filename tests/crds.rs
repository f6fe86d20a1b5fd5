//! The CRD manifests under `crds/` are generated from the Rust types and must stay in step;
//! every schema node must carry a `type` (the API server rejects non-structural schemas).
//!
//! Regenerate with `KIPAM_UPDATE_CRDS=1 cargo test --test crds` (or `kipam crds --out crds`).

use std::path::PathBuf;

use serde_json::Value;

fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crds")
}

#[test]
fn crds_directory_is_up_to_date() {
    let files = kipam::resources::crd_files().expect("CRDs serialise");
    let dir = crds_dir();
    if std::env::var_os("KIPAM_UPDATE_CRDS").is_some() {
        std::fs::create_dir_all(&dir).expect("create crds/");
        for (name, yaml) in &files {
            std::fs::write(dir.join(name), yaml).expect("write CRD");
        }
    }
    let mut stale = Vec::new();
    for (name, yaml) in &files {
        let on_disk = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        if &on_disk != yaml {
            stale.push(name.clone());
        }
    }
    let mut expected: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    expected.sort();
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    present.sort();
    assert!(
        stale.is_empty(),
        "crds/ is stale for {stale:?}: run `KIPAM_UPDATE_CRDS=1 cargo test --test crds`"
    );
    assert_eq!(present, expected, "crds/ holds exactly one file per CRD");
}

/// Walks a schema; every node must say its type, or be a free-form object.
fn untyped_nodes(node: &Value, path: &str, out: &mut Vec<String>) {
    let Some(obj) = node.as_object() else { return };
    let typed = obj.contains_key("type")
        || obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if !typed {
        out.push(path.to_string());
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            untyped_nodes(v, &format!("{path}.{k}"), out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = obj.get(key)
            && v.is_object()
        {
            untyped_nodes(v, &format!("{path}[{key}]"), out);
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if obj.contains_key(key) {
            out.push(format!("{path} uses {key}"));
        }
    }
}

#[test]
fn every_schema_node_has_a_type() {
    for crd in kipam::resources::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        for version in &crd.spec.versions {
            let schema = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("schema present");
            let json = serde_json::to_value(schema).expect("schema serialises");
            let mut bad = Vec::new();
            untyped_nodes(&json, &name, &mut bad);
            assert!(bad.is_empty(), "untyped schema nodes in {name}: {bad:?}");
        }
    }
}

#[test]
fn every_field_is_documented() {
    fn undocumented(node: &Value, path: &str, out: &mut Vec<String>) {
        let Some(props) = node.get("properties").and_then(Value::as_object) else {
            return;
        };
        for (k, v) in props {
            let p = format!("{path}.{k}");
            // metadata, apiVersion and kind come from Kubernetes itself.
            if !matches!(k.as_str(), "metadata" | "apiVersion" | "kind")
                && v.get("description").is_none()
            {
                out.push(p.clone());
            }
            undocumented(v, &p, out);
            for key in ["items", "additionalProperties"] {
                if let Some(inner) = v.get(key) {
                    undocumented(inner, &p, out);
                }
            }
        }
    }
    for crd in kipam::resources::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let schema = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("schema present");
        let json = serde_json::to_value(schema).expect("schema serialises");
        let mut bad = Vec::new();
        undocumented(&json, &name, &mut bad);
        assert!(
            bad.is_empty(),
            "fields without a description in {name}: {bad:?}"
        );
    }
}

#[test]
fn short_names_and_scopes() {
    let crds = kipam::resources::crds();
    let find = |kind: &str| {
        crds.iter()
            .find(|c| c.spec.names.kind == kind)
            .unwrap_or_else(|| panic!("{kind} CRD"))
    };
    assert_eq!(find("IPAMPool").spec.scope, "Cluster");
    assert_eq!(
        find("IPAMPool").spec.names.short_names,
        Some(vec!["ipp".to_string()])
    );
    assert_eq!(find("IPAMAllocation").spec.scope, "Namespaced");
    assert_eq!(
        find("IPAMAllocation").spec.names.short_names,
        Some(vec!["ipa".to_string()])
    );
    assert_eq!(find("Cluster").spec.scope, "Cluster");
    assert_eq!(find("Addon").spec.scope, "Namespaced");
    assert_eq!(find("IPAMPoolRecord").spec.scope, "Cluster");
    for crd in &crds {
        assert_eq!(crd.spec.group, "ipam.kipam.dev");
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        // The pool record is written by kipam alone and has no status of its own.
        assert!(
            crd.spec.names.kind == "IPAMPoolRecord"
                || v.subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some()
        );
        assert!(
            !v.additional_printer_columns
                .clone()
                .unwrap_or_default()
                .is_empty()
        );
    }
}
