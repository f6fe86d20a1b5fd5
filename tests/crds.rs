//! The CRD manifests under `crds/` are generated from the Rust types and must stay in step;
//! every schema node must carry a `type` (the API server rejects non-structural schemas) and
//! every string, list and map a bound (the API server refuses CEL rules whose estimated cost
//! over unbounded input exceeds its budget).
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

/// Walks a schema; every string needs `maxLength` (or an `enum`), every list `maxItems`,
/// every map (`additionalProperties`) and every free-form object `maxProperties`, every
/// integer or number a `minimum`. Returns the paths of the nodes that break this.
fn unbounded_nodes(node: &Value, path: &str, out: &mut Vec<String>) {
    let Some(obj) = node.as_object() else { return };
    let has = |k: &str| obj.contains_key(k);
    match obj.get("type").and_then(Value::as_str) {
        Some("string") if !has("maxLength") && !has("enum") => {
            out.push(format!("{path}: string without maxLength"))
        }
        Some("array") if !has("maxItems") => out.push(format!("{path}: list without maxItems")),
        Some("integer" | "number") if !has("minimum") => {
            out.push(format!("{path}: number without minimum"))
        }
        Some("object") => {
            let is_struct = obj
                .get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| !p.is_empty())
                && !obj
                    .get("additionalProperties")
                    .is_some_and(Value::is_object);
            if !is_struct && !has("maxProperties") {
                out.push(format!("{path}: map without maxProperties"));
            }
        }
        _ => {}
    }
    if obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) && !has("maxLength") {
        out.push(format!("{path}: int-or-string without maxLength"));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            unbounded_nodes(v, &format!("{path}.{k}"), out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = obj.get(key)
            && v.is_object()
        {
            unbounded_nodes(v, &format!("{path}[{key}]"), out);
        }
    }
}

/// The guard that would have caught a real server's refusal of the IPAMPool CRD: generic over
/// every CRD kipam generates, so a new kind is checked without editing this test.
#[test]
fn every_string_list_and_map_is_bounded() {
    let crds = kipam::resources::crds();
    assert!(!crds.is_empty());
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        for version in &crd.spec.versions {
            let schema = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("schema present");
            let json = serde_json::to_value(schema).expect("schema serialises");
            let mut bad = Vec::new();
            unbounded_nodes(&json, &name, &mut bad);
            assert!(
                bad.is_empty(),
                "unbounded schema nodes in {name} {}: {bad:#?}",
                version.name
            );
        }
    }
}

#[test]
fn the_bounds_guard_finds_unbounded_nodes() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "cidr": {"type": "string"},
                    "mode": {"type": "string", "enum": ["a", "b"]},
                    "short": {"type": "string", "maxLength": 4},
                    "list": {"type": "array", "items": {"type": "string", "maxLength": 4}},
                    "map": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 4}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "n": {"type": "integer"},
                    "m": {"type": "integer", "minimum": 0}
                }
            }
        }
    });
    let mut bad = Vec::new();
    unbounded_nodes(&schema, "x", &mut bad);
    bad.sort();
    assert_eq!(
        bad,
        vec![
            "x.spec.cidr: string without maxLength",
            "x.spec.free: map without maxProperties",
            "x.spec.list: list without maxItems",
            "x.spec.map: map without maxProperties",
            "x.spec.n: number without minimum",
        ]
    );
}

