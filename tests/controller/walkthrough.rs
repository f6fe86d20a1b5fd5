//! The README's controller walkthrough, run as an operator runs it: install the CRDs from
//! `crds/`, start `kipam controller`, `kubectl apply -f examples/` (every document through the
//! stand-in's HTTP API, as `kubectl` sends it, so a namespace that does not exist refuses what
//! is put in it), look at the allocations and the Addons, then connect one user cluster. Every
//! output the README shows is checked against what the seed holds (the `AGE` column aside).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams, PostParams};
use kube::core::{DynamicObject, GroupVersionKind, Resource};
use kube::discovery::{Discovery, Scope};
use kube_standin::ApiServer;
use serde_json::{Value, json};

use super::support::Seed;

const WAIT: Duration = Duration::from_secs(30);
const METALLB_CRDS: &str = include_str!("../render/fixtures/metallb-crds.yaml");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

/// What the README shows after `$ {command}` in a console block.
fn shown_after(readme: &str, command: &str) -> Vec<String> {
    let wanted = format!("$ {command}");
    let mut lines = readme.lines().skip_while(|l| l.trim_end() != wanted);
    assert!(
        lines.next().is_some(),
        "the README no longer shows `{wanted}`"
    );
    lines
        .take_while(|l| !l.starts_with("$ ") && !l.starts_with("```"))
        .map(str::to_string)
        .collect()
}

/// A `kubectl get` table as rows of column -> value, cut at the header's column starts.
fn table(lines: &[String]) -> Vec<BTreeMap<String, String>> {
    let header = &lines[0];
    let mut starts = Vec::new();
    let mut at = 0;
    for (i, _) in header.match_indices("  ") {
        if i >= at {
            let next = header[i..].find(|c: char| c != ' ').map(|n| n + i);
            if let Some(n) = next {
                starts.push(n);
                at = n;
            }
        }
    }
    starts.insert(0, 0);
    let cut = |line: &str, k: usize| -> String {
        let from = starts[k].min(line.len());
        let to = starts
            .get(k + 1)
            .copied()
            .unwrap_or(line.len())
            .min(line.len());
        line[from..to].trim().to_string()
    };
    let names: Vec<String> = (0..starts.len()).map(|k| cut(header, k)).collect();
    lines[1..]
        .iter()
        .map(|line| {
            names
                .iter()
                .enumerate()
                .map(|(k, name)| (name.clone(), cut(line, k)))
                .collect()
        })
        .collect()
}

/// The quick-start table: `(cluster, pool)` -> `(datacenter, type, allocation)`.
fn quick_start_allocations(readme: &str) -> BTreeMap<(String, String), (String, String, String)> {
    let lines: Vec<String> = readme
        .lines()
        .skip_while(|l| !l.starts_with("CLUSTER  POOL"))
        .take_while(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    assert!(lines.len() > 1, "the README's quick start has no table");
    table(&lines)
        .into_iter()
        .map(|row| {
            (
                (row["CLUSTER"].clone(), row["POOL"].clone()),
                (
                    row["DATACENTER"].clone(),
                    row["TYPE"].clone(),
                    row["ALLOCATION"].clone(),
                ),
            )
        })
        .collect()
}

/// `kubectl apply -f PATH` (client-side apply, as kubectl does by default): the files of a
/// directory in name order, the documents of each file in order. A new object is created with
/// kubectl's field manager, strict field validation and the last-applied annotation; one that
/// exists is merge-patched. Returns kubectl's lines, errors included.
pub(super) async fn kubectl_apply(
    client: &kube::Client,
    path: &Path,
) -> Vec<Result<String, String>> {
    let mut files: Vec<_> = if path.is_dir() {
        std::fs::read_dir(path)
            .expect("directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect()
    } else {
        vec![path.to_path_buf()]
    };
    files.sort();
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("file");
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
        let shown = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            out.push(apply_one(client, &discovery, &doc, &shown).await);
        }
    }
    out
}

