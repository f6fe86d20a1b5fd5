//! Issue 11 (inputs) and issue 10 (immutable fields against the state): what a user mistypes
//! is refused with a message naming the file, the field and the value, and nothing stored
//! changes.

use super::{POOL, Workdir, clusters, examples, kipam, offline, text};

fn cluster_doc(name: &str, day: u32, extra: &str) -> String {
    format!(
        "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n  creationTimestamp: \"2026-01-{day:02}T00:00:00Z\"\nspec:\n  datacenter: dc-1\n{extra}"
    )
}

/// Runs offline over `input` with a state made by a first valid run over `valid`, and returns
/// the refused run's stderr after checking exit 2 and an untouched state.
fn refused_after_valid_run(name: &str, valid: &str, input: &str) -> String {
    let w = Workdir::new(name);
    let files = w.write("in.yaml", valid);
    let state = w.path("state.yaml");
    let first = offline(&[files.to_str().unwrap()], &state);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let saved = std::fs::read(&state).unwrap();
    std::fs::write(&files, input).unwrap();
    let run = offline(&[files.to_str().unwrap()], &state);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(!err.trim().is_empty());
    assert_eq!(std::fs::read(&state).unwrap(), saved, "state untouched");
    err
}

#[test]
fn unknown_fields_are_refused_with_the_field_meant() {
    let valid = format!("{POOL}{}", clusters(&["a"]));
    let input = format!(
        "{}{}{}",
        POOL.replace(
            "allocationRange: 4",
            "allocationRange: 4\n      excludeRange: [\"10.0.0.1\"]"
        ),
        cluster_doc(
            "a",
            1,
            "  paused: true\n  ipam:\n    big:\n      optout: true\n"
        ),
        cluster_doc("b", 2, "").replace("  name: b\n", "  name: b\n  pause: true\n"),
    );
    let err = refused_after_valid_run("unknown-fields", &valid, &input);
    for expected in [
        "in.yaml:11: IPAMPool small: spec.datacenters[dc-1].excludeRange: unknown field, did you mean `excludeRanges`?",
        "Cluster a: spec.paused: unknown field, did you mean `pause`?",
        "Cluster a: spec.ipam[big].optout: unknown field, did you mean `optOut`?",
        "Cluster b: metadata.pause: unknown field here, did you mean `spec.pause`?",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
}

#[test]
fn an_override_naming_no_pool_is_refused() {
    let valid = format!("{POOL}{}", clusters(&["a"]));
    let input = format!(
        "{POOL}{}",
        cluster_doc("a", 1, "  ipam:\n    smal:\n      allocationRange: 2\n")
    );
    let err = refused_after_valid_run("override-pool", &valid, &input);
    assert!(
        err.contains("Cluster a: spec.ipam[smal]: names no IPAMPool, did you mean small?"),
        "{err}"
    );
}

#[test]
fn numbers_are_whole_and_fit_with_the_value_as_written() {
    let valid = format!("{POOL}{}", clusters(&["a"]));
    for (written, reason) in [
        ("8.5", "is not a whole number"),
        ("1e3", "must be written as a whole number"),
        ("18446744073709551616", "is too large"),
        ("99999999999999999999999", "is too large"),
        (
            "\"4\"",
            "is a string, not a whole number: remove the quotes",
        ),
    ] {
        let input = format!(
            "{}{}",
            POOL.replace("allocationRange: 4", &format!("allocationRange: {written}")),
            clusters(&["a"])
        );
        let err = refused_after_valid_run("numbers", &valid, &input);
        let value = written.trim_matches('"');
        let expected =
            format!("IPAMPool small: spec.datacenters[dc-1].allocationRange \"{value}\": {reason}");
        assert!(err.contains(&expected), "{expected:?} not in:\n{err}");
        assert!(!err.contains("invalid type"), "no serde dump: {err}");
    }
    // Negative counts: the rule's own message, value as written.
    let input = format!(
        "{POOL}{}",
        cluster_doc("a", 1, "  ipam:\n    small:\n      allocationRange: -3\n")
    );
    let err = refused_after_valid_run("negative", &valid, &input);
    assert!(
        err.contains("Cluster a: spec.ipam[small].allocationRange \"-3\": must be at least 1"),
        "{err}"
    );
    // int32 fields: allocationPrefix past 2^31.
    let input = format!(
        "{}{}",
        POOL.replace("allocationPrefix: 64", "allocationPrefix: 4294967296"),
        clusters(&["a"])
    );
    let err = refused_after_valid_run("int32", &valid, &input);
    assert!(
        err.contains("IPAMPool big: spec.datacenters[dc-1].allocationPrefix \"4294967296\": is too large: a whole number between -2147483648 and 2147483647"),
        "{err}"
    );
}

#[test]
fn the_state_file_is_read_as_strictly_and_left_byte_identical() {
    let w = Workdir::new("strict-state");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a"])));
    let state = w.path("state.yaml");
    assert_eq!(
        offline(&[files.to_str().unwrap()], &state).status.code(),
        Some(0)
    );
    let good = w.read("state.yaml");
    let cases = [
        (
            good.replacen("  dc: dc-1\n", "  dc: dc-1\n  dcs: dc-2\n", 1),
            "spec.dcs: unknown field, did you mean `dc`?",
        ),
        (
            good.replacen("  type: prefix\n", "  type: prefix\n  cidrs: x\n", 1),
            "spec.cidrs: unknown field, did you mean `cidr`?",
        ),
        (
            good.replacen(
                "status:\n  phase: Allocated",
                "status:\n  phase: allocated",
                1,
            ),
            "status.phase \"allocated\": must be one of Pending, Allocated, Failed, Released, Conflict (did you mean Allocated?)",
        ),
        (
            good.replacen("  dc: dc-1\n", "  dc: 7\n", 1),
            "spec.dc \"7\": is read as a number, not a string",
        ),
        (
            good.replacen("apiVersion: ipam.kipam.dev/v1alpha1", "apiVersion: v1", 1),
            "apiVersion \"v1\" is not ipam.kipam.dev/v1alpha1",
        ),
    ];
    for (content, expected) in cases {
        assert_ne!(content, good, "the case changes something: {expected}");
        std::fs::write(&state, &content).unwrap();
        let run = offline(&[files.to_str().unwrap()], &state);
        let err = text(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{err}");
        assert!(err.contains("is corrupt"), "{err}");
        assert!(err.contains(expected), "{expected:?} not in:\n{err}");
        assert!(
            err.contains("state.yaml:"),
            "names the file and line: {err}"
        );
        assert_eq!(w.read("state.yaml"), content, "refused state is untouched");
    }
}

/// A pool with `n` clusters in one datacenter (so `n` allocations in the state).
fn many(n: usize) -> String {
    let mut out = String::from(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: wide\nspec:\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/8\n      allocationRange: 4\n",
    );
    for i in 0..n {
        out.push_str(&format!(
            "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: c{i}\n  creationTimestamp: \"2026-01-01T00:00:00Z\"\nspec:\n  datacenter: dc-1\n"
        ));
    }
    out
}

#[test]
fn fifteen_hundred_clusters_run_and_rerun_on_their_own_state() {
    // serde-saphyr's default budget refused streams of more than 1,024 documents: the first
    // run succeeded and every later run called its state corrupt.
    let w = Workdir::new("fifteen-hundred");
    let files = w.write("in.yaml", &many(1_500));
    let state = w.path("state.yaml");
    let first = offline(&[files.to_str().unwrap()], &state);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let saved = w.read("state.yaml");
    assert_eq!(saved.matches("kind: IPAMAllocation").count(), 1_500);
    let second = offline(&[files.to_str().unwrap()], &state);
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));
    assert!(text(&second.stdout).contains("unchanged"));
    assert_eq!(w.read("state.yaml"), saved);
}

