//! The OpenAPI document against the router's routes and the answers actually served.

use std::collections::BTreeSet;

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::harness::*;

/// Resolves `#/components/schemas/X`.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("unexpected $ref {r}"));
            let target = &doc["components"]["schemas"][name];
            assert!(target.is_object(), "$ref {r} does not resolve");
            resolve(doc, target)
        }
        None => schema,
    }
}

/// A small validator for what schemars writes: `$ref`, `type`, `properties`, `required`,
/// `additionalProperties`, `items`, `enum`, `oneOf`/`anyOf`, `nullable`.
pub(super) fn check(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let schema = resolve(doc, schema);
    if value.is_null() && schema.get("nullable") == Some(&json!(true)) {
        return Ok(());
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            if options.iter().any(|o| check(doc, o, value, at).is_ok()) {
                return Ok(());
            }
            return Err(format!("{at}: {value} matches none of {key}"));
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        return Err(format!("{at}: {value} not in {allowed:?}"));
    }
    let kind = schema.get("type").and_then(Value::as_str);
    let ok = match kind {
        None => true,
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some(other) => return Err(format!("{at}: unknown type {other}")),
    };
    if !ok {
        return Err(format!("{at}: {value} is not {kind:?}"));
    }
    if let Some(items) = value.as_array() {
        let item_schema = schema
            .get("items")
            .ok_or(format!("{at}: array without items"))?;
        for (i, item) in items.iter().enumerate() {
            check(doc, item_schema, item, &format!("{at}[{i}]"))?;
        }
    }
    if let Some(map) = value.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        for req in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let req = req.as_str().unwrap();
            if !map.contains_key(req) {
                return Err(format!("{at}: required {req} missing"));
            }
        }
        for (k, v) in map {
            match props.and_then(|p| p.get(k)) {
                Some(s) => check(doc, s, v, &format!("{at}.{k}"))?,
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        return Err(format!("{at}: property {k} is not in the schema"));
                    }
                    Some(s @ Value::Object(_)) => check(doc, s, v, &format!("{at}.{k}"))?,
                    _ if props.is_some() => {
                        return Err(format!("{at}: property {k} is not in the schema"));
                    }
                    _ => {}
                },
            }
        }
    }
    Ok(())
}

pub(super) fn response_schema<'a>(
    doc: &'a Value,
    path: &str,
    method: &str,
    code: u16,
) -> &'a Value {
    let op = &doc["paths"][path][method];
    let schema = &op["responses"][code.to_string()]["content"]["application/json"]["schema"];
    assert!(
        schema.is_object(),
        "{method} {path} has no {code} JSON schema"
    );
    schema
}

#[test]
fn every_route_is_documented_and_every_documented_operation_is_routed() {
    let doc = kipam::api::openapi::document();
    assert_eq!(doc["openapi"], "3.0.3");
    let routed: BTreeSet<(String, String)> = kipam::api::routes()
        .into_iter()
        .map(|(m, p, _)| (m.as_str().to_lowercase(), p.to_string()))
        .collect();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let placeholders: BTreeSet<String> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(str::to_string)
            .collect();
        let params: BTreeSet<String> = item
            .get("parameters")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|p| {
                assert_eq!(p["in"], "path");
                assert_eq!(p["required"], true);
                p["name"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(placeholders, params, "parameters of {path}");
        for (method, op) in item.as_object().unwrap() {
            if method == "parameters" {
                continue;
            }
            documented.insert((method.clone(), path.clone()));
            assert!(op["operationId"].is_string(), "{method} {path}");
            let responses = op["responses"].as_object().unwrap();
            assert!(
                responses.contains_key("401"),
                "{method} {path} documents 401"
            );
            for (code, r) in responses {
                if let Some(s) = r.pointer("/content/application~1json/schema") {
                    // Every reference in the document resolves.
                    resolve(&doc, s);
                }
                assert!(r["description"].is_string(), "{method} {path} {code}");
            }
        }
    }
    assert_eq!(routed, documented);
}

#[tokio::test]
async fn every_documented_operation_reaches_its_route() {
    // Unauthenticated, each documented operation gets the API's 401 rather than the
    // fallback's 404 or 405: the document's paths and methods are the router's.
    let h = Harness::start().await;
    let doc = kipam::api::openapi::document();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path
            .replace("{seed_name}", SEED)
            .replace("{ipampool_name}", "metallb")
            .replace("{address}", "10.0.0.3")
            .replace("{prefix_length}", "24");
        for method in item
            .as_object()
            .unwrap()
            .keys()
            .filter(|m| *m != "parameters")
        {
            let (status, body) = h.call(&method.to_uppercase(), &concrete, None, None).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {body}");
        }
    }
}

