//! The worked example of `docs/addons.md`: a Cilium LB IPAM addon written against the same
//! data, filters and shared macros as the MetalLB addon. The expected output below is quoted
//! in the guide; keep the two in step.

use std::path::Path;

use kipam::render::{Renderer, TemplateData};
use serde_json::json;

use super::{cluster, prefix, range};

fn example() -> Renderer {
    match Renderer::load(
        Path::new("tests/render/fixtures/example/addons"),
        Path::new("templates"),
    ) {
        Ok(renderer) => renderer,
        Err(err) => panic!("{err}"),
    }
}

fn render(data: &TemplateData) -> String {
    match example().render("cilium-lb", data) {
        Ok(rendered) => rendered.to_yaml(),
        Err(err) => panic!("{err}"),
    }
}

#[test]
fn range_allocation() {
    let data = TemplateData::new(cluster("alpha", "dc-1").with_allocation(
        "cilium-lb",
        range("dc-1", &["10.0.0.8-10.0.0.15", "10.0.0.32-10.0.0.35"]),
    ));
    assert_eq!(
        render(&data),
        r#"---
apiVersion: cilium.io/v2alpha1
kind: CiliumLoadBalancerIPPool
metadata:
  labels:
    ipam.kipam.dev/addon: cilium-lb
  name: kipam-alpha
spec:
  blocks:
  - start: "10.0.0.8"
    stop: "10.0.0.15"
  - start: "10.0.0.32"
    stop: "10.0.0.35"
  serviceSelector:
    matchLabels:
      kipam.dev/lb-pool: alpha
---
apiVersion: v1
data:
  addresses: "12"
  entries: |
    ["10.0.0.8-10.0.0.15", "10.0.0.32-10.0.0.35"]
  family: IPv4
kind: ConfigMap
metadata:
  labels:
    ipam.kipam.dev/addon: cilium-lb
  name: kipam-lb-summary
  namespace: kube-system
"#
    );
}

#[test]
fn prefix_allocation_and_a_variable() {
    let data = TemplateData::new(
        cluster("bravo", "dc-1").with_allocation("cilium-lb", prefix("dc-1", "2001:db8:0:2::/120")),
    )
    .with_variable("selectorLabel", json!("example.com/pool"));
    assert_eq!(
        render(&data),
        r#"---
apiVersion: cilium.io/v2alpha1
kind: CiliumLoadBalancerIPPool
metadata:
  labels:
    ipam.kipam.dev/addon: cilium-lb
  name: kipam-bravo
spec:
  blocks:
  - cidr: 2001:db8:0:2::/120
  serviceSelector:
    matchLabels:
      example.com/pool: bravo
---
apiVersion: v1
data:
  addresses: "256"
  entries: |
    ["2001:db8:0:2::/120"]
  family: IPv6
kind: ConfigMap
metadata:
  labels:
    ipam.kipam.dev/addon: cilium-lb
  name: kipam-lb-summary
  namespace: kube-system
"#
    );
}

#[test]
fn no_allocation_renders_nothing() {
    assert_eq!(render(&TemplateData::new(cluster("charlie", "dc-1"))), "");
}