/// The CEL rules of every CRD: immutability of a pool datacenter's `type` and
/// `allocationPrefix` (`poolCidr` may be widened: the webhook judges it), and the name rules a
/// schema cannot say with a pattern.
#[test]
fn cel_rules_are_where_they_belong() {
    let crds = kipam::resources::crds();
    let rules = |kind: &str| -> Vec<String> {
        let crd = crds.iter().find(|c| c.spec.names.kind == kind).unwrap();
        let json = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let mut out = Vec::new();
        fn collect(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::Array(rs)) = m.get("x-kubernetes-validations") {
                        for r in rs {
                            out.push(r["rule"].as_str().unwrap_or_default().to_string());
                        }
                    }
                    m.values().for_each(|x| collect(x, out));
                }
                Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
                _ => {}
            }
        }
        collect(&json, &mut out);
        out
    };
    let pool = rules("IPAMPool");
    assert!(
        !pool.iter().any(|r| r.contains("oldSelf.poolCidr")),
        "poolCidr may be widened: {pool:?}"
    );
    for needle in [
        "self.type == oldSelf.type",
        "self.allocationPrefix == oldSelf.allocationPrefix",
        "size(self.metadata.name) <= 63",
        "self.all(dc, size(dc) <= 63)",
    ] {
        assert!(
            pool.iter().any(|r| r.contains(needle)),
            "{needle} in {pool:?}"
        );
    }
    let cluster = rules("Cluster");
    assert!(
        cluster
            .iter()
            .any(|r| r.contains("size(self.metadata.name) <= 55"))
    );
    assert!(
        cluster
            .iter()
            .any(|r| r.contains("self.all(pool, size(pool) <= 63)"))
    );
    // No rule runs a regular expression over a map key: the server cannot bound a key's
    // length, so such a rule's estimated cost is unbounded.
    for r in pool.iter().chain(&cluster) {
        assert!(!r.contains("matches("), "{r}");
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

/// The CRDs on a server that evaluates their CEL rules and bounds (the stand-in), through a
/// real kube client, and `kipam validate`'s rules on the same objects.
mod on_a_server {
    use kipam::resources::{Cluster, IPAMPool};
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use kube::{Client, Config};
    use kube_standin::ApiServer;
    use serde_json::{Value, json};

    async fn start() -> (ApiServer, Client) {
        let server = ApiServer::start().await.expect("stand-in starts");
        for (_, yaml) in kipam::resources::crd_files().expect("CRDs serialise") {
            server
                .apply_yaml(&yaml)
                .expect("the stand-in accepts the CRD");
        }
        let kc = Kubeconfig::from_yaml(&server.kubeconfig_yaml()).expect("kubeconfig");
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("config");
        (server, Client::try_from(config).expect("client"))
    }

    fn pool(name: &str, datacenters: Value) -> IPAMPool {
        serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMPool",
            "metadata": {"name": name},
            "spec": {"datacenters": datacenters},
        }))
        .expect("pool")
    }

    /// `(field, message)` of every cause of a 422.
    fn causes(e: &kube::Error) -> Vec<(String, String)> {
        match e {
            kube::Error::Api(s) => {
                assert_eq!(s.code, 422, "{s:?}");
                s.details
                    .as_ref()
                    .map(|d| {
                        d.causes
                            .iter()
                            .map(|c| (c.field.clone(), c.message.clone()))
                            .collect()
                    })
                    .unwrap_or_default()
            }
            other => panic!("not an API error: {other}"),
        }
    }

    fn validation_fields(p: &IPAMPool) -> Vec<String> {
        match kipam::validation::pool_input(p) {
            Ok(_) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.field).collect(),
        }
    }

    #[tokio::test]
    async fn immutable_fields_are_refused_and_everything_else_accepted() {
        let (_server, client) = start().await;
        let api: Api<IPAMPool> = Api::all(client);
        api.create(
            &PostParams::default(),
            &pool(
                "metallb",
                json!({
                    "dc-1": {"type": "prefix", "poolCidr": "10.0.0.0/24", "allocationPrefix": 28,
                             "excludePrefixes": ["10.0.0.0/28"]},
                    "dc-2": {"type": "range", "poolCidr": "192.168.1.0/26", "allocationRange": 8,
                             "excludeRanges": ["192.168.1.1"]},
                }),
            ),
        )
        .await
        .expect("a valid pool is created");

        type Edit = fn(&mut IPAMPool);
        // `poolCidr` has no CEL rule: it may be widened, which only the webhook (and `kipam
        // validate`) can tell from another change, naming the allocations affected.
        let refused: [(&str, Edit, &str, &str); 3] = [
            (
                "type",
                |p| {
                    p.spec.datacenters.get_mut("dc-2").unwrap().type_ =
                        kipam::resources::AllocationType::Prefix
                },
                "spec.datacenters[dc-2]",
                "type is immutable",
            ),
            (
                "allocationPrefix",
                |p| {
                    p.spec
                        .datacenters
                        .get_mut("dc-1")
                        .unwrap()
                        .allocation_prefix = Some(29)
                },
                "spec.datacenters[dc-1]",
                "allocationPrefix is immutable",
            ),
            (
                "allocationPrefix removed",
                |p| {
                    p.spec
                        .datacenters
                        .get_mut("dc-1")
                        .unwrap()
                        .allocation_prefix = None
                },
                "spec.datacenters[dc-1]",
                "allocationPrefix is immutable",
            ),
        ];
        for (what, edit, field, message) in refused {
            let mut p = api.get("metallb").await.expect("get");
            edit(&mut p);
            let e = api
                .replace("metallb", &PostParams::default(), &p)
                .await
                .expect_err(what);
            let got = causes(&e);
            assert!(
                got.contains(&(
                    field.to_string(),
                    format!("Invalid value: \"object\": {message}")
                )),
                "{what}: {got:?}"
            );
        }

        let accepted: [(&str, Edit); 8] = [
            ("widen poolCidr", |p| {
                p.spec.datacenters.get_mut("dc-2").unwrap().pool_cidr = "192.168.1.0/25".into()
            }),
            ("add additionalCidrs", |p| {
                p.spec.datacenters.get_mut("dc-2").unwrap().additional_cidrs =
                    vec!["192.168.7.0/26".into(), "192.168.9.0/28".into()]
            }),
            ("add a datacenter", |p| {
                p.spec.datacenters.insert(
                    "dc-3".into(),
                    serde_json::from_value(
                        json!({"type": "prefix", "poolCidr": "fd00::/48", "allocationPrefix": 64}),
                    )
                    .unwrap(),
                );
            }),
            ("change allocationRange", |p| {
                p.spec.datacenters.get_mut("dc-2").unwrap().allocation_range = Some(16)
            }),
            ("change excludeRanges", |p| {
                p.spec.datacenters.get_mut("dc-2").unwrap().exclude_ranges =
                    vec!["192.168.1.2-192.168.1.3".into()]
            }),
            ("change excludePrefixes", |p| {
                p.spec
                    .datacenters
                    .get_mut("dc-1")
                    .unwrap()
                    .exclude_prefixes
                    .clear()
            }),
            ("change reclaimPolicy", |p| {
                p.spec.reclaim_policy = kipam::resources::ReclaimPolicy::Retain
            }),
            ("remove a datacenter", |p| {
                p.spec.datacenters.remove("dc-3");
            }),
        ];
        for (what, edit) in accepted {
            let mut p = api.get("metallb").await.expect("get");
            edit(&mut p);
            let stored = api
                .replace("metallb", &PostParams::default(), &p)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(stored.spec, p.spec, "{what}");
        }
        // A merge patch that changes an immutable field is refused the same way.
        let e = api
            .patch(
                "metallb",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"datacenters": {"dc-1": {"allocationPrefix": 30}}}})),
            )
            .await
            .expect_err("allocationPrefix is immutable");
        assert!(
            causes(&e)
                .iter()
                .any(|(_, m)| m.ends_with("allocationPrefix is immutable"))
        );
    }

    #[tokio::test]
    async fn over_a_bound_is_refused_by_the_server_and_by_validation_at_the_same_field() {
        let (_server, client) = start().await;
        let pools: Api<IPAMPool> = Api::all(client.clone());
        // 44 characters (an IPv4-compatible IPv6 network written out in full), a CIDR the address
        // parser accepts and of the right shape: only the bound refuses it.
        let long = "0000:0000:0000:0000:0000:0000:100.10.0.0/112".to_string();
        let p = pool(
            "metallb",
            json!({"dc-1": {"type": "prefix", "poolCidr": long, "allocationPrefix": 120}}),
        );
        let e = pools
            .create(&PostParams::default(), &p)
            .await
            .expect_err("too long");
        assert_eq!(
            causes(&e),
            vec![(
                "spec.datacenters[dc-1].poolCidr".to_string(),
                "Too long: may not be more than 43 bytes".to_string()
            )]
        );
        assert_eq!(
            validation_fields(&p),
            vec!["spec.datacenters[dc-1].poolCidr"]
        );

        let many: Vec<String> = (0..1025)
            .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
            .collect();
        let p = pool(
            "metallb",
            json!({"dc-1": {"type": "range", "poolCidr": "10.0.0.0/16", "allocationRange": 4, "excludeRanges": many}}),
        );
        let e = pools
            .create(&PostParams::default(), &p)
            .await
            .expect_err("too many");
        assert_eq!(
            causes(&e),
            vec![(
                "spec.datacenters[dc-1].excludeRanges".to_string(),
                "Too many: 1025: must have at most 1024 items".to_string()
            )]
        );
        assert_eq!(
            validation_fields(&p),
            vec!["spec.datacenters[dc-1].excludeRanges"]
        );

        // Datacenter names: the CEL rule over the map's keys and validation agree.
        let p = pool(
            "metallb",
            json!({"d".repeat(64): {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4}}),
        );
        let e = pools
            .create(&PostParams::default(), &p)
            .await
            .expect_err("dc name");
        assert_eq!(
            causes(&e),
            vec![(
                "spec.datacenters".to_string(),
                "Invalid value: \"object\": datacenter names must be at most 63 characters"
                    .to_string()
            )]
        );
        assert_eq!(validation_fields(&p), vec!["spec.datacenters"]);

        // A pattern: the shape of a CIDR.
        let p = pool(
            "metallb",
            json!({"dc-1": {"type": "range", "poolCidr": "ten/8", "allocationRange": 4}}),
        );
        let e = pools
            .create(&PostParams::default(), &p)
            .await
            .expect_err("pattern");
        let got = causes(&e);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, "spec.datacenters[dc-1].poolCidr");
        assert!(got[0].1.contains("should match"), "{got:?}");
        assert_eq!(
            validation_fields(&p),
            vec!["spec.datacenters[dc-1].poolCidr"]
        );

        // Pool names with a dot are subdomains the server takes for most kinds, but not a
        // label value: the CRD's root rule refuses it, as validation does.
        let p = pool(
            "metallb.v4",
            json!({"dc-1": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4}}),
        );
        let e = pools
            .create(&PostParams::default(), &p)
            .await
            .expect_err("pool name");
        let got = causes(&e);
        assert!(got[0].1.contains("DNS-1123 label of at most 63"), "{got:?}");
        assert_eq!(validation_fields(&p), vec!["metadata.name"]);

        // Cluster names: namespace cluster-<name> must be a label.
        let clusters: Api<Cluster> = Api::all(client);
        let c: Cluster = serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "c".repeat(56)}, "spec": {"datacenter": "dc-1"},
        }))
        .unwrap();
        let e = clusters
            .create(&PostParams::default(), &c)
            .await
            .expect_err("cluster name");
        assert!(causes(&e)[0].1.contains("at most 55"), "{:?}", causes(&e));
        assert!(kipam::validation::cluster_input(&c).is_err());
        let mut ok = c.clone();
        ok.metadata.name = Some("c".repeat(55));
        clusters
            .create(&PostParams::default(), &ok)
            .await
            .expect("55 characters fit");
        assert!(kipam::validation::cluster_input(&ok).is_ok());
    }
}

