//! Issue 37: `kipam offline` used as a GitOps team uses it — branches merged, files moved,
//! flags mistyped, runs killed. Each test is one item of the issue, named after what a user
//! would check; each failed on the code before the fix (see the closing note).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{Workdir, text};

const NOW: &str = "2026-03-01T00:00:00Z";

/// `kipam ARGS... EXTRA` with paths as arguments.
fn run(args: &[&str], paths: &[&Path]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kipam"));
    cmd.args(args);
    for p in paths {
        cmd.arg(p);
    }
    cmd.output().expect("run kipam")
}

/// `kipam offline -f FILES... --state STATE --now NOW MORE...`.
fn offline(files: &[&Path], state: &Path, more: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kipam"));
    cmd.arg("offline");
    for f in files {
        cmd.arg("-f").arg(f);
    }
    cmd.arg("--state")
        .arg(state)
        .args(["--now", NOW])
        .args(more);
    cmd.output().expect("run kipam")
}

fn pool(name: &str, body: &str) -> String {
    format!(
        "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: {name}\nspec:\n{body}"
    )
}

fn range_pool(name: &str, cidr: &str, range: u32) -> String {
    pool(
        name,
        &format!(
            "  datacenters:\n    dc-1:\n      type: range\n      poolCidr: {cidr}\n      allocationRange: {range}\n"
        ),
    )
}

fn cluster(name: &str, dc: &str, extra: &str) -> String {
    format!(
        "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n  creationTimestamp: \"2026-01-01T00:00:00Z\"\nspec:\n  datacenter: {dc}\n{extra}"
    )
}

fn addon(cluster: &str, name: &str, addon: &str) -> String {
    format!(
        "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Addon\nmetadata:\n  name: {name}\n  namespace: cluster-{cluster}\nspec:\n  name: {addon}\n"
    )
}

/// IPv4 `a.b.c.d` as a number.
fn v4(text: &str) -> u32 {
    text.parse::<std::net::Ipv4Addr>()
        .expect("an IPv4 address")
        .into()
}

/// Every IPv4 range held in a state file, with the allocation that holds it.
fn held(state: &str) -> Vec<(String, u32, u32)> {
    let mut out = Vec::new();
    let mut object = String::new();
    let mut namespace = String::new();
    let mut in_addresses = false;
    for line in state.lines() {
        if line == "---" {
            object.clear();
            namespace.clear();
            in_addresses = false;
        } else if let Some(n) = line.strip_prefix("  name: ") {
            object = n.to_string();
        } else if let Some(n) = line.strip_prefix("  namespace: ") {
            namespace = n.to_string();
        } else if line == "  addresses:" {
            in_addresses = true;
        } else if let Some(piece) = line.strip_prefix("  - ").filter(|_| in_addresses) {
            let (a, b) = piece.split_once('-').unwrap_or((piece, piece));
            out.push((format!("{namespace}/{object}"), v4(a), v4(b)));
        } else if !line.starts_with("  - ") {
            in_addresses = false;
        }
    }
    out
}

fn assert_no_address_twice(state: &str) {
    let list = held(state);
    for (i, a) in list.iter().enumerate() {
        for b in &list[i + 1..] {
            assert!(
                a.2 < b.1 || b.2 < a.1,
                "{} and {} hold the same addresses:\n{state}",
                a.0,
                b.0
            );
        }
    }
}

// ---- 1. A state merged by Git -------------------------------------------------------------

