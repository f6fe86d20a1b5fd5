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
        Error::Api(s) if s.code == 403 => format!(
            "RBAC forbids `{verb}` on {resource}: grant kipam's service account that verb ({})",
            s.message
        ),
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