async fn apply_one(
    client: &kube::Client,
    discovery: &Discovery,
    doc: &Value,
    file: &str,
) -> Result<String, String> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let Some((resource, caps)) = discovery.resolve_gvk(&gvk) else {
        return Err(format!(
            "error: resource mapping not found for name: {name:?} namespace: \"\" from {file:?}: \
             no matches for kind {kind:?} in version {api_version:?}"
        ));
    };
    let namespace = match caps.scope {
        Scope::Namespaced => Some(
            doc["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string(),
        ),
        Scope::Cluster => None,
    };
    let shown = if group.is_empty() {
        format!("{}/{name}", kind.to_lowercase())
    } else {
        format!("{}.{group}/{name}", kind.to_lowercase())
    };
    let url = DynamicObject::url_path(&resource, namespace.as_deref());
    let request = kube::core::Request::new(url);
    let manager = "kubectl-client-side-apply".to_string();
    let mut body = doc.clone();
    body["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
        json!(format!("{doc}\n"));
    let failed = |verb: &str, e: kube::Error| match e {
        kube::Error::Api(s) => format!(
            "Error from server ({}): error when {verb} {file:?}: {}",
            s.reason, s.message
        ),
        other => format!("error when {verb} {file:?}: {other}"),
    };
    let get = request.get(name, &Default::default()).expect("GET request");
    match client.request::<Value>(get).await {
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let pp = PostParams {
                dry_run: false,
                field_manager: Some(manager),
            };
            let mut create = request
                .create(&pp, serde_json::to_vec(&body).expect("JSON"))
                .expect("POST request");
            let uri = create.uri().to_string();
            let sep = if uri.contains('?') { '&' } else { '?' };
            *create.uri_mut() = format!("{uri}{sep}fieldValidation=Strict")
                .parse()
                .expect("URI");
            client
                .request::<Value>(create)
                .await
                .map(|_| format!("{shown} created"))
                .map_err(|e| failed("creating", e))
        }
        Err(e) => Err(failed("retrieving current configuration of", e)),
        Ok(_) => {
            let pp = PatchParams {
                field_manager: Some(manager),
                ..PatchParams::default()
            };
            let patch = request
                .patch(name, &pp, &Patch::Merge(&body))
                .expect("PATCH request");
            client
                .request::<Value>(patch)
                .await
                .map(|_| format!("{shown} configured"))
                .map_err(|e| failed("patching", e))
        }
    }
}

pub(super) async fn client_of(api: &ApiServer) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&api.kubeconfig_yaml()).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(cfg).expect("client")
}

fn condition(obj: &Value, type_: &str) -> Option<Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