#[test]
fn a_state_merged_by_git_with_one_range_given_twice_is_refused_by_every_command() {
    let w = Workdir::new("adv-merge");
    let pools = w.write("pools.yaml", &range_pool("small", "10.0.0.0/28", 4));
    // Two branches, each adding a cluster to the same base (no state yet).
    let a = w.write("a.yaml", &cluster("a", "dc-1", ""));
    let b = w.write("b.yaml", &cluster("b", "dc-1", ""));
    let left = w.path("left.yaml");
    let right = w.path("right.yaml");
    assert_eq!(offline(&[&pools, &a], &left, &[]).status.code(), Some(0));
    assert_eq!(offline(&[&pools, &b], &right, &[]).status.code(), Some(0));
    // Git merges the two additions without a conflict: both documents end up in one file.
    let right_docs = w.read("right.yaml");
    let merged = format!(
        "{}{}",
        w.read("left.yaml"),
        &right_docs[right_docs.find("---").expect("a document")..]
    );
    let state = w.write("state.yaml", &merged);
    let both = w.write(
        "both.yaml",
        &format!("{}{}", cluster("a", "dc-1", ""), cluster("b", "dc-1", "")),
    );
    let addons = w.path("addons");
    std::fs::create_dir_all(addons.join("cm")).unwrap();
    std::fs::write(
        addons.join("cm").join("cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ipam\ndata:\n{% for name, a in Cluster.Network.IPAMAllocations | items %}  {{ name }}: \"{{ a.Addresses | join(',') }}\"\n{% endfor %}",
    )
    .unwrap();
    let with_addons = w.write(
        "addons.yaml",
        &format!("{}{}", addon("a", "cm", "cm"), addon("b", "cm", "cm")),
    );
    let out = w.path("out");
    let expected = "cluster a (pool small, IPAMAllocation cluster-a/small) and cluster b (pool \
                    small, IPAMAllocation cluster-b/small) both hold 10.0.0.0-10.0.0.3 in \
                    datacenter dc-1";

    let run_offline = run(
        &[
            "offline",
            "--now",
            NOW,
            "--templates-dir",
            "/nonexistent/kipam",
            "-f",
        ],
        &[
            &pools,
            Path::new("-f"),
            &both,
            Path::new("-f"),
            &with_addons,
            Path::new("--state"),
            &state,
            Path::new("--out"),
            &out,
            Path::new("--addons-dir"),
            &addons,
        ],
    );
    let err = text(&run_offline.stderr);
    assert_eq!(run_offline.status.code(), Some(2), "{err}");
    assert!(err.contains(expected), "{err}");
    assert!(err.contains("decide which cluster keeps them"), "{err}");
    assert_eq!(w.read("state.yaml"), merged, "the state is left as it was");
    assert!(
        !out.exists(),
        "nothing is rendered from a state in conflict"
    );

    let validate = run(
        &["validate", "-f"],
        &[&pools, Path::new("-f"), &both, Path::new("--state"), &state],
    );
    let err = text(&validate.stderr);
    assert_eq!(validate.status.code(), Some(1), "{err}");
    assert!(err.contains(expected), "{err}");

    let render = run(
        &[
            "render",
            "--addon",
            "cm",
            "--templates-dir",
            "/nonexistent/kipam",
            "--addons-dir",
        ],
        &[
            &addons,
            Path::new("--cluster"),
            &a,
            Path::new("--state"),
            &state,
        ],
    );
    let err = text(&render.stderr);
    assert_ne!(render.status.code(), Some(0), "{err}");
    assert!(err.contains(expected), "{err}");
    assert_eq!(text(&render.stdout), "", "nothing rendered");
}

// ---- 2. Retain, then a new pool over the same space ---------------------------------------

#[test]
fn addresses_kept_by_retain_are_not_handed_out_again_by_a_new_pool_over_them() {
    let w = Workdir::new("adv-retain");
    let clusters = format!("{}{}", cluster("a", "dc-1", ""), cluster("b", "dc-1", ""));
    let before = w.write(
        "before.yaml",
        &format!(
            "{}  reclaimPolicy: Retain\n{clusters}",
            range_pool("old", "10.0.0.0/29", 4)
        ),
    );
    let state = w.path("state.yaml");
    assert_eq!(offline(&[&before], &state, &[]).status.code(), Some(0));
    // The pool is deleted (its allocations are kept) and a new one covers the same addresses.
    let after = w.write(
        "after.yaml",
        &format!("{}{clusters}", range_pool("new", "10.0.0.0/28", 4)),
    );
    let run = offline(&[&after], &state, &[]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let saved = w.read("state.yaml");
    assert!(saved.contains("name: old"), "kept by Retain:\n{saved}");
    assert_no_address_twice(&saved);
    assert!(saved.contains("10.0.0.8-10.0.0.11"), "{saved}");
    assert!(saved.contains("10.0.0.12-10.0.0.15"), "{saved}");
}

// ---- 3. A stored entry whose type disagrees with its data ---------------------------------

#[test]
fn a_stored_entry_whose_type_disagrees_with_its_data_is_refused_not_replanned() {
    let w = Workdir::new("adv-type");
    let input = w.write(
        "in.yaml",
        &format!(
            "{}{}",
            range_pool("small", "10.0.0.0/28", 4),
            cluster("a", "dc-1", "")
        ),
    );
    let state = w.path("state.yaml");
    assert_eq!(offline(&[&input], &state, &[]).status.code(), Some(0));
    let saved = w.read("state.yaml");
    let edited = saved.replace(
        "  addresses:\n  - 10.0.0.0-10.0.0.3\n",
        "  cidr: 10.0.0.4/30\n",
    );
    assert_ne!(edited, saved);
    std::fs::write(&state, &edited).unwrap();
    let run = offline(&[&input], &state, &[]);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(
        err.contains("IPAMAllocation cluster-a/small: spec.cidr \"10.0.0.4/30\""),
        "{err}"
    );
    assert!(err.contains("disagrees with its type"), "{err}");
    assert_eq!(w.read("state.yaml"), edited);
}

// ---- 4. IPv4-mapped IPv6 pools --------------------------------------------------------------

#[test]
fn ipv4_mapped_ipv6_pools_are_refused() {
    let w = Workdir::new("adv-mapped");
    let input = w.write(
        "in.yaml",
        &format!(
            "{}{}",
            range_pool("v4", "10.0.0.0/24", 4),
            range_pool("mapped", "\"::ffff:10.0.0.0/120\"", 4)
        ),
    );
    let validate = run(&["validate", "-f"], &[&input]);
    let err = text(&validate.stderr);
    assert_eq!(validate.status.code(), Some(1), "{err}");
    assert!(
        err.contains("IPAMPool mapped: spec.datacenters[dc-1].poolCidr \"::ffff:10.0.0.0/120\": is an IPv4-mapped IPv6 network"),
        "{err}"
    );
    assert!(
        err.contains("write the IPv4 network 10.0.0.0/24 instead"),
        "{err}"
    );
    let run = offline(&[&input], &w.path("state.yaml"), &[]);
    assert_eq!(run.status.code(), Some(2), "{}", text(&run.stderr));
    assert!(!w.path("state.yaml").exists());
}

// ---- 5. addressSpace: default ---------------------------------------------------------------

#[test]
fn address_space_default_is_the_default_space() {
    let w = Workdir::new("adv-default-space");
    let input = w.write(
        "in.yaml",
        &format!(
            "{}{}  addressSpace: default\n{}",
            range_pool("plain", "10.0.0.0/28", 4),
            range_pool("named", "10.0.0.0/28", 4),
            cluster("a", "dc-1", "")
        ),
    );
    let state = w.path("state.yaml");
    let run = offline(&[&input], &state, &[]);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    assert!(
        err.contains("overlap in datacenter dc-1 in one address space"),
        "{err}"
    );
    assert!(!err.contains("space default"), "{err}");
    assert_no_address_twice(&w.read("state.yaml"));
}

// ---- 6. A gateway handed out through another pool of the space -----------------------------

#[test]
fn a_gateway_is_not_handed_out_through_another_pool_of_its_address_space() {
    let w = Workdir::new("adv-gateway");
    let a = pool(
        "a",
        "  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/28\n      allocationRange: 2\n      excludeRanges: [\"10.0.0.1\"]\n      network:\n        gateway: 10.0.0.1\n        prefixLength: 24\n",
    );
    let b = range_pool("b", "10.0.0.0/28", 2);
    let input = w.write(
        "in.yaml",
        &format!(
            "{a}{b}{}{}",
            cluster("one", "dc-1", ""),
            cluster("two", "dc-1", "")
        ),
    );
    let state = w.path("state.yaml");
    let run = offline(&[&input], &state, &[]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let saved = w.read("state.yaml");
    assert_no_address_twice(&saved);
    let gateway = v4("10.0.0.1");
    for (holder, first, last) in held(&saved) {
        assert!(
            gateway < first || gateway > last,
            "{holder} holds the gateway 10.0.0.1:\n{saved}"
        );
    }
    // A state that hands it out already (written before) is refused, naming it.
    let edited = saved.replace(
        "- 10.0.0.3-10.0.0.4",
        "- 10.0.0.1-10.0.0.1\n  - 10.0.0.3-10.0.0.3",
    );
    assert_ne!(edited, saved, "{saved}");
    std::fs::write(&state, &edited).unwrap();
    let run = offline(&[&input], &state, &[]);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(err.contains("the gateway of pool a"), "{err}");
}

// ---- 7. A paused cluster moved to another datacenter ----------------------------------------

#[test]
fn a_paused_cluster_moved_to_another_datacenter_is_explained_and_not_rendered_there() {
    let w = Workdir::new("adv-paused-move");
    let pools = pool(
        "small",
        "  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/28\n      allocationRange: 4\n    dc-2:\n      type: range\n      poolCidr: 10.1.0.0/28\n      allocationRange: 4\n",
    );
    let addons = w.path("addons");
    std::fs::create_dir_all(addons.join("cm")).unwrap();
    std::fs::write(
        addons.join("cm").join("cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ipam\ndata:\n  dc: {{ Cluster.Datacenter }}\n{% for name, a in Cluster.Network.IPAMAllocations | items %}  {{ name }}: \"{{ a.DC }} {{ a.Addresses | join(',') }}\"\n{% endfor %}",
    )
    .unwrap();
    let out = w.path("out");
    let flags = [
        "--out",
        out.to_str().unwrap(),
        "--addons-dir",
        addons.to_str().unwrap(),
        "--templates-dir",
        "/nonexistent/kipam",
    ];
    let before = w.write(
        "before.yaml",
        &format!(
            "{pools}{}{}",
            cluster("a", "dc-1", ""),
            addon("a", "cm", "cm")
        ),
    );
    let state = w.path("state.yaml");
    assert_eq!(offline(&[&before], &state, &flags).status.code(), Some(0));
    assert!(w.read("out/a/cm.yaml").contains("10.0.0.0-10.0.0.3"));
    let after = w.write(
        "after.yaml",
        &format!(
            "{pools}{}{}",
            cluster("a", "dc-2", "  pause: true\n"),
            addon("a", "cm", "cm")
        ),
    );
    let run = offline(&[&after], &state, &flags);
    let out_text = text(&run.stdout);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{out_text}{}",
        text(&run.stderr)
    );
    assert!(
        out_text.contains("its datacenter changed from dc-1 to dc-2 while it is paused"),
        "{out_text}"
    );
    assert!(out_text.contains("until it is resumed"), "{out_text}");
    let rendered = w.read("out/a/cm.yaml");
    assert!(rendered.contains("dc: dc-2"), "{rendered}");
    assert!(
        !rendered.contains("10.0.0."),
        "old datacenter's addresses rendered:\n{rendered}"
    );
}

// ---- 8. A misspelt field in the state file --------------------------------------------------

#[test]
fn a_misspelt_field_in_the_state_file_is_refused_and_the_quarantine_kept() {
    let w = Workdir::new("adv-misspelt");
    let pools = pool(
        "small",
        "  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/28\n      allocationRange: 4\n      reuseAfter: 24h\n",
    );
    let two = w.write(
        "two.yaml",
        &format!(
            "{pools}{}{}",
            cluster("a", "dc-1", ""),
            cluster("b", "dc-1", "")
        ),
    );
    let one = w.write("one.yaml", &format!("{pools}{}", cluster("a", "dc-1", "")));
    let state = w.path("state.yaml");
    assert_eq!(offline(&[&two], &state, &[]).status.code(), Some(0));
    assert_eq!(offline(&[&one], &state, &[]).status.code(), Some(0));
    let saved = w.read("state.yaml");
    assert!(
        saved.contains("  reservations:\n"),
        "b's addresses quarantined:\n{saved}"
    );
    let edited = saved.replace("  reservations:\n", "  reservatons:\n");
    std::fs::write(&state, &edited).unwrap();
    let run = offline(&[&one], &state, &[]);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(
        err.contains("spec.reservatons: unknown field, did you mean `reservations`?"),
        "{err}"
    );
    assert_eq!(w.read("state.yaml"), edited);
}

// ---- 9. Outputs that are inputs -------------------------------------------------------------

#[test]
fn an_output_that_is_an_input_or_lies_inside_out_is_refused_before_anything_is_written() {
    let w = Workdir::new("adv-outputs");
    let input = w.write(
        "in.yaml",
        &format!(
            "{}{}{}",
            range_pool("small", "10.0.0.0/28", 4),
            cluster("a", "dc-1", ""),
            addon("a", "cm", "cm")
        ),
    );
    let addons = w.path("addons");
    std::fs::create_dir_all(addons.join("cm")).unwrap();
    std::fs::write(
        addons.join("cm").join("cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ipam\n",
    )
    .unwrap();
    let out = w.path("out");
    let state = w.path("state.yaml");
    let render = |state: &Path, report: Option<&Path>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kipam"));
        cmd.arg("offline")
            .arg("-f")
            .arg(&input)
            .arg("--state")
            .arg(state);
        cmd.args(["--now", NOW, "--templates-dir", "/nonexistent/kipam"]);
        cmd.arg("--addons-dir").arg(&addons).arg("--out").arg(&out);
        if let Some(r) = report {
            cmd.arg("--report").arg(r);
        }
        cmd.output().expect("run kipam")
    };
    assert_eq!(render(&state, None).status.code(), Some(0));
    let files = |dir: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut list = Vec::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                if e.path().is_dir() {
                    todo.push(e.path());
                } else {
                    list.push((e.path(), std::fs::read(e.path()).unwrap()));
                }
            }
        }
        list.sort();
        list
    };
    let before = files(&w.0);
    let rendered = out.join("a").join("cm.yaml");
    let inside = out.join("state.yaml");
    let cases: [(&Path, Option<&Path>, &str); 4] = [
        (&state, Some(&state), "is the state file"),
        (&state, Some(&input), "is the manifest"),
        (&state, Some(&rendered), "lies inside --out"),
        (&inside, None, "lies inside --out"),
    ];
    for (state, report, expected) in cases {
        let run = render(state, report);
        let err = text(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{expected}: {err}");
        assert!(err.contains(expected), "{err}");
        assert_eq!(files(&w.0), before, "{expected}: nothing written");
    }
}

// ---- 10. --out naming a file ----------------------------------------------------------------

#[test]
fn an_out_that_is_a_file_is_a_usage_error_and_the_state_is_not_written() {
    let w = Workdir::new("adv-out-file");
    let input = w.write(
        "in.yaml",
        &format!(
            "{}{}",
            range_pool("small", "10.0.0.0/28", 4),
            cluster("a", "dc-1", "")
        ),
    );
    let out = w.write("out", "not a directory\n");
    let state = w.path("state.yaml");
    let run = offline(
        &[&input],
        &state,
        &[
            "--out",
            out.to_str().unwrap(),
            "--addons-dir",
            w.0.to_str().unwrap(),
        ],
    );
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(err.contains("exists and is not a directory"), "{err}");
    assert!(
        !state.exists(),
        "the state was written:\n{}",
        w.read("state.yaml")
    );
    assert_eq!(w.read("out"), "not a directory\n");
}

// ---- 11. An empty state file ----------------------------------------------------------------

#[test]
fn a_state_file_without_any_document_is_refused_unless_asked() {
    let w = Workdir::new("adv-empty-state");
    let input = w.write(
        "in.yaml",
        &format!(
            "{}{}",
            range_pool("small", "10.0.0.0/28", 4),
            cluster("a", "dc-1", "")
        ),
    );
    for content in ["", "# resolved a merge conflict\n", "---\n---\n"] {
        let state = w.write("state.yaml", content);
        let run = offline(&[&input], &state, &[]);
        let err = text(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{content:?}: {err}");
        assert!(err.contains("exists but holds no state"), "{err}");
        assert!(err.contains("--allow-empty-state"), "{err}");
        assert_eq!(w.read("state.yaml"), content);
    }
    let state = w.path("state.yaml");
    let run = offline(&[&input], &state, &["--allow-empty-state"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    assert!(w.read("state.yaml").contains("10.0.0.0-10.0.0.3"));
    // A state kipam emptied itself (every cluster removed) is a state, read as such.
    let pools_only = w.write("pools.yaml", &range_pool("small", "10.0.0.0/28", 4));
    let run = offline(&[&pools_only], &state, &["--allow-release"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let run = offline(&[&pools_only], &state, &[]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    assert!(
        text(&run.stdout).contains("unchanged"),
        "{}",
        text(&run.stdout)
    );
}

// ---- 13. Leftovers of a killed run ----------------------------------------------------------

#[test]
fn a_temporary_file_left_by_a_killed_run_is_removed_and_said() {
    let w = Workdir::new("adv-leftovers");
    let input = w.write(
        "in.yaml",
        &format!(
            "{}{}",
            range_pool("small", "10.0.0.0/28", 4),
            cluster("a", "dc-1", "")
        ),
    );
    let mut child = Command::new("true").spawn().expect("run true");
    let dead = child.id();
    child.wait().unwrap();
    let leftover = w.write(&format!(".state.yaml.kipam-tmp-{dead}-0"), "half a sta");
    let live = w.write(
        &format!(".state.yaml.kipam-tmp-{}-0", std::process::id()),
        "being written",
    );
    let other = w.write(".other.yaml.kipam-tmp-1-0", "not the state's");
    let run = offline(&[&input], &w.path("state.yaml"), &[]);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    assert!(!leftover.exists(), "the leftover is removed");
    assert!(
        err.contains(&format!("note: removed {}", leftover.display())),
        "{err}"
    );
    assert!(live.exists(), "a live process's file stays");
    assert!(other.exists(), "another file's leftover stays");
}

// ---- 14. One rule set -----------------------------------------------------------------------

#[test]
fn validate_refuses_the_overrides_offline_would_refuse() {
    let w = Workdir::new("adv-overrides");
    let input = w.write(
        "in.yaml",
        &format!(
            "{}{}{}{}{}",
            range_pool("small", "10.0.0.0/28", 4),
            cluster("a", "dc-1", "  ipam:\n    small:\n      addresses: [\"10.0.0.1-10.0.0.4\", \"10.0.0.3-10.0.0.5\"]\n"),
            cluster("b", "dc-1", "  ipam:\n    small:\n      cidr: 10.0.0.8/30\n"),
            cluster("c", "dc-1", "  ipam:\n    small:\n      allocationPrefix: 30\n"),
            cluster("d", "dc-1", "  ipam:\n    small:\n      addresses: [\"2001:db8::1-2001:db8::3\"]\n"),
        ),
    );
    let validate = run(&["validate", "-f"], &[&input]);
    let err = text(&validate.stderr);
    assert_eq!(validate.status.code(), Some(1), "{err}");
    for expected in [
        "Cluster a: spec.ipam[small].addresses[1] \"10.0.0.3-10.0.0.5\": overlaps 10.0.0.1-10.0.0.4",
        "Cluster b: spec.ipam[small].cidr \"10.0.0.8/30\": pool small is a range pool",
        "Cluster c: spec.ipam[small].allocationPrefix \"30\": pool small is a range pool",
        "Cluster d: spec.ipam[small].addresses[0] \"2001:db8::1-2001:db8::3\": is IPv6",
    ] {
        assert!(err.contains(expected), "{expected}\n{err}");
    }
    let run = offline(&[&input], &w.path("state.yaml"), &[]);
    let offline_err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{offline_err}");
    assert!(
        offline_err.contains("Cluster b: spec.ipam[small].cidr"),
        "{offline_err}"
    );
}

// ---- 15. One object rendered twice ----------------------------------------------------------

#[test]
fn an_addon_rendering_one_object_twice_is_refused_naming_both_places() {
    let w = Workdir::new("adv-duplicate-object");
    let addons = w.path("addons");
    std::fs::create_dir_all(addons.join("dup")).unwrap();
    let cm =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: kube-system\n";
    std::fs::write(addons.join("dup").join("10_a.yaml"), cm).unwrap();
    std::fs::write(
        addons.join("dup").join("20_b.yaml"),
        format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: settings\n  namespace: kube-system\n---\n{cm}"),
    )
    .unwrap();
    let input = w.write(
        "in.yaml",
        &format!(
            "{}{}{}",
            range_pool("small", "10.0.0.0/28", 4),
            cluster("a", "dc-1", ""),
            addon("a", "dup", "dup")
        ),
    );
    let out = w.path("out");
    let run = offline(
        &[&input],
        &w.path("state.yaml"),
        &[
            "--out",
            out.to_str().unwrap(),
            "--addons-dir",
            addons.to_str().unwrap(),
            "--templates-dir",
            "/nonexistent/kipam",
        ],
    );
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(
        err.contains("ConfigMap kube-system/settings is rendered twice: by ")
            && err.contains("dup/10_a.yaml (document 1) and by ")
            && err.contains("dup/20_b.yaml (document 2); the second would silently replace"),
        "{err}"
    );
    assert!(!out.join("a").exists());
}

// ---- 16. A stale "growth refused" -----------------------------------------------------------

#[test]
fn a_growth_refused_message_goes_once_the_growth_is_no_longer_asked() {
    let w = Workdir::new("adv-growth-message");
    let state = w.path("state.yaml");
    let clusters = format!("{}{}", cluster("a", "dc-1", ""), cluster("b", "dc-1", ""));
    for (range, code) in [(4, 0), (6, 1), (4, 0)] {
        let input = w.write(
            "in.yaml",
            &format!("{}{clusters}", range_pool("small", "10.0.0.0/29", range)),
        );
        let run = offline(&[&input], &state, &[]);
        assert_eq!(run.status.code(), Some(code), "{}", text(&run.stdout));
    }
    let saved = w.read("state.yaml");
    assert!(!saved.contains("refused"), "{saved}");
    assert!(saved.contains("10.0.0.0-10.0.0.3"), "{saved}");
}

// ---- 17. Messages in kipam's terms ----------------------------------------------------------

#[test]
fn yaml_mistakes_are_said_in_kipams_terms() {
    let w = Workdir::new("adv-messages");
    let dup = w.write(
        "dup.yaml",
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: p\n  name: q\nspec:\n  datacenters: {}\n",
    );
    let err = text(&run(&["validate", "-f"], &[&dup]).stderr);
    assert!(
        err.contains("line 5 column 3: the key `name` appears twice"),
        "{err}"
    );
    assert!(!err.contains("DuplicateKeyPolicy"), "{err}");

    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let p = i - 1;
        let refs = vec![format!("*a{p}"); 10].join(", ");
        bomb.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    let bomb = w.write("bomb.yaml", &bomb);
    let err = text(&run(&["validate", "-f"], &[&bomb]).stderr);
    assert!(err.contains("too many aliases"), "{err}");
    assert!(!err.contains("RecordedAnchorEvents"), "{err}");

    let nameless = w.write(
        "nameless.yaml",
        &format!(
            "{}{}",
            range_pool("small", "10.0.0.0/28", 4),
            range_pool("\"\"", "10.1.0.0/28", 4)
        ),
    );
    let err = text(&run(&["validate", "-f"], &[&nameless]).stderr);
    assert!(
        err.contains(&format!(
            "{}:13: IPAMPool: the object has no name",
            nameless.display()
        )),
        "{err}"
    );

    let one = w.write("pool.yaml", &range_pool("small", "10.0.0.0/28", 4));
    let twice = run(&["validate", "-f"], &[&one, Path::new("-f"), &one]);
    assert_eq!(twice.status.code(), Some(0), "{}", text(&twice.stderr));
}

#[test]
fn a_prefix_pool_with_no_free_subnet_shows_zero() {
    let w = Workdir::new("adv-zero");
    let input = w.write(
        "in.yaml",
        &format!(
            "{}{}",
            pool(
                "v6",
                "  datacenters:\n    dc-1:\n      type: prefix\n      poolCidr: 2001:db8::/64\n      allocationPrefix: 64\n"
            ),
            cluster("a", "dc-1", "")
        ),
    );
    let run = offline(&[&input], &w.path("state.yaml"), &[]);
    let out = text(&run.stdout);
    assert_eq!(run.status.code(), Some(0), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("v6 ") && l.contains('%'))
        .expect("the usage row");
    let cells: Vec<&str> = row
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    // POOL, DATACENTER, USED, ALLOCATED, EXCLUDED, AVAILABLE, ALLOCATIONS, LARGEST FREE
    assert_eq!(cells[3..8], ["1 /64s", "0", "0", "1", "0"], "{row}");
}
