//! `kipam adopt`: the adoption plan of user clusters that already run MetalLB, from exported
//! manifests (`--from`) or read through a kubeconfig, as a dry run.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Workdir, kipam, text};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/adopt")
}

fn adopt(args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["adopt"];
    all.extend_from_slice(args);
    let out = kipam(&all);
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

fn json_of(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn cluster<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .find(|c| c["cluster"] == name)
        .unwrap_or_else(|| panic!("no cluster {name} in {report}"))
}

/// (address, verdict) of everything a cluster serves.
fn verdicts(c: &Value) -> Vec<(String, String)> {
    c["served"]
        .as_array()
        .expect("served")
        .iter()
        .map(|s| {
            (
                s["address"].as_str().unwrap().to_string(),
                s["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn exports_of_three_clusters_name_both_sides_of_a_conflict_and_pin_the_clean_one() {
    let pools = fixtures().join("pools.yaml");
    let from = fixtures().join("from");
    let (code, stdout, stderr) = adopt(&[
        "--pools",
        pools.to_str().unwrap(),
        "--from",
        from.to_str().unwrap(),
        "--dry-run",
        "-o",
        "json",
    ]);
    // Two clusters need a look.
    assert_eq!(code, Some(1), "{stderr}\n{stdout}");
    let report = json_of(&stdout);
    assert_eq!(report["dryRun"], true);
    assert_eq!(report["exitCode"], 1);
    // Both sides of the conflict name the other cluster and the address, and neither adopts it.
    for (me, other) in [("alpha", "bravo"), ("bravo", "alpha")] {
        let c = cluster(&report, me);
        assert_eq!(c["state"], "NeedsLook", "{c}");
        assert_eq!(
            c["conflicts"],
            json!([{"with": other, "kind": "BothServe", "addresses": ["10.0.0.20"]}]),
            "{me}"
        );
        let contested = c["served"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["address"] == "10.0.0.20")
            .expect("10.0.0.20 served");
        assert_eq!(contested["verdict"], "contested");
        assert_eq!(contested["clusters"], json!([other]));
        let pinned = &report["overrides"][me]["spec"]["ipam"]["metallb"]["addresses"];
        assert!(
            !pinned.as_array().unwrap().iter().any(|p| p == "10.0.0.20"),
            "{me} must not pin the contested address: {pinned}"
        );
    }
    assert_eq!(cluster(&report, "bravo")["mode"], "DryRun");
    // The clean one: every address it serves inside the pool is adopted, the one outside is
    // left as it is, and its overrides are exactly what it serves inside the pool.
    let charlie = cluster(&report, "charlie");
    assert_eq!(charlie["state"], "Ready");
    assert_eq!(charlie["conflicts"], json!([]));
    assert_eq!(
        verdicts(charlie),
        [
            ("10.0.1.5".to_string(), "adopt".to_string()),
            ("10.0.1.6".into(), "adopt".into()),
            ("10.0.1.9".into(), "adopt".into()),
            ("192.168.50.10".into(), "outside".into()),
        ]
    );
    assert_eq!(
        report["overrides"]["charlie"],
        json!({"spec": {"ipam": {"metallb": {"addresses": ["10.0.1.5-10.0.1.6", "10.0.1.9"]}}}})
    );
    assert_eq!(
        charlie["takeover"]["metallb"]["metallbPool"],
        "metallb-system/charlie-pool"
    );
    let external = charlie["handMade"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == "external")
        .expect("the pool outside every kipam pool is listed");
    assert_eq!(external["pools"], json!([]));
    assert_eq!(external["outside"], json!(["192.168.50.0-192.168.50.15"]));
    assert_eq!(
        report["summary"],
        json!({"clusters": 3, "states": {"NeedsLook": 2, "Ready": 1},
               "verdicts": {"adopt": 5, "contested": 2, "outside": 1},
               "needsLook": ["alpha", "bravo"]})
    );
}

#[test]
fn the_text_report_shows_verdicts_conflicts_and_the_overrides_as_yaml() {
    let pools = fixtures().join("pools.yaml");
    let from = fixtures().join("from");
    let (code, stdout, _) = adopt(&[
        "--pools",
        pools.to_str().unwrap(),
        "--from",
        from.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1));
    for line in [
        "cluster alpha (datacenter dc-1, adopt Adopt): NeedsLook",
        "    bravo serves them too: 10.0.0.20",
        "    192.168.50.10  outside every pool (left as it is)  (apps/public)",
        "  overrides it would set (Cluster charlie):",
        "          addresses: [\"10.0.1.5-10.0.1.6\", \"10.0.1.9\"]",
        "dry run: nothing was written, here or in any user cluster",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
}

/// The pools and only `charlie`, with its export.
fn charlie_only(dir: &Workdir) -> (PathBuf, PathBuf) {
    let all = std::fs::read_to_string(fixtures().join("pools.yaml")).unwrap();
    let docs: Vec<&str> = all
        .split("\n---\n")
        .filter(|d| !d.contains("name: alpha") && !d.contains("name: bravo"))
        .collect();
    let pools = dir.write("pools.yaml", &docs.join("\n---\n"));
    std::fs::create_dir_all(dir.path("from/charlie")).unwrap();
    std::fs::copy(
        fixtures().join("from/charlie/export.json"),
        dir.path("from/charlie/export.json"),
    )
    .unwrap();
    (pools, dir.path("from"))
}

#[test]
fn every_cluster_ready_exits_zero_and_a_cluster_without_a_source_waits() {
    let dir = Workdir::new("adopt-ready");
    let (pools, from) = charlie_only(&dir);
    let (code, stdout, stderr) = adopt(&[
        "--pools",
        pools.to_str().unwrap(),
        "--from",
        from.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(code, Some(0), "{stderr}\n{stdout}");
    assert_eq!(json_of(&stdout)["summary"]["states"], json!({"Ready": 1}));
    // A directory naming no Cluster is skipped and said; a Cluster with no source waits, and
    // so does the rest of its datacenter (a conflict with it could not be seen).
    std::fs::create_dir_all(dir.path("from/zulu")).unwrap();
    let more = format!(
        "{}\n---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: delta\nspec:\n  datacenter: dc-1\n",
        std::fs::read_to_string(&pools).unwrap()
    );
    let pools = dir.write("pools.yaml", &more);
    let (code, stdout, stderr) = adopt(&[
        "--pools",
        pools.to_str().unwrap(),
        "--from",
        from.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(code, Some(1), "{stderr}\n{stdout}");
    assert!(stderr.contains("no Cluster zulu"), "{stderr}");
    let report = json_of(&stdout);
    let delta = cluster(&report, "delta");
    assert_eq!(delta["state"], "Waiting");
    assert!(
        delta["reason"]
            .as_str()
            .unwrap()
            .contains("no source given"),
        "{delta}"
    );
    let charlie = cluster(&report, "charlie");
    assert_eq!(charlie["state"], "Waiting");
    assert!(
        charlie["reason"].as_str().unwrap().contains("delta"),
        "{charlie}"
    );
}

#[test]
fn bad_arguments_and_input_exit_two_and_name_what_is_wrong() {
    let pools = fixtures().join("pools.yaml");
    let pools = pools.to_str().unwrap();
    let (code, _, stderr) = adopt(&["--pools", pools, "--cluster", "alpha"]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("--kubeconfig and --cluster go in pairs"),
        "{stderr}"
    );
    let (code, _, stderr) = adopt(&["--pools", pools]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("nothing to read"), "{stderr}");
    let (code, stdout, stderr) = adopt(&[
        "--pools",
        pools,
        "--kubeconfig",
        "/nonexistent",
        "--cluster",
        "nobody",
        "-o",
        "json",
    ]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("--cluster nobody: no Cluster nobody"),
        "{stderr}"
    );
    assert_eq!(json_of(&stdout)["exitCode"], 2);
    let dir = Workdir::new("adopt-bad");
    let broken = dir.write(
        "pools.yaml",
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: p\nspec:\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.0.0.0/33, allocationRange: 8}\n",
    );
    let (code, _, stderr) = adopt(&[
        "--pools",
        broken.to_str().unwrap(),
        "--from",
        fixtures().join("from").to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("10.0.0.0/33"), "{stderr}");
}

/// A user cluster read through its kubeconfig says what its export says; one without
/// MetalLB has no hand-made pools and its Services are still read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_is_read_like_an_export_and_missing_metallb_is_no_pools() {
    use kube_standin::ApiServer;
    const METALLB_CRDS: &str = include_str!("../render/fixtures/metallb-crds.yaml");
    let dir = Workdir::new("adopt-kubeconfig");
    let (pools, _) = charlie_only(&dir);
    let user = ApiServer::start().await.expect("user cluster");
    user.apply_yaml(METALLB_CRDS).expect("MetalLB CRDs");
    let export: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("from/charlie/export.json")).unwrap(),
    )
    .unwrap();
    for item in export["items"].as_array().unwrap() {
        let ns = item["metadata"]["namespace"].as_str().unwrap();
        let _ = user
            .create(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
        let mut object = item.clone();
        let status = object.as_object_mut().unwrap().remove("status");
        if object["kind"] == "Service" {
            object["spec"]["ports"] = json!([{"port": 80}]);
        }
        user.create(&object).expect("object");
        if let Some(status) = status {
            let name = item["metadata"]["name"].as_str().unwrap();
            user.set_status("services", Some(ns), name, status)
                .expect("status");
        }
    }
    let kubeconfig = dir.write("charlie.kubeconfig", &user.kubeconfig_yaml());
    let pools_arg = pools.to_str().unwrap().to_string();
    let kc_arg = kubeconfig.to_str().unwrap().to_string();
    let run = move |pools: String, kc: String| {
        tokio::task::spawn_blocking(move || {
            adopt(&[
                "--pools",
                &pools,
                "--kubeconfig",
                &kc,
                "--cluster",
                "charlie",
                "-o",
                "json",
            ])
        })
    };
    let (code, stdout, stderr) = run(pools_arg.clone(), kc_arg.clone()).await.unwrap();
    assert_eq!(code, Some(0), "{stderr}\n{stdout}");
    let read = json_of(&stdout);
    let dir2 = Workdir::new("adopt-kubeconfig-export");
    let (pools2, from) = charlie_only(&dir2);
    let (_, exported, _) = adopt(&[
        "--pools",
        pools2.to_str().unwrap(),
        "--from",
        from.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(read["clusters"], json_of(&exported)["clusters"]);
    assert_eq!(read["overrides"], json_of(&exported)["overrides"]);

    // Without MetalLB's CRDs: no hand-made pool (404 is not an error), Services still read.
    let bare = ApiServer::start().await.expect("user cluster");
    let _ = bare
        .create(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}}));
    bare.create(&json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "a", "namespace": "apps"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}))
        .expect("service");
    bare.set_status(
        "services",
        Some("apps"),
        "a",
        json!({"loadBalancer": {"ingress": [{"ip": "10.0.1.5"}]}}),
    )
    .expect("status");
    let kubeconfig = dir.write("bare.kubeconfig", &bare.kubeconfig_yaml());
    let (code, stdout, stderr) = run(pools_arg, kubeconfig.to_str().unwrap().to_string())
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{stderr}\n{stdout}");
    let c = cluster(&json_of(&stdout), "charlie").clone();
    assert_eq!(c["handMade"], json!([]));
    assert_eq!(
        verdicts(&c),
        [("10.0.1.5".to_string(), "adopt".to_string())]
    );
    user.shutdown();
    bare.shutdown();
}
