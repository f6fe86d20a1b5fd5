//! Validating admission webhooks: the stand-in calls the webhooks of the stored
//! `ValidatingWebhookConfiguration`s (admissionregistration.k8s.io/v1) on create, update,
//! patch and delete, as the real API server does after schema validation.
//!
//! Supported: `rules` (apiGroups, apiVersions, resources with `*` and `/sub` forms,
//! operations, scope), `matchConditions` (CEL over `object`, `oldObject`, `request`),
//! `clientConfig.url` with `caBundle` (the only CA trusted for the call), `timeoutSeconds`
//! (default 10), `failurePolicy` (default `Fail`). Not supported: `clientConfig.service`
//! (there is no cluster network: the call fails and the failure policy applies),
//! `namespaceSelector`, `objectSelector`, mutating webhooks, `matchPolicy` conversion.

use std::time::Duration;

use serde_json::{Value, json};

use crate::Shared;
use crate::error::ApiError;
use crate::https;
use crate::resources::ResourceType;
use crate::reviews::UserInfo;
use crate::util;

/// One webhook of one configuration.
#[derive(Clone, Debug)]
pub(crate) struct Hook {
    name: String,
    url: Option<String>,
    ca: Option<Vec<u8>>,
    timeout: Duration,
    fail: bool,
    conditions: Vec<(String, String)>,
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn listed(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

fn resource_listed(list: &[String], plural: &str, sub: Option<&str>) -> bool {
    list.iter().any(|pattern| {
        let (p_res, p_sub) = match pattern.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (pattern.as_str(), None),
        };
        let res_ok = p_res == "*" || p_res == plural;
        let sub_ok = match (p_sub, sub) {
            (None, None) => true,
            (Some("*"), _) => true,
            (Some(a), Some(b)) => a == b,
            _ => false,
        };
        res_ok && sub_ok
    })
}

fn rule_matches(rule: &Value, rt: &ResourceType, sub: Option<&str>, operation: &str) -> bool {
    let scope = rule.get("scope").and_then(Value::as_str).unwrap_or("*");
    let scope_ok = match scope {
        "Cluster" => !rt.namespaced,
        "Namespaced" => rt.namespaced,
        _ => true,
    };
    scope_ok
        && listed(&strings(rule, "apiGroups"), &rt.group)
        && listed(&strings(rule, "apiVersions"), &rt.version)
        && listed(&strings(rule, "operations"), operation)
        && resource_listed(&strings(rule, "resources"), &rt.plural, sub)
}

/// The webhooks whose rules select this request, in configuration-name order.
pub(crate) fn matching(
    shared: &Shared,
    rt: &ResourceType,
    sub: Option<&str>,
    operation: &str,
) -> Vec<Hook> {
    let configs = {
        let store = shared.lock_store();
        let Some(crt) = store
            .registry
            .lookup(
                "admissionregistration.k8s.io",
                "v1",
                "validatingwebhookconfigurations",
            )
            .cloned()
        else {
            return Vec::new();
        };
        store.objects_of(&crt, None)
    };
    let mut hooks = Vec::new();
    for config in &configs {
        for w in config
            .get("webhooks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let rules = w.get("rules").and_then(Value::as_array);
            if !rules
                .into_iter()
                .flatten()
                .any(|r| rule_matches(r, rt, sub, operation))
            {
                continue;
            }
            let client = w.get("clientConfig").cloned().unwrap_or(Value::Null);
            hooks.push(Hook {
                name: w
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                url: client
                    .get("url")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                ca: client
                    .get("caBundle")
                    .and_then(Value::as_str)
                    .and_then(util::base64_decode),
                timeout: Duration::from_secs(
                    w.get("timeoutSeconds")
                        .and_then(Value::as_u64)
                        .unwrap_or(10)
                        .clamp(1, 30),
                ),
                fail: w.get("failurePolicy").and_then(Value::as_str) != Some("Ignore"),
                conditions: w
                    .get("matchConditions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        (
                            c.get("name")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                            c.get("expression")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                        )
                    })
                    .collect(),
            });
        }
    }
    hooks
}

/// What is being admitted.
pub(crate) struct Attributes<'a> {
    pub rt: &'a ResourceType,
    pub sub: Option<&'a str>,
    pub operation: &'a str,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub object: Option<Value>,
    pub old_object: Option<Value>,
    pub user: UserInfo,
    pub dry_run: bool,
}

fn failed_call(hook: &Hook, why: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        500,
        format!(
            "Internal error occurred: failed calling webhook \"{}\": {why}",
            hook.name
        ),
    )
}