/// The network of a pool datacenter carries its bounds in the schema, so a real API server
/// refuses an out-of-range VLAN or MTU, a long list of DNS servers or an overlong address even
/// without the webhook; and it is not immutable (no CEL rule compares it with `oldSelf`).
/// The IPAMPool CRD's schema, as JSON.
fn pool_schema() -> Value {
    let crds = kipam::resources::crds();
    let crd = crds
        .iter()
        .find(|c| c.spec.names.kind == "IPAMPool")
        .expect("IPAMPool CRD");
    serde_json::to_value(&crd.spec.versions[0].schema).unwrap()
}

#[test]
fn the_pool_network_schema_has_its_bounds() {
    let json = pool_schema();
    let network = json
        .pointer(
            "/openAPIV3Schema/properties/spec/properties/datacenters/additionalProperties/properties/network",
        )
        .expect("network in the pool datacenter");
    let field = |name: &str| &network["properties"][name];
    assert_eq!(network["type"], "object");
    assert!(network["description"].as_str().unwrap().contains("Gateway"));
    assert_eq!(field("gateway")["type"], "string");
    assert_eq!(field("gateway")["maxLength"], 45);
    assert!(field("gateway")["pattern"].is_string());
    assert_eq!(field("dnsServers")["maxItems"], 8);
    assert_eq!(field("dnsServers")["items"]["maxLength"], 45);
    for (name, min, max) in [
        ("prefixLength", 0.0, 128.0),
        ("vlanId", 0.0, 4094.0),
        ("mtu", 576.0, 9216.0),
    ] {
        assert_eq!(field(name)["type"], "integer", "{name}");
        assert_eq!(field(name)["minimum"].as_f64(), Some(min), "{name}");
        assert_eq!(field(name)["maximum"].as_f64(), Some(max), "{name}");
    }
    assert!(
        !network.to_string().contains("oldSelf"),
        "network is mutable: {network}"
    );
}