/// The 100,000-document figure: `cargo test --release --test offline -- --ignored
/// hundred_thousand --nocapture`. Prints the time of each run; peak memory is measured with
/// `/usr/bin/time -v` on the same inputs (see docs/offline.md).
#[test]
#[ignore = "large: 100,000 clusters; run by hand for the figures"]
fn hundred_thousand_clusters_run_and_rerun() {
    let w = Workdir::new("hundred-thousand");
    let files = w.write("in.yaml", &many(100_000));
    let state = w.path("state.yaml");
    for round in ["first", "second"] {
        let started = std::time::Instant::now();
        let run = offline(&[files.to_str().unwrap()], &state);
        println!("{round} run: {:?}", started.elapsed());
        assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    }
    assert_eq!(
        w.read("state.yaml").matches("kind: IPAMAllocation").count(),
        100_000
    );
}

/// `clusters` clusters in one datacenter served by `pools` range pools, each with a gateway it
/// excludes: the shape of a GitOps repository of many clusters.
fn many_with_pools(clusters: usize, pools: usize) -> String {
    let mut out = String::new();
    for p in 0..pools {
        out.push_str(&format!(
            "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: p{p}\nspec:\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.{p}.0.0/16\n      allocationRange: 4\n      excludeRanges: [\"10.{p}.255.254\"]\n      network:\n        gateway: 10.{p}.255.254\n"
        ));
    }
    for i in 0..clusters {
        out.push_str(&format!(
            "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: c{i}\n  creationTimestamp: \"2026-01-01T00:00:00Z\"\nspec:\n  datacenter: dc-1\n"
        ));
    }
    out
}