/// Calls every hook in turn; the first refusal (or failed call under `Fail`) is the answer.
pub(crate) async fn review(
    hooks: &[Hook],
    attrs: &Attributes<'_>,
    uid: &str,
) -> Result<(), ApiError> {
    let kind = json!({"group": attrs.rt.group, "version": attrs.rt.version, "kind": attrs.rt.kind});
    let resource =
        json!({"group": attrs.rt.group, "version": attrs.rt.version, "resource": attrs.rt.plural});
    let mut user = json!({"username": attrs.user.username, "groups": attrs.user.groups});
    if !attrs.user.uid.is_empty() {
        user["uid"] = json!(attrs.user.uid);
    }
    let mut request = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": attrs.name,
        "operation": attrs.operation,
        "userInfo": user,
        "object": attrs.object.clone().unwrap_or(Value::Null),
        "oldObject": attrs.old_object.clone().unwrap_or(Value::Null),
        "dryRun": attrs.dry_run,
    });
    if let Some(ns) = attrs.namespace {
        request["namespace"] = json!(ns);
    }
    if let Some(sub) = attrs.sub {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    let null = Value::Null;
    for hook in hooks {
        // As the real server: any condition false skips the webhook; otherwise an error in
        // one applies the failure policy; all true calls it.
        let mut selected = true;
        let mut error = None;
        for (name, expression) in &hook.conditions {
            let vars = [
                ("object", attrs.object.as_ref().unwrap_or(&null)),
                ("oldObject", attrs.old_object.as_ref().unwrap_or(&null)),
                ("request", &request),
            ];
            match crate::cel::evaluate_bool(expression, &vars) {
                Ok(true) => {}
                Ok(false) => selected = false,
                Err(e) => {
                    error.get_or_insert(format!("matchCondition {name}: {e}"));
                }
            }
        }
        if !selected {
            continue;
        }
        if let Some(e) = error {
            if hook.fail {
                return Err(failed_call(hook, e));
            }
            continue;
        }
        match call(hook, &request).await {
            Ok(None) => {}
            Ok(Some(denied)) => return Err(denied),
            Err(e) if hook.fail => return Err(e),
            Err(_) => {}
        }
    }
    Ok(())
}

/// One call: `Ok(None)` allowed, `Ok(Some(e))` refused with `e`, `Err` the call failed.
async fn call(hook: &Hook, request: &Value) -> Result<Option<ApiError>, ApiError> {
    let Some(url) = &hook.url else {
        return Err(failed_call(
            hook,
            "clientConfig.service is not supported by the stand-in (use clientConfig.url)",
        ));
    };
    let Some(ca) = &hook.ca else {
        return Err(failed_call(hook, "no caBundle to trust"));
    };
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request,
    });
    let body = serde_json::to_vec(&review).map_err(|e| failed_call(hook, e))?;
    let response = https::post(url, ca, "application/json", &body, hook.timeout)
        .await
        .map_err(|e| failed_call(hook, e))?;
    if response.status != 200 {
        return Err(failed_call(
            hook,
            format!(
                "the server responded with {}: {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            ),
        ));
    }
    let answer: Value = serde_json::from_slice(&response.body)
        .map_err(|e| failed_call(hook, format!("the response is not JSON: {e}")))?;
    let Some(r) = answer.get("response") else {
        return Err(failed_call(hook, "the AdmissionReview has no response"));
    };
    if r.get("uid") != request.get("uid") {
        return Err(failed_call(
            hook,
            "the response's uid does not match the request's",
        ));
    }
    if r.get("allowed").and_then(Value::as_bool) == Some(true) {
        return Ok(None);
    }
    let status = r.get("status").cloned().unwrap_or(Value::Null);
    let code = status
        .get("code")
        .and_then(Value::as_u64)
        .map(|c| c as u16)
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    let denied_by = format!("admission webhook \"{}\" denied the request", hook.name);
    let message = match (
        status.get("message").and_then(Value::as_str),
        status.get("reason").and_then(Value::as_str),
    ) {
        (Some(m), _) if !m.is_empty() => format!("{denied_by}: {m}"),
        (_, Some(r)) if !r.is_empty() => format!("{denied_by}: {r}"),
        _ => format!("{denied_by} without explanation"),
    };
    let mut e = ApiError::new(code, message);
    if let Some(reason) = status.get("reason").and_then(Value::as_str)
        && !reason.is_empty()
    {
        e.reason = reason.to_string();
    }
    Ok(Some(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_match_like_the_api_server() {
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(resource_listed(&l(&["pods"]), "pods", None));
        assert!(!resource_listed(&l(&["pods"]), "pods", Some("status")));
        assert!(resource_listed(
            &l(&["pods/status"]),
            "pods",
            Some("status")
        ));
        assert!(resource_listed(&l(&["*"]), "pods", None));
        assert!(!resource_listed(&l(&["*"]), "pods", Some("status")));
        assert!(resource_listed(&l(&["*/*"]), "pods", Some("status")));
        assert!(resource_listed(&l(&["pods/*"]), "pods", Some("log")));
        assert!(!resource_listed(&l(&["services"]), "pods", None));
    }
}