/// The API server never refuses a duration kipam reads: for `reuseAfter` and
/// `growth.shrinkAfter`, every form `kipam::duration` takes passes the CRD's schema (its
/// length, and its pattern if it had one). Before, `shrinkAfter` kept the short form's
/// pattern after the one reader took every form for both fields: `1w` or `PT10M` read, yet
/// the API server refused them.
#[test]
fn the_crd_takes_every_duration_kipam_reads() {
    use kipam::resources::bounds::{REUSE_AFTER, SHRINK_AFTER};
    let json = pool_schema();
    let dc =
        "/openAPIV3Schema/properties/spec/properties/datacenters/additionalProperties/properties";
    for (field, bounds) in [
        ("/reuseAfter", REUSE_AFTER),
        ("/growth/properties/shrinkAfter", SHRINK_AFTER),
    ] {
        let schema = json
            .pointer(&format!("{dc}{field}"))
            .unwrap_or_else(|| panic!("{field} in the schema"));
        let pattern = schema["pattern"]
            .as_str()
            .map(|p| regex::Regex::new(p).expect("the pattern compiles"));
        let max = schema["maxLength"].as_u64().expect("a length bound");
        for text in [
            "90s", "10m", "1h30m", "2d", "1d2h3m4s", "010m", "1w", "PT10M", "P1D", "1h 30m",
            "2 days", "1 hour", "1.5h", " 10m ", "1000s", "0h60m",
        ] {
            if kipam::duration::parse(text, bounds).is_err() {
                continue;
            }
            assert!(
                text.len() as u64 <= max,
                "{field}: {text:?} is longer than {max}"
            );
            if let Some(p) = &pattern {
                assert!(
                    p.is_match(text),
                    "{field}: kipam reads {text:?} but the CRD's pattern {p} refuses it"
                );
            }
        }
    }
}