pub(super) fn condition_status(obj: &Value, type_: &str) -> String {
    condition(obj, type_)
        .and_then(|c| c["status"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Address pieces as kipam stores them: `a` is `a-a`.
fn pieces(shown: &str) -> Vec<String> {
    shown
        .split(',')
        .map(|p| {
            if p.contains('-') || p.contains('/') {
                p.to_string()
            } else {
                format!("{p}-{p}")
            }
        })
        .collect()
}

/// `kubectl get clusters` / `kubectl get addons` as the README shows them: every row's
/// columns (but `AGE`) against the object of that name.
fn check_table(shown: &[String], objects: &[Value], what: &str) {
    let rows = table(shown);
    assert_eq!(
        rows.len(),
        objects.len(),
        "{what}: the README shows {} rows, the seed holds {} objects",
        rows.len(),
        objects.len()
    );
    for row in rows {
        let obj = objects
            .iter()
            .find(|o| {
                o["metadata"]["name"] == row["NAME"].as_str()
                    && row
                        .get("NAMESPACE")
                        .is_none_or(|ns| o["metadata"]["namespace"] == ns.as_str())
            })
            .unwrap_or_else(|| panic!("{what}: no object for the README's row {row:?}"));
        for (column, value) in &row {
            let real = match column.as_str() {
                "NAME" | "NAMESPACE" | "AGE" => continue,
                "DATACENTER" => obj["spec"]["datacenter"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
                "ADDON" => obj["spec"]["name"].as_str().unwrap_or_default().into(),
                "IPAM" => condition_status(obj, "IPAMReady"),
                "ADDONS" => condition_status(obj, "AddonsReady"),
                "APPLIED" => condition_status(obj, "Applied"),
                "IN SYNC" => condition_status(obj, "InSync"),
                other => {
                    panic!("{what}: the README shows a column {other} this test does not know")
                }
            };
            assert_eq!(
                &real, value,
                "{what}: column {column} of {row:?} (status: {})",
                obj["status"]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_walkthrough_serves_the_examples_from_one_apply() {
    let readme = readme();
    let seed = Seed::bare("walkthrough").await;
    let client = client_of(&seed.api).await;

    // kubectl apply -f crds/; kubectl create namespace kipam-system.
    let crds = kubectl_apply(&client, &root().join("crds")).await;
    assert!(crds.iter().all(Result::is_ok), "{crds:?}");
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "kipam-system"}})).unwrap(),
        )
        .await
        .expect("namespace kipam-system");
    let mut ctl = seed.controller("ctl");

    // kubectl apply -f examples/: every document accepted, in the README's words.
    let applied = kubectl_apply(&client, &root().join("examples")).await;
    let refused: Vec<&String> = applied.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        refused.is_empty(),
        "`kubectl apply -f examples/` refused documents:\n{}",
        refused
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let printed: Vec<String> = applied.into_iter().filter_map(Result::ok).collect();
    assert_eq!(
        printed,
        shown_after(&readme, "kubectl apply -f examples/"),
        "what `kubectl apply -f examples/` prints"
    );

    // Every allocation of the quick-start table, allocated, and nothing else.
    let expected = quick_start_allocations(&readme);
    seed.wait_for("every allocation of the README", WAIT, "ctl", |s| {
        expected
            .keys()
            .all(|(cluster, pool)| s.phase(cluster, pool) == "Allocated")
    })
    .await;
    assert_eq!(
        seed.allocations().len(),
        expected.len(),
        "only the README's allocations"
    );
    for ((cluster, pool), (dc, type_, shown)) in &expected {
        let a = seed.allocation(cluster, pool).expect("allocation");
        assert_eq!(&a.spec.dc, dc, "{cluster}/{pool}");
        let held = match (type_.as_str(), a.spec.cidr.clone()) {
            ("prefix", Some(cidr)) => vec![cidr],
            ("range", None) => a.spec.addresses.clone(),
            _ => panic!("{cluster}/{pool} is not of type {type_}: {:?}", a.spec),
        };
        assert_eq!(held, pieces(shown), "{cluster}/{pool}");
    }
    let echo = seed.held("echo", "metallb");
    assert_eq!(
        vec![echo],
        shown_after(
            &readme,
            r#"kubectl -n cluster-echo get ipamallocation metallb -o jsonpath='{.spec.cidr}{"\n"}'"#
        )
    );

    // The Clusters are allocated; their Addons are accepted, rendered, and say why they are
    // not applied.
    seed.wait_for(
        "the Clusters allocated, every Addon saying why it is not applied",
        WAIT,
        "ctl",
        |s| {
            s.api
                .list("addons", None)
                .iter()
                .all(|a| condition_status(a, "Applied") == "False")
                && s.api.list("clusters", None).iter().all(|c| {
                    condition_status(c, "IPAMReady") == "True"
                        && condition_status(c, "AddonsReady") == "False"
                })
        },
    )
    .await;
    let clusters = seed.api.list("clusters", None);
    check_table(
        &shown_after(&readme, "kubectl get clusters"),
        &clusters,
        "kubectl get clusters",
    );
    let addons = seed.api.list("addons", None);
    check_table(
        &shown_after(&readme, "kubectl get addons -A"),
        &addons,
        "kubectl get addons -A",
    );
    for addon in &addons {
        let rendered = condition(addon, "Rendered").expect("Rendered");
        assert_eq!(rendered["status"], "True", "{addon}");
        let applied = condition(addon, "Applied").expect("Applied");
        assert_eq!(applied["reason"], "KubeconfigInvalid", "{addon}");
    }
    let alpha = seed
        .get("addons", Some("cluster-alpha"), "metallb")
        .expect("alpha's Addon");
    let applied = condition(&alpha, "Applied").expect("Applied");
    assert_eq!(
        vec![format!(
            "{}: {}",
            applied["reason"].as_str().unwrap_or_default(),
            applied["message"].as_str().unwrap_or_default()
        )],
        shown_after(
            &readme,
            r#"kubectl -n cluster-alpha get addon metallb -o jsonpath='{.status.conditions[?(@.type=="Applied")].reason}: {.status.conditions[?(@.type=="Applied")].message}{"\n"}'"#
        )
    );

    // The controller's terminal says it once per cluster, not on every retry.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = std::fs::read_to_string(seed.log_path("ctl")).unwrap_or_default();
    for cluster in ["alpha", "bravo", "charlie", "delta", "echo"] {
        let said = format!("Cluster {cluster} has no spec.kubeconfig.secretRef");
        let warned = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(&said))
            .count();
        assert_eq!(warned, 1, "{said}: {warned} warnings\n{}", seed.log("ctl"));
    }

    // Connect alpha's user cluster: a kubeconfig Secret in its namespace, and the Cluster
    // pointing at it.
    let user = ApiServer::start().await.expect("user cluster starts");
    user.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "metallb-system"}}))
        .expect("metallb-system");
    user.apply_yaml(METALLB_CRDS).expect("MetalLB CRDs");
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), "cluster-alpha");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "kubeconfig"},
                "type": "Opaque",
                "stringData": {"kubeconfig": user.kubeconfig_yaml()},
            }))
            .unwrap(),
        )
        .await
        .expect("kubectl -n cluster-alpha create secret generic kubeconfig");
    let clusters_api: kube::Api<kipam::resources::Cluster> = kube::Api::all(client.clone());
    clusters_api
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubeconfig": {"secretRef": {"name": "kubeconfig"}}}})),
        )
        .await
        .expect("kubectl patch cluster alpha");
    seed.wait_for("alpha's Addon in sync", WAIT, "ctl", |s| {
        s.get("addons", Some("cluster-alpha"), "metallb")
            .is_some_and(|a| condition_status(&a, "InSync") == "True")
    })
    .await;
    let alpha = seed
        .get("addons", Some("cluster-alpha"), "metallb")
        .expect("alpha's Addon");
    check_table(
        &shown_after(&readme, "kubectl -n cluster-alpha get addons"),
        &[alpha],
        "kubectl -n cluster-alpha get addons",
    );
    let mut pools = user.list("ipaddresspools.metallb.io", Some("metallb-system"));
    pools.sort_by_key(|p| {
        p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    });
    let printed: Vec<String> = pools
        .iter()
        .map(|p| {
            format!(
                "{}: {}",
                p["metadata"]["name"].as_str().unwrap_or_default(),
                p["spec"]["addresses"]
            )
        })
        .collect();
    assert_eq!(
        printed,
        shown_after(
            &readme,
            r#"kubectl --kubeconfig alpha.kubeconfig -n metallb-system get ipaddresspools.metallb.io -o jsonpath='{range .items[*]}{.metadata.name}: {.spec.addresses}{"\n"}{end}'"#
        )
    );
    // The user cluster holds exactly what the seed gave alpha.
    let mut dual = seed
        .allocation("alpha", "metallb-ipv4")
        .expect("ipv4")
        .spec
        .addresses;
    dual.extend(
        seed.allocation("alpha", "metallb-ipv6")
            .expect("ipv6")
            .spec
            .addresses,
    );
    assert_eq!(pools[1]["spec"]["addresses"], json!(dual));
    assert_eq!(
        pools[0]["spec"]["addresses"],
        json!(
            seed.allocation("alpha", "metallb")
                .expect("metallb")
                .spec
                .addresses
        )
    );
    seed.wait_for("alpha's AddonsReady", WAIT, "ctl", |s| {
        s.condition("clusters", "alpha", "AddonsReady")
            .is_some_and(|c| c["status"] == "True")
    })
    .await;

    // kubectl delete -f examples/: everything goes, the namespaces kubectl made included (the
    // addresses with the Clusters, the records with the pools), and the controller is quiet.
    let deleted = kubectl_delete(&client, &root().join("examples")).await;
    assert!(deleted.iter().all(Result::is_ok), "{deleted:?}");
    let gone = |s: &Seed| {
        [
            "clusters",
            "ipampools",
            "ipamallocations",
            "ipampoolrecords",
            "addons",
        ]
        .iter()
        .all(|r| s.api.list(r, None).is_empty())
            && s.api.list("namespaces", None).iter().all(|n| {
                !n["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("cluster-")
            })
    };
    let left = |s: &Seed| -> Vec<String> {
        let mut left = Vec::new();
        for r in [
            "clusters",
            "ipampools",
            "ipamallocations",
            "ipampoolrecords",
            "addons",
            "namespaces",
        ] {
            for o in s.api.list(r, None) {
                let name = o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if r != "namespaces" || name.starts_with("cluster-") {
                    left.push(format!(
                        "{r} {}/{name} finalizers={} deleting={}",
                        o["metadata"]["namespace"].as_str().unwrap_or_default(),
                        o["metadata"]["finalizers"],
                        o["metadata"]["deletionTimestamp"].is_string()
                    ));
                }
            }
        }
        left
    };
    let deadline = Instant::now() + WAIT;
    while !gone(&seed) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        gone(&seed),
        "left after kubectl delete -f examples/: {:#?}\n--- controller log ---\n{}",
        left(&seed),
        seed.log("ctl")
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = ctl.passes().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = ctl.passes().await;
    assert!(
        after - before < 20,
        "{} planning passes in 2 s with nothing left to do",
        after - before
    );
}