#[tokio::test]
async fn served_answers_match_their_schemas() {
    let h = Harness::start().await;
    let doc = kipam::api::openapi::document();
    let (pools, pool, allocations) = (kipam::api::POOLS, kipam::api::POOL, kipam::api::ALLOCATIONS);

    // The request body schema takes KKP's body.
    let body_schema =
        &doc["paths"][pools]["post"]["requestBody"]["content"]["application/json"]["schema"];
    check(&doc, body_schema, &kkp_pool("metallb"), "body").unwrap();
    assert!(
        check(
            &doc,
            body_schema,
            &json!({"name": "x", "datacenters": {}, "extra": 1}),
            "body"
        )
        .is_err()
    );

    let (status, created) = h.send("POST", POOLS, "admin", kkp_pool("metallb")).await;
    assert_eq!(status, StatusCode::CREATED);
    check(
        &doc,
        response_schema(&doc, pools, "post", 201),
        &created,
        "created",
    )
    .unwrap();

    h.wait_cached("metallb", true).await;
    h.api
        .set_status(
            "ipampools",
            None,
            "metallb",
            json!({"datacenters": {"azure-westeurope": {
                "total": "64", "allocated": "8", "excluded": "4", "available": "52",
                "allocations": 1, "largestFreeBlock": "48", "fragmentationPercent": 7,
                "utilisationPercent": 13
            }}}),
        )
        .unwrap();
    let mut list = json!([]);
    for _ in 0..200 {
        list = h.get(POOLS, "admin").await.1;
        if list[0]["datacenters"]["azure-westeurope"]["usage"].is_object() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(list[0]["datacenters"]["azure-westeurope"]["usage"].is_object());
    check(
        &doc,
        response_schema(&doc, pools, "get", 200),
        &list,
        "list",
    )
    .unwrap();
    let (_, one) = h.get(&format!("{POOLS}/metallb"), "admin").await;
    check(&doc, response_schema(&doc, pool, "get", 200), &one, "get").unwrap();
    let (status, patched) = h
        .send(
            "PATCH",
            &format!("{POOLS}/metallb"),
            "admin",
            json!({"reclaimPolicy": "Retain"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    check(
        &doc,
        response_schema(&doc, pool, "patch", 200),
        &patched,
        "patch",
    )
    .unwrap();

    h.allocation("apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {name: metallb, namespace: cluster-a, labels: {ipam.kipam.dev/cluster: a}}\nspec: {type: prefix, dc: aws-eu-central-1a, cidr: 192.168.1.4/30}\nstatus: {phase: Allocated, message: fine}\n").await;
    let (_, allocs) = h
        .get(&format!("{POOLS}/metallb/allocations"), "admin")
        .await;
    assert_eq!(allocs.as_array().unwrap().len(), 1);
    check(
        &doc,
        response_schema(&doc, allocations, "get", 200),
        &allocs,
        "allocations",
    )
    .unwrap();

    // Errors, and a wrong value is caught by the check itself.
    let (status, error) = h.get(&format!("{POOLS}/none"), "admin").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    check(
        &doc,
        response_schema(&doc, pool, "get", 404),
        &error,
        "error",
    )
    .unwrap();
    let mut wrong = one.clone();
    wrong["datacenters"]["azure-westeurope"]["usage"]["total"] = json!(64);
    assert!(
        check(
            &doc,
            response_schema(&doc, pool, "get", 200),
            &wrong,
            "wrong"
        )
        .is_err()
    );

    // The document is served (to authenticated callers) as built.
    let (status, served) = h.get("/api/v2/openapi.json", "reader").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(served, doc);
}

#[test]
fn the_document_describes_additional_cidrs_and_the_usage_of_each_cidr() {
    let doc = kipam::api::openapi::document();
    let schemas = &doc["components"]["schemas"];
    for (schema, field) in [
        ("DatacenterBody", "additionalCidrs"),
        ("DatacenterView", "additionalCidrs"),
        ("UsageView", "cidrs"),
        ("CidrUsageView", "largestFreeBlock"),
    ] {
        assert!(
            schemas[schema]["properties"][field].is_object(),
            "{schema}.{field} in {}",
            schemas[schema]
        );
    }
}
