//! The OpenAPI 3 document of the API, served at `/api/v2/openapi.json`. Paths are written
//! here by hand; the schemas come from the model types, so they cannot drift from what is
//! served. A test walks [`super::routes`] and this document and fails on any difference.

use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use super::error::ErrorBody;
use super::model::{AllocationView, PoolBody, PoolView};

fn error(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    })
}

fn ok(description: &str, schema: &Value) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema}}})
}

fn param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "description": description,
           "schema": {"type": "string"}})
}

/// The errors every authenticated route can answer.
fn common_errors(mut responses: serde_json::Map<String, Value>) -> Value {
    for (code, text) in [
        ("400", "invalid path, body or unknown seed name"),
        ("401", "missing, invalid or anonymous bearer token"),
        ("403", "RBAC does not allow the request"),
        ("429", "too many requests in flight"),
        ("502", "the API server refused kipam's own request"),
        (
            "503",
            "the API server cannot be reached, or the request timed out",
        ),
    ] {
        responses.entry(code).or_insert_with(|| error(text));
    }
    Value::Object(responses)
}

fn responses(list: Value) -> Value {
    match list {
        Value::Object(map) => common_errors(map),
        _ => common_errors(serde_json::Map::new()),
    }
}

/// The whole document (built once).
pub fn document() -> Value {
    static DOCUMENT: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    DOCUMENT.get_or_init(build).clone()
}

fn build() -> Value {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let pool = generator.subschema_for::<PoolView>().to_value();
    let body = generator.subschema_for::<PoolBody>().to_value();
    let allocation = generator.subschema_for::<AllocationView>().to_value();
    let lookup = generator
        .subschema_for::<crate::page::view::LookupView>()
        .to_value();
    let adoption = generator
        .subschema_for::<crate::page::adoption::AdoptionFleet>()
        .to_value();
    generator.subschema_for::<ErrorBody>();
    let schemas = generator.take_definitions(true);

    let seed = param(
        "seed_name",
        "the seed's name (kipam controller --seed-name)",
    );
    let name = param("ipampool_name", "the pool's name");
    let address = param(
        "address",
        "an IP address (10.1.2.3, 2001:db8::1) or a CIDR with its slash encoded (10.1.2.0%2F24)",
    );
    let prefix_length = param(
        "prefix_length",
        "the CIDR's prefix length (10.1.2.0/24 → 24)",
    );
    let lookup_responses = || {
        responses(json!({
            "200": ok("the pool datacenters whose CIDR meets the query, with who holds it (no match: an empty list)", &lookup),
        }))
    };
    let pool_body = json!({"required": true, "content": {"application/json": {"schema": body}}});
    let patch_body = json!({"required": true, "content": {
        "application/merge-patch+json": {"schema": {"type": "object"}},
        "application/json": {"schema": {"type": "object"}}
    }});
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "kipam seed API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "IPAM pools of one seed, in KKP's model, with kipam's own fields and usage."
        },
        "security": [{"bearer": []}],
        "paths": {
            super::POOLS: {
                "parameters": [seed],
                "get": {
                    "operationId": "listIPAMPools",
                    "summary": "List the seed's pools (from the controller's cache)",
                    "responses": responses(json!({
                        "200": ok("the pools, by name", &json!({"type": "array", "items": pool})),
                    })),
                },
                "post": {
                    "operationId": "createIPAMPool",
                    "summary": "Create a pool (validated as `kipam validate` does)",
                    "requestBody": pool_body,
                    "responses": responses(json!({
                        "201": ok("the pool as created", &pool),
                        "409": error("a pool of that name exists"),
                        "413": error("the body is too large"),
                    })),
                },
            },
            super::POOL: {
                "parameters": [seed, name],
                "get": {
                    "operationId": "getIPAMPool",
                    "summary": "One pool with its usage per datacenter",
                    "responses": responses(json!({
                        "200": ok("the pool", &pool),
                        "404": error("no such pool"),
                    })),
                },
                "patch": {
                    "operationId": "patchIPAMPool",
                    "summary": "Change a pool with a JSON merge patch (RFC 7396); fields the patch does not name are kept",
                    "requestBody": patch_body,
                    "responses": responses(json!({
                        "200": ok("the pool as changed", &pool),
                        "404": error("no such pool"),
                        "409": error("the pool changed meanwhile; read it again"),
                        "413": error("the body is too large"),
                    })),
                },
                "delete": {
                    "operationId": "deleteIPAMPool",
                    "summary": "Delete a pool (its allocations follow its reclaimPolicy)",
                    "responses": responses(json!({
                        "200": {"description": "deletion accepted"},
                        "404": error("no such pool"),
                        "409": error("a conflict on the API server"),
                    })),
                },
            },
            super::ALLOCATIONS: {
                "parameters": [seed, name],
                "get": {
                    "operationId": "listIPAMPoolAllocations",
                    "summary": "The pool's allocations, per datacenter and cluster",
                    "responses": responses(json!({
                        "200": ok("the allocations", &json!({"type": "array", "items": allocation})),
                        "404": error("no such pool"),
                    })),
                },
            },
            super::ADDRESS: {
                "parameters": [seed, address],
                "get": {
                    "operationId": "lookupAddress",
                    "summary": "Who holds an address or a CIDR, in which pool and datacenter, or that it is free or excluded (from the controller's caches)",
                    "responses": lookup_responses(),
                },
            },
            super::ADDRESS_CIDR: {
                "parameters": [seed, address, prefix_length],
                "get": {
                    "operationId": "lookupCIDR",
                    "summary": "The same lookup for a CIDR written with its slash (10.1.2.0/24)",
                    "responses": lookup_responses(),
                },
            },
            super::ADOPTION: {
                "parameters": [seed],
                "get": {
                    "operationId": "getAdoption",
                    "summary": "The whole fleet's adoption plan (spec.adopt): per cluster what its user cluster serves, each address's verdict, hand-made MetalLB pools, conflicts and what it adopts, with figures (from the Clusters' status.adoption in the controller's cache)",
                    "parameters": [{"name": "datacenter", "in": "query", "required": false,
                        "description": "only the clusters of this datacenter (the summary counts only them)",
                        "schema": {"type": "string"}}],
                    "responses": responses(json!({
                        "200": ok("the clusters that adopt (adopt DryRun or Adopt), by name; none: an empty list", &adoption),
                    })),
                },
            },
            super::OPENAPI: {
                "get": {
                    "operationId": "getOpenAPIDocument",
                    "summary": "This document (any authenticated user)",
                    "responses": {
                        "200": {"description": "the OpenAPI document", "content": {"application/json": {"schema": {"type": "object"}}}},
                        "401": error("missing, invalid or anonymous bearer token"),
                    },
                },
            },
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A Kubernetes token of the seed, checked with a TokenReview; access by RBAC on ipampools.ipam.kipam.dev (and list ipamallocations for the allocations and address routes, list clusters for the adoption route)."
                }
            }
        }
    })
}