/// The 10,000 clusters × 10 pools figure of docs/offline.md: `cargo test --release --test
/// offline -- --ignored ten_thousand --nocapture` (peak memory: `/usr/bin/time -v kipam
/// offline` on the same input, which the test leaves in `KIPAM_FIXTURE_DIR` when set).
#[test]
#[ignore = "large: 10,000 clusters and 10 pools; run by hand for the figures"]
fn ten_thousand_clusters_of_ten_pools_run_and_rerun() {
    let w = Workdir::new("ten-thousand-ten-pools");
    let input = many_with_pools(10_000, 10);
    if let Some(dir) = std::env::var_os("KIPAM_FIXTURE_DIR") {
        std::fs::write(std::path::Path::new(&dir).join("in.yaml"), &input).unwrap();
    }
    let files = w.write("in.yaml", &input);
    let state = w.path("state.yaml");
    for round in ["first", "second"] {
        let started = std::time::Instant::now();
        let run = offline(&[files.to_str().unwrap()], &state);
        println!("{round} run: {:?}", started.elapsed());
        assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    }
    assert_eq!(
        w.read("state.yaml").matches("kind: IPAMAllocation").count(),
        100_000
    );
}

const OVERLAPPING: &str = "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: lb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/28
      allocationRange: 4
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: ingress
spec:
  datacenters:
    dc-1:
      type: prefix
      poolCidr: 10.0.0.0/24
      allocationPrefix: 30
";

