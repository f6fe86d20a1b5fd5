//! The `network` of a pool datacenter in offline mode: read strictly from manifests, refused
//! when wrong without touching the state, and seen by the templates that `--out` renders.

use super::{Workdir, kipam, offline, text};

/// Pool `lb` (with a network in `dc-1`, none in `dc-2`) and pool `plain` (no network), one
/// cluster in each datacenter, and an Addon `netinfo` for both clusters.
fn manifests(network: &str) -> String {
    format!(
        "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: lb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/28
      allocationRange: 4
      excludeRanges: [\"10.0.0.1\"]
{network}
    dc-2:
      type: range
      poolCidr: 10.1.0.0/28
      allocationRange: 4
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: plain
spec:
  datacenters:
    dc-1:
      type: prefix
      poolCidr: 10.2.0.0/24
      allocationPrefix: 28
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: Cluster
metadata:
  name: a
spec:
  datacenter: dc-1
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: Cluster
metadata:
  name: b
spec:
  datacenter: dc-2
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: Addon
metadata:
  name: netinfo
  namespace: cluster-a
spec:
  name: netinfo
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: Addon
metadata:
  name: netinfo
  namespace: cluster-b
spec:
  name: netinfo
"
    )
}

const NETWORK: &str = "      network:
        gateway: 10.0.0.1
        prefixLength: 24
        dnsServers: [\"10.0.0.53\", \"2001:db8::53\"]
        vlanId: 42
        mtu: 9000";

/// An addon that writes every network value of every allocation into a ConfigMap, testing
/// each with `if` as an addon author would (the engine's undefined is strict).
const TEMPLATE: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: netinfo
data:
{% for name, a in Cluster.Network.IPAMAllocations | items %}
{% if a.Gateway %}  {{ name }}-gateway: \"{{ a.Gateway }}\"
{% else %}  {{ name }}-gateway: none
{% endif %}
{% if a.PrefixLength is not none %}  {{ name }}-prefix: \"{{ a.PrefixLength }}\"
{% endif %}
{% if a.VLAN is not none %}  {{ name }}-vlan: \"{{ a.VLAN }}\"
{% endif %}
{% if a.MTU %}  {{ name }}-mtu: \"{{ a.MTU }}\"
{% endif %}
  {{ name }}-dns: \"{{ a.DNS | join(',') }}\"
{% endfor %}
";

fn render(w: &Workdir, input: &str) -> std::process::Output {
    let files = w.write("in.yaml", input);
    let addons = w.path("addons");
    std::fs::create_dir_all(addons.join("netinfo")).unwrap();
    std::fs::write(addons.join("netinfo").join("cm.yaml"), TEMPLATE).unwrap();
    kipam(&[
        "offline",
        "-f",
        files.to_str().unwrap(),
        "--state",
        w.path("state.yaml").to_str().unwrap(),
        "--out",
        w.path("out").to_str().unwrap(),
        "--addons-dir",
        addons.to_str().unwrap(),
        "--templates-dir",
        "/nonexistent/kipam",
    ])
}

#[test]
fn templates_see_the_network_and_nothing_where_there_is_none() {
    let w = Workdir::new("network-render");
    let run = render(&w, &manifests(NETWORK));
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let a = w.read("out/a/netinfo.yaml");
    for line in [
        "lb-gateway: \"10.0.0.1\"",
        "lb-prefix: \"24\"",
        "lb-vlan: \"42\"",
        "lb-mtu: \"9000\"",
        "lb-dns: 10.0.0.53,2001:db8::53",
        // A pool without a network: every value empty, and no template error.
        "plain-gateway: none",
        "plain-dns: \"\"",
    ] {
        assert!(a.contains(line), "{line:?} missing in:\n{a}");
    }
    assert!(
        !a.contains("plain-prefix") && !a.contains("plain-vlan"),
        "{a}"
    );
    // Cluster b is in dc-2, where pool lb names no network.
    let b = w.read("out/b/netinfo.yaml");
    assert!(b.contains("lb-gateway: none"), "{b}");
    assert!(b.contains("lb-dns: \"\""), "{b}");
    assert!(!b.contains("lb-vlan"), "{b}");

    // `kipam render` shows the same when the file holds the pools.
    let one = kipam(&[
        "render",
        "--addon",
        "netinfo",
        "--name",
        "a",
        "--state",
        w.path("state.yaml").to_str().unwrap(),
        "--addons-dir",
        w.path("addons").to_str().unwrap(),
        "--templates-dir",
        "/nonexistent/kipam",
        "--cluster",
        w.path("in.yaml").to_str().unwrap(),
    ]);
    assert_eq!(one.status.code(), Some(0), "{}", text(&one.stderr));
    let shown = text(&one.stdout);
    assert!(shown.contains("lb-gateway: \"10.0.0.1\""), "{shown}");
    assert!(shown.contains("plain-gateway: none"), "{shown}");
}

/// A wrong network or a mistyped field in it is refused, naming the file, field and value, and
/// the state stays as it was: nothing released, nothing re-planned.
#[test]
fn a_wrong_network_is_refused_and_the_state_is_untouched() {
    let w = Workdir::new("network-refused");
    let first = render(&w, &manifests(NETWORK));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let saved = std::fs::read(w.path("state.yaml")).unwrap();
    let files = w.path("in.yaml");
    for (network, expected) in [
        (
            NETWORK.replace("vlanId: 42", "vlan: 42"),
            "IPAMPool lb: spec.datacenters[dc-1].network.vlan: unknown field, did you mean `vlanId`?",
        ),
        (
            NETWORK.replace("gateway: 10.0.0.1", "gateway: 10.0.0.2"),
            "IPAMPool lb: spec.datacenters[dc-1].network.gateway \"10.0.0.2\": lies inside poolCidr 10.0.0.0/28 and is not excluded, so kipam could hand it to a cluster: add it to excludeRanges",
        ),
        (
            NETWORK.replace("mtu: 9000", "mtu: 65535"),
            "IPAMPool lb: spec.datacenters[dc-1].network.mtu \"65535\": must be between 576 and 9216",
        ),
        (NETWORK.replace("mtu: 9000", "mtu: 1500.5"), "network.mtu"),
    ] {
        std::fs::write(&files, manifests(&network)).unwrap();
        let run = offline(&[files.to_str().unwrap()], &w.path("state.yaml"));
        let err = text(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{err}");
        assert!(err.contains(expected), "{expected:?} missing in:\n{err}");
        assert_eq!(
            std::fs::read(w.path("state.yaml")).unwrap(),
            saved,
            "state untouched"
        );
    }

    // `kipam validate` refuses the same with the same message.
    std::fs::write(
        &files,
        manifests(&NETWORK.replace("vlanId: 42", "vlanId: 4095")),
    )
    .unwrap();
    let run = kipam(&["validate", "-f", files.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(1), "{}", text(&run.stderr));
    let all = format!("{}{}", text(&run.stdout), text(&run.stderr));
    assert!(
        all.contains(
            "IPAMPool lb: spec.datacenters[dc-1].network.vlanId \"4095\": must be between 0 and 4094"
        ),
        "{all}"
    );
}
