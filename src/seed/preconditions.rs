//! Turns API errors into what an operator should do about them, and classifies errors for
//! retries and metrics (the error policy: transient errors are retried with capped backoff,
//! a refusal of our own write is reported where the user looks).

use kube::Error;

/// A short reason for metrics and conditions: `Conflict`, `NotFound`, `Invalid`, `Forbidden`,
/// `Unauthorized`, `TooManyRequests`, `ServerError`, `Timeout`, `Unreachable`, `Other`.
pub fn reason(e: &Error) -> &'static str {
    match e {
        Error::Api(s) => match s.code {
            409 => "Conflict",
            404 => "NotFound",
            422 | 400 => "Invalid",
            403 => "Forbidden",
            401 => "Unauthorized",
            429 => "TooManyRequests",
            504 => "Timeout",
            500..=599 => "ServerError",
            _ => "Other",
        },
        Error::HyperError(_) | Error::Service(_) => {
            let text = e.to_string().to_ascii_lowercase();
            if text.contains("timed out") || text.contains("timeout") || text.contains("elapsed") {
                "Timeout"
            } else {
                "Unreachable"
            }
        }
        _ => "Other",
    }
}

/// True when the same request may succeed later without anything changing on our side.
pub fn is_transient(e: &Error) -> bool {
    matches!(
        reason(e),
        "TooManyRequests" | "ServerError" | "Timeout" | "Unreachable" | "Conflict"
    )
}

/// An error in one line for a log field: the API server's message, code and reason, never
/// kube's rendering of the whole `Status` (a `Debug` dump of a struct).
pub fn short(e: &Error) -> String {
    match e {
        Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        other => other.to_string(),
    }
}

/// What the `OwnerReferencesPermissionEnforcement` plugin says when an owner's finalizers may
/// not be updated.
const BLOCK_OWNER_DELETION: &str = "cannot set blockOwnerDeletion";
/// …and when the object itself may not be deleted (an update changing owner references).
const OWNER_REF_NEEDS_DELETE: &str = "cannot set an ownerRef on a resource you can't delete";

/// The verb, resource (with its subresource) and group an authoriser's refusal names:
/// `… User "u" cannot update resource "ipaddressclaims/finalizers" in API group "g" …`.
fn refused_permission(message: &str) -> Option<(&str, &str, &str)> {
    let rest = &message[message.find("\" cannot ")? + "\" cannot ".len()..];
    let (verb, rest) = rest.split_once(" resource \"")?;
    let (resource, rest) = rest.split_once("\" in API group \"")?;
    let (group, _) = rest.split_once('"')?;
    Some((verb, resource, group))
}

