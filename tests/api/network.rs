//! A pool datacenter's `network` through the REST API: carried in and out, merged by PATCH,
//! validated on write with the messages of `kipam validate`, and described by the OpenAPI
//! document.

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::harness::*;

fn network() -> Value {
    json!({
        "gateway": "192.168.1.1", "prefixLength": 24,
        "dnsServers": ["192.168.1.53", "2001:db8::53"], "vlanId": 42, "mtu": 9000
    })
}

fn pool_with_network(name: &str) -> Value {
    let mut pool = kkp_pool(name);
    pool["datacenters"]["azure-westeurope"]["network"] = network();
    pool
}

#[tokio::test]
async fn the_network_round_trips_through_post_get_and_patch() {
    let h = Harness::start().await;
    let (status, created) = h
        .send("POST", POOLS, "admin", pool_with_network("metallb"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        created["datacenters"]["azure-westeurope"]["network"],
        network()
    );
    assert!(
        created["datacenters"]["aws-eu-central-1a"]
            .get("network")
            .is_none(),
        "{created}"
    );
    let stored = h.api.get("ipampools", None, "metallb").unwrap();
    assert_eq!(
        stored["spec"]["datacenters"]["azure-westeurope"]["network"],
        network()
    );

    h.wait_cached("metallb", true).await;
    let path = format!("{POOLS}/metallb");
    let (status, read) = h.get(&path, "admin").await;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(
        read["datacenters"]["azure-westeurope"]["network"],
        network()
    );
    let (status, list) = h.get(POOLS, "admin").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        list[0]["datacenters"]["azure-westeurope"]["network"],
        network()
    );

    // A merge patch changes one value and keeps the others.
    let (status, body) = h
        .send(
            "PATCH",
            &path,
            "admin",
            json!({"datacenters": {"azure-westeurope": {"network": {"vlanId": 43, "dnsServers": null}}}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let want = json!({"gateway": "192.168.1.1", "prefixLength": 24, "vlanId": 43, "mtu": 9000});
    assert_eq!(body["datacenters"]["azure-westeurope"]["network"], want);
    let stored = h.api.get("ipampools", None, "metallb").unwrap();
    assert_eq!(
        stored["spec"]["datacenters"]["azure-westeurope"]["network"],
        want
    );

    // A pool read with GET and sent back keeps its network.
    let (_, current) = h.get(&path, "admin").await;
    let (status, body) = h.send("PATCH", &path, "admin", current).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stored = h.api.get("ipampools", None, "metallb").unwrap();
    assert!(
        stored["spec"]["datacenters"]["azure-westeurope"]
            .get("network")
            .is_some()
    );

    // null removes it.
    let (status, body) = h
        .send(
            "PATCH",
            &path,
            "admin",
            json!({"datacenters": {"azure-westeurope": {"network": null}}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stored = h.api.get("ipampools", None, "metallb").unwrap();
    assert!(
        stored["spec"]["datacenters"]["azure-westeurope"]
            .get("network")
            .is_none(),
        "{stored}"
    );
}

#[tokio::test]
async fn a_wrong_network_is_refused_with_the_field_and_value() {
    let h = Harness::start().await;
    let cases = [
        (
            json!({"gateway": "192.168.1.2", "prefixLength": 24}),
            "spec.datacenters[azure-westeurope].network.gateway \"192.168.1.2\": lies inside poolCidr 192.168.1.0/26 and is not excluded",
        ),
        (
            json!({"gateway": "192.168.2.1", "prefixLength": 24}),
            "spec.datacenters[azure-westeurope].network.gateway \"192.168.2.1\": is not inside the network 192.168.1.0/24",
        ),
        (
            json!({"vlanId": 4095}),
            "spec.datacenters[azure-westeurope].network.vlanId \"4095\": must be between 0 and 4094",
        ),
        (
            json!({"mtu": 100000}),
            "spec.datacenters[azure-westeurope].network.mtu \"100000\": must be between 576 and 9216",
        ),
        (
            json!({"prefixLength": 27}),
            "spec.datacenters[azure-westeurope].network.prefixLength \"27\": must be between 0 and 26",
        ),
        (
            json!({"dnsServers": ["resolver"]}),
            "spec.datacenters[azure-westeurope].network.dnsServers[0] \"resolver\": is not an IP address",
        ),
        (json!({"vlan": 7}), "unknown field `vlan`"),
    ];
    for (network, expected) in cases {
        let mut pool = kkp_pool("bad");
        pool["datacenters"]["azure-westeurope"]["network"] = network.clone();
        let (status, body) = h.send("POST", POOLS, "admin", pool).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{network}: {body}");
        let message = error_of(status, &body);
        assert!(message.contains(expected), "{network}: {message}");
        assert!(h.api.get("ipampools", None, "bad").is_none());
    }
}

/// The network may change while clusters hold addresses: it changes none of them.
#[tokio::test]
async fn the_network_of_a_pool_with_allocations_may_change() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    h.allocation(
        r#"
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMAllocation
metadata: {name: metallb, namespace: cluster-c1, resourceVersion: "1"}
spec: {type: range, dc: dc-1, addresses: ["10.0.0.8-10.0.0.15"]}
"#,
    )
    .await;
    let path = format!("{POOLS}/metallb");
    for network in [
        json!({"gateway": "10.0.0.1", "vlanId": 10}),
        json!({"gateway": "10.0.255.254", "prefixLength": 16, "mtu": 1500}),
    ] {
        let (status, body) = h
            .send(
                "PATCH",
                &path,
                "admin",
                json!({"datacenters": {"dc-1": {"network": network}}}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    // Naming the held 10.0.0.9 as gateway is refused: it is not excluded, and cannot be.
    let (status, body) = h
        .send(
            "PATCH",
            &path,
            "admin",
            json!({"datacenters": {"dc-1": {"network": {"gateway": "10.0.0.9"}}}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(error_of(status, &body).contains("\"10.0.0.9\": lies inside poolCidr"));
}

#[tokio::test]
async fn the_openapi_document_describes_the_network() {
    let h = Harness::start().await;
    let (status, doc) = h.get("/api/v2/openapi.json", "reader").await;
    assert_eq!(status, StatusCode::OK);
    let network = &doc["components"]["schemas"]["Network"];
    let mut fields: Vec<&str> = network["properties"]
        .as_object()
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    fields.sort();
    assert_eq!(
        fields,
        ["dnsServers", "gateway", "mtu", "prefixLength", "vlanId"],
        "{network}"
    );
    assert_eq!(network["additionalProperties"], json!(false), "{network}");
    for view in ["DatacenterBody", "DatacenterView"] {
        let schema = doc["components"]["schemas"][view]["properties"]["network"].to_string();
        assert!(
            schema.contains("#/components/schemas/Network"),
            "{view}: {schema}"
        );
    }
}