#[test]
fn pools_overlapping_in_a_datacenter_are_reported_with_both_names() {
    let w = Workdir::new("overlap");
    // In one address space (the default): the pools share their addresses.
    let files = w.write(
        "in.yaml",
        &format!("{OVERLAPPING}{}", clusters(&["a", "b"])),
    );
    let state = w.path("state.yaml");
    let run = offline(&[files.to_str().unwrap()], &state);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    assert!(
        err.contains(
            "warning: pools ingress (10.0.0.0/24) and lb (10.0.0.0/28) overlap in datacenter dc-1 in one address space"
        ),
        "{err}"
    );
    assert!(!err.contains("both hold"), "{err}");
    let out = text(&run.stdout);
    for line in [
        "a        ingress  dc-1        prefix  10.0.0.0/30",
        "a        lb       dc-1        range   10.0.0.4-10.0.0.7",
        "b        ingress  dc-1        prefix  10.0.0.8/30",
        "b        lb       dc-1        range   10.0.0.12-10.0.0.15",
    ] {
        assert!(out.contains(line), "{line:?} in\n{out}");
    }

    // In two address spaces: each may hand out the same addresses, and the warning lists
    // them.
    let w = Workdir::new("overlap-spaces");
    let spaced = OVERLAPPING.replacen("spec:\n", "spec:\n  addressSpace: vrf-ingress\n", 2);
    let spaced = spaced.replacen("spec:\n  addressSpace: vrf-ingress\n", "spec:\n", 1);
    let files = w.write("in.yaml", &format!("{spaced}{}", clusters(&["a", "b"])));
    let state = w.path("state.yaml");
    let run = offline(&[files.to_str().unwrap()], &state);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    assert!(
        err.contains(
            "warning: pools ingress (10.0.0.0/24) and lb (10.0.0.0/28) overlap in datacenter dc-1 across address spaces (space vrf-ingress and the default space)"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "warning: cluster a (pool ingress) and cluster a (pool lb) both hold 10.0.0.0-10.0.0.3 in datacenter dc-1"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "cluster b (pool ingress) and cluster b (pool lb) both hold 10.0.0.4-10.0.0.7"
        ),
        "{err}"
    );

    let run = kipam(&["validate", "-f", files.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(0));
    assert!(
        text(&run.stderr).contains(
            "warning: pools ingress (10.0.0.0/24) and lb (10.0.0.0/28) overlap in datacenter dc-1"
        ),
        "{}",
        text(&run.stderr)
    );

    // The examples do not overlap: no warning.
    let run = kipam(&["validate", "-f", &examples()]);
    assert_eq!(run.status.code(), Some(0));
    assert!(
        !text(&run.stderr).contains("warning"),
        "{}",
        text(&run.stderr)
    );
}

#[test]
fn a_pool_that_no_longer_fits_its_stored_allocations_is_refused() {
    let valid = format!("{POOL}{}", clusters(&["a", "b"]));
    // poolCidr moved: a's and b's range allocations lie outside the new one.
    let moved = format!(
        "{}{}",
        POOL.replace("10.0.0.0/29", "10.0.1.0/29"),
        clusters(&["a", "b"])
    );
    let err = refused_after_valid_run("immutable-cidr", &valid, &moved);
    assert!(
        err.contains(
            "IPAMPool small: spec.datacenters[dc-1].poolCidr \"10.0.1.0/29\": is immutable: stored allocations lie outside it (made from an earlier poolCidr); allocations affected: a (10.0.0.0-10.0.0.3), b (10.0.0.4-10.0.0.7)"
        ),
        "{err}"
    );
    // Widening the pool keeps every allocation inside: accepted.
    let w = Workdir::new("immutable-wider");
    let files = w.write("in.yaml", &valid);
    let state = w.path("state.yaml");
    assert_eq!(
        offline(&[files.to_str().unwrap()], &state).status.code(),
        Some(0)
    );
    std::fs::write(
        &files,
        format!(
            "{}{}",
            POOL.replace("10.0.0.0/29", "10.0.0.0/28"),
            clusters(&["a", "b"])
        ),
    )
    .unwrap();
    let run = offline(&[files.to_str().unwrap()], &state);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));

    // type changed: range allocations stored for what is now a prefix pool.
    let retyped = format!(
        "{}{}",
        POOL.replace(
            "type: range\n      poolCidr: 10.0.0.0/29\n      allocationRange: 4",
            "type: prefix\n      poolCidr: 10.0.0.0/29\n      allocationPrefix: 30"
        ),
        clusters(&["a", "b"])
    );
    let err = refused_after_valid_run("immutable-type", &valid, &retyped);
    assert!(
        err.contains("IPAMPool small: spec.datacenters[dc-1].type \"prefix\": is immutable (was range); allocations affected: a (10.0.0.0-10.0.0.3), b (10.0.0.4-10.0.0.7)"),
        "{err}"
    );

    // allocationPrefix changed on a prefix pool.
    let reprefixed = format!(
        "{}{}",
        POOL.replace("allocationPrefix: 64", "allocationPrefix: 56"),
        clusters(&["a", "b"])
    );
    let err = refused_after_valid_run("immutable-prefix", &valid, &reprefixed);
    assert!(
        err.contains("IPAMPool big: spec.datacenters[dc-1].allocationPrefix \"56\": is immutable (was 64); allocations affected: a (2001:db8::/64), b (2001:db8:0:1::/64)"),
        "{err}"
    );
}

#[test]
fn a_cluster_with_its_own_prefix_is_not_mistaken_for_a_changed_pool() {
    // One cluster whose override asks for a /60: its stored /60 says nothing about the pool.
    let w = Workdir::new("own-prefix");
    let input = format!(
        "{POOL}{}",
        cluster_doc("a", 1, "  ipam:\n    big:\n      allocationPrefix: 60\n")
    );
    let files = w.write("in.yaml", &input);
    let state = w.path("state.yaml");
    for _ in 0..2 {
        let run = offline(&[files.to_str().unwrap()], &state);
        assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    }
    assert!(w.read("state.yaml").contains("cidr: 2001:db8::/60"));
}