/// What to do about a failed `verb` on `resource` (`name` for messages), in one line.
pub fn explain(e: &Error, verb: &str, resource: &str, name: &str) -> String {
    match e {
        Error::Api(s) if s.code == 404 && resource.ends_with(".ipam.kipam.dev") => format!(
            "the CustomResourceDefinition {resource} is not installed (or is of an older \
             version): install kipam's CRDs with `kubectl apply -f crds/`"
        ),
        Error::Api(s) if s.code == 404 && resource == "leases" => format!(
            "the namespace of the Lease {name} does not exist: create it, or pass --namespace \
             with an existing one ({})",
            s.message
        ),
        // The API server's NamespaceLifecycle admission, not RBAC: the namespace is going.
        Error::Api(s) if s.code == 403 && s.message.contains("because it is being terminated") => {
            format!(
                "{verb} {resource} {name}: its namespace is being deleted, and nothing can be \
                 created in it until it is gone ({})",
                s.message
            )
        }
        // The OwnerReferencesPermissionEnforcement admission plugin: what is missing is
        // `update` on the owners' finalizers (or `delete` on the object), not `verb`.
        Error::Api(s) if s.code == 403 && s.message.contains(BLOCK_OWNER_DELETION) => {
            let owners: Vec<String> = crate::rbac::blocking_owners(resource)
                .iter()
                .map(|(group, plural)| format!("`update` on `{plural}/finalizers` ({group})"))
                .collect();
            let grant = if owners.is_empty() {
                "`update` on the finalizers of the owners it sets blockOwnerDeletion on".to_string()
            } else {
                owners.join(" and ")
            };
            format!(
                "{verb} {resource} {name}: the API server lets only who may update an owner's \
                 finalizers set blockOwnerDeletion on its owner references \
                 (OwnerReferencesPermissionEnforcement): grant kipam's service account {grant} \
                 ({})",
                s.message
            )
        }
        Error::Api(s) if s.code == 403 && s.message.contains(OWNER_REF_NEEDS_DELETE) => format!(
            "{verb} {resource} {name}: the API server lets only who may delete an object change \
             its owner references (OwnerReferencesPermissionEnforcement): grant kipam's service \
             account `delete` on it ({})",
            s.message
        ),
        Error::Api(s) if s.code == 403 => match refused_permission(&s.message) {
            Some((verb, resource, group)) => format!(
                "RBAC forbids `{verb}` on `{resource}` (API group \"{group}\"): grant kipam's \
                 service account that verb ({})",
                s.message
            ),
            None => format!(
                "RBAC forbids `{verb}` on {resource}: grant kipam's service account that verb \
                 ({})",
                s.message
            ),
        },
        Error::Api(s) if s.code == 401 => format!(
            "the API server does not accept kipam's credentials: check the kubeconfig or the \
             service account token ({})",
            s.message
        ),
        Error::Api(s) => format!(
            "{verb} {resource} {name} failed: {} ({} {})",
            s.message, s.code, s.reason
        ),
        _ => format!("{verb} {resource} {name} failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> Error {
        Error::Api(
            kube::core::Status::failure("boom", "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn a_short_error_is_one_line_without_the_status_struct() {
        let e = api(404);
        assert!(e.to_string().contains("Status {"), "{e}");
        let line = short(&e);
        assert_eq!(line, "boom (404 Reason)");
    }

    #[test]
    fn reasons_and_hints() {
        assert_eq!(reason(&api(409)), "Conflict");
        assert_eq!(reason(&api(422)), "Invalid");
        assert!(is_transient(&api(503)));
        assert!(!is_transient(&api(422)));
        assert!(
            explain(&api(404), "list", "ipampools.ipam.kipam.dev", "")
                .contains("kubectl apply -f crds/")
        );
        assert!(
            explain(&api(403), "list", "clusters.ipam.kipam.dev", "")
                .contains("RBAC forbids `list`")
        );
    }

    fn forbidden(message: &str) -> Error {
        Error::Api(
            kube::core::Status::failure(message, "Forbidden")
                .with_code(403)
                .boxed(),
        )
    }

    #[test]
    fn a_refused_block_owner_deletion_names_the_owners_finalizers() {
        let e = forbidden(
            "ipaddresses.ipam.cluster.x-k8s.io \"m-1\" is forbidden: cannot set \
             blockOwnerDeletion if an ownerReference refers to a resource you can't set \
             finalizers on: , <nil>",
        );
        let message = explain(&e, "create", "IPAddress", "machines/m-1");
        assert!(!message.contains("`create`"), "{message}");
        assert!(
            message.contains(
                "grant kipam's service account `update` on `ipaddressclaims/finalizers` \
                 (ipam.cluster.x-k8s.io) and `update` on `ipampools/finalizers` (ipam.kipam.dev)"
            ),
            "{message}"
        );
        let message = explain(&e, "create", "Namespace", "cluster-a");
        assert!(
            message.contains("`update` on `clusters/finalizers` (ipam.kipam.dev)"),
            "{message}"
        );
        let e = forbidden(
            "ipampoolrecords.ipam.kipam.dev \"r\" is forbidden: cannot set an ownerRef on a \
             resource you can't delete: , <nil>",
        );
        let message = explain(&e, "patch", "IPAMPoolRecord", "r");
        assert!(message.contains("`delete` on it"), "{message}");
    }

    #[test]
    fn an_rbac_refusal_names_the_permission_the_server_names() {
        let e = forbidden(
            "clusters.ipam.kipam.dev \"a\" is forbidden: User \"system:serviceaccount:k:k\" \
             cannot patch resource \"clusters/status\" in API group \"ipam.kipam.dev\" at the \
             cluster scope",
        );
        let message = explain(&e, "write", "Cluster", "a");
        assert!(
            message.starts_with(
                "RBAC forbids `patch` on `clusters/status` (API group \"ipam.kipam.dev\")"
            ),
            "{message}"
        );
    }

    #[test]
    fn a_terminating_namespace_is_not_blamed_on_rbac() {
        let e = Error::Api(
            kube::core::Status::failure(
                "ipamallocations.ipam.kipam.dev \"metallb\" is forbidden: unable to create new \
                 content in namespace cluster-alpha because it is being terminated",
                "Forbidden",
            )
            .with_code(403)
            .boxed(),
        );
        let message = explain(&e, "create", "IPAMAllocation", "cluster-alpha/metallb");
        assert!(!message.contains("RBAC"), "{message}");
        assert!(
            message.starts_with(
                "create IPAMAllocation cluster-alpha/metallb: its namespace is being deleted"
            ),
            "{message}"
        );
        assert_eq!(reason(&e), "Forbidden");
    }
}