/// `kubectl delete -f PATH`: every document, in the order `kubectl apply` takes them.
async fn kubectl_delete(client: &kube::Client, path: &Path) -> Vec<Result<String, String>> {
    let mut files: Vec<_> = std::fs::read_dir(path)
        .expect("directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("file");
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            let api_version = doc["apiVersion"].as_str().unwrap_or_default();
            let kind = doc["kind"].as_str().unwrap_or_default();
            let name = doc["metadata"]["name"].as_str().unwrap_or_default();
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            let Some((resource, caps)) =
                discovery.resolve_gvk(&GroupVersionKind::gvk(group, version, kind))
            else {
                out.push(Err(format!("{kind} {name}: not served")));
                continue;
            };
            let api: kube::Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => kube::Api::namespaced_with(
                    client.clone(),
                    doc["metadata"]["namespace"].as_str().unwrap_or("default"),
                    &resource,
                ),
                Scope::Cluster => kube::Api::all_with(client.clone(), &resource),
            };
            out.push(match api.delete(name, &Default::default()).await {
                Ok(_) => Ok(format!("{kind} {name} deleted")),
                // Gone already with its namespace, as kubectl reports it.
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(format!("{kind} {name} not found")),
                Err(e) => Err(format!("{kind} {name}: {e}")),
            });
        }
    }
    out
}