#[test]
fn validate_checks_pools_against_the_state_and_overrides_against_the_pools() {
    let w = Workdir::new("validate-state");
    let good = w.write("good.yaml", &format!("{POOL}{}", clusters(&["a"])));
    let state = w.path("state.yaml");
    assert_eq!(
        offline(&[good.to_str().unwrap()], &state).status.code(),
        Some(0)
    );
    let moved = w.write(
        "moved.yaml",
        &format!(
            "{}{}",
            POOL.replace("10.0.0.0/29", "10.0.1.0/29"),
            clusters(&["a"])
        ),
    );
    // Without --old: the state shows the allocation outside the new poolCidr.
    let run = kipam(&[
        "validate",
        "-f",
        moved.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(1));
    assert!(
        text(&run.stderr).contains("IPAMPool small: spec.datacenters[dc-1].poolCidr \"10.0.1.0/29\": is immutable: stored allocations lie outside it (made from an earlier poolCidr); allocations affected: a (10.0.0.0-10.0.0.3)"),
        "{}",
        text(&run.stderr)
    );
    // With --old too: the old value, and the allocations affected.
    let run = kipam(&[
        "validate",
        "-f",
        moved.to_str().unwrap(),
        "--old",
        good.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(1));
    assert_eq!(
        text(&run.stderr),
        "IPAMPool small: spec.datacenters[dc-1].poolCidr \"10.0.1.0/29\": may only be widened to a network that contains the old one (was 10.0.0.0/29); allocations affected: a (10.0.0.0-10.0.0.3)\n"
    );
    // An override naming a pool that is not among the pools validated.
    let typo = w.write(
        "typo.yaml",
        &format!(
            "{POOL}{}",
            cluster_doc("a", 1, "  ipam:\n    bigg:\n      optOut: true\n")
        ),
    );
    let run = kipam(&["validate", "-f", typo.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(1));
    assert_eq!(
        text(&run.stderr),
        "Cluster a: spec.ipam[bigg]: names no IPAMPool, did you mean big?\n"
    );
    // Unknown fields in validate's input: exit 1, the same message as offline.
    let unknown = w.write(
        "unknown.yaml",
        &POOL.replace("type: range", "type: range\n      strategie: BestFit"),
    );
    let run = kipam(&["validate", "-f", unknown.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(1));
    assert!(
        text(&run.stderr).contains("unknown.yaml:9: IPAMPool small: spec.datacenters[dc-1].strategie: unknown field, did you mean `strategy`?"),
        "{}",
        text(&run.stderr)
    );
}

#[test]
fn a_clusters_namespace_is_read_strictly_and_without_a_note() {
    let w = Workdir::new("namespaces");
    let state = w.path("state.yaml");
    let namespace = |name: &str, extra: &str| {
        format!("---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n{extra}")
    };
    let addon = "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Addon\nmetadata:\n  name: metallb\n  namespace: cluster-a\nspec:\n  name: metallb\n";

    // The cluster's namespace before its Addon: read without a note. Another namespace is
    // not kipam's: skipped with a note, as any other kind.
    let files = w.write(
        "in.yaml",
        &format!(
            "{POOL}{}{}{addon}{}",
            clusters(&["a"]),
            namespace("cluster-a", "  labels:\n    ipam.kipam.dev/cluster: a\n"),
            namespace("monitoring", ""),
        ),
    );
    let run = offline(&[files.to_str().unwrap()], &state);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    assert_eq!(
        err.trim(),
        format!(
            "note: skipped {}:46: v1 Namespace monitoring",
            files.display()
        ),
    );

    // Checked against Kubernetes' schema of a Namespace, like kipam's own kinds.
    let files = w.write(
        "in.yaml",
        &format!(
            "{POOL}{}{}{}{addon}",
            clusters(&["a"]),
            namespace("cluster-a", "  label:\n    team: x\nspec:\n  finalizer: [kubernetes]\n"),
            "---\nkind: Namespace\nmetadata:\n  name: cluster-b\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  labels: {}\n",
        ),
    );
    let saved = std::fs::read(&state).unwrap();
    let run = offline(&[files.to_str().unwrap()], &state);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    for expected in [
        "Namespace cluster-a: metadata.label: unknown field, did you mean `labels`?",
        "Namespace cluster-a: spec.finalizer: unknown field, did you mean `finalizers`?",
        "Namespace cluster-b: apiVersion: is required (v1)",
        "Namespace: the object has no name (metadata.name is missing or empty)",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    assert_eq!(std::fs::read(&state).unwrap(), saved, "state untouched");
}