/// Who creates a cluster's namespace deletes it (docs/multicluster.md): one applied
/// beforehand is used as it is and outlives its Cluster; one kipam made is owned by the Cluster
/// and goes with it, even after a Namespace manifest was applied over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clusters_namespace_is_deleted_by_whoever_created_it() {
    let seed = Seed::start("namespace-owner").await;
    let client = client_of(&seed.api).await;
    let _ctl = seed.controller("ctl");
    seed.apply(super::support::POOLS);
    let manifest = |cluster: &str| {
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cluster-{cluster}\n  labels:\n    ipam.kipam.dev/cluster: {cluster}\n---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Addon\nmetadata:\n  name: metallb\n  namespace: cluster-{cluster}\nspec:\n  name: metallb\n"
        )
    };
    let file = seed.dir().join("a.yaml");
    std::fs::write(&file, manifest("a")).expect("manifest");
    let applied = kubectl_apply(&client, &file).await;
    assert!(applied.iter().all(Result::is_ok), "{applied:?}");
    seed.cluster("a", "dc-1");
    seed.wait_for("a allocated", WAIT, "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
    })
    .await;
    let namespace = seed
        .get("namespaces", None, "cluster-a")
        .expect("cluster-a");
    assert!(
        namespace["metadata"]["ownerReferences"].is_null(),
        "kipam does not take a namespace it did not make: {namespace}"
    );

    // The Cluster goes: its addresses are released, the namespace and the Addon stay.
    seed.delete("clusters", None, "a");
    seed.wait_for("a gone, its allocations released", WAIT, "ctl", |s| {
        s.get("clusters", None, "a").is_none() && s.allocations().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let namespace = seed
        .get("namespaces", None, "cluster-a")
        .expect("cluster-a stays");
    assert!(
        namespace["metadata"]["deletionTimestamp"].is_null(),
        "{namespace}"
    );
    assert!(seed.get("addons", Some("cluster-a"), "metallb").is_some());

    // The same Cluster again uses it again.
    seed.cluster("a", "dc-1");
    seed.wait_for("a allocated again, its Addon looked at", WAIT, "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
            && s.condition("clusters", "a", "AddonsReady")
                .is_some_and(|c| c["reason"] == "KubeconfigInvalid")
    })
    .await;

    // A namespace kipam made is the Cluster's, also once a manifest was applied over it.
    seed.cluster("b", "dc-1");
    seed.wait_for("b allocated", WAIT, "ctl", |s| {
        s.phase("b", "metallb") == "Allocated"
    })
    .await;
    let file = seed.dir().join("b.yaml");
    std::fs::write(&file, manifest("b")).expect("manifest");
    let applied = kubectl_apply(&client, &file).await;
    assert_eq!(
        applied,
        [
            Ok("namespace/cluster-b configured".to_string()),
            Ok("addon.ipam.kipam.dev/metallb created".to_string())
        ]
    );
    let namespace = seed
        .get("namespaces", None, "cluster-b")
        .expect("cluster-b");
    assert_eq!(
        namespace["metadata"]["ownerReferences"][0]["name"], "b",
        "{namespace}"
    );
    seed.delete("clusters", None, "b");
    seed.wait_for("b and its namespace gone", WAIT, "ctl", |s| {
        s.get("clusters", None, "b").is_none() && s.get("namespaces", None, "cluster-b").is_none()
    })
    .await;
    assert!(seed.get("namespaces", None, "cluster-a").is_some());
}
