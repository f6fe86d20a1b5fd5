//! RBAC and the `OwnerReferencesPermissionEnforcement` plugin, driven with a real kube client
//! authenticated as a service account: what is allowed, what is refused, and the refusals'
//! exact words (those of a real kube-apiserver).

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::Discovery;
use kube::{Client, Config};
use kube_standin::ApiServer;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const SA: &str = "system:serviceaccount:apps:robot";

async fn client_with(server: &ApiServer, token: &str) -> Client {
    let kc = Kubeconfig::from_yaml(&server.kubeconfig_yaml_for_token(token)).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

fn status(e: kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("not an API error: {other}"),
    }
}

fn cm(name: &str, owners: Value) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "ownerReferences": owners},
        "data": {"k": "v"},
    }))
    .expect("configmap")
}

/// A server with RBAC on, the namespaces `apps` and `other`, and the robot's token.
async fn setup() -> (ApiServer, Client, Client) {
    let server = ApiServer::start().await.expect("stand-in");
    for ns in ["apps", "other"] {
        server
            .apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .expect("namespace");
    }
    server.enable_rbac();
    let token = server.service_account_token("apps", "robot");
    let robot = client_with(&server, &token).await;
    let admin = client_with(&server, &server.token()).await;
    (server, admin, robot)
}

fn grant(server: &ApiServer, yaml: &str) {
    server.apply_yaml(yaml).expect("RBAC objects apply");
}

#[tokio::test]
async fn requests_are_decided_by_the_stored_roles_and_bindings() -> TestResult {
    let (server, admin, robot) = setup().await;
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "apps");
    admin_cms
        .create(&PostParams::default(), &cm("a", json!([])))
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(robot.clone(), "apps");

    // Nothing granted: refused with the real words, the object's name included.
    let (code, reason, message) = status(cms.get("a").await.unwrap_err());
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        format!(
            "configmaps \"a\" is forbidden: User \"{SA}\" cannot get resource \"configmaps\" in \
             API group \"\" in the namespace \"apps\""
        )
    );
    let (_, _, message) = status(cms.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(
        message,
        format!(
            "configmaps is forbidden: User \"{SA}\" cannot list resource \"configmaps\" in API \
             group \"\" in the namespace \"apps\""
        )
    );
    // Discovery is every authenticated user's (the bootstrap roles).
    Discovery::new(robot.clone()).run().await?;

    // A ClusterRole bound in one namespace only by a RoleBinding, to the service account.
    grant(
        &server,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cm-reader}
rules:
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get", "list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: robot-reads, namespace: apps}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cm-reader}
subjects:
  - {kind: ServiceAccount, name: robot, namespace: apps}
"#,
    );
    assert_eq!(cms.get("a").await?.data.unwrap()["k"], "v");
    let other: Api<ConfigMap> = Api::namespaced(robot.clone(), "other");
    assert_eq!(
        status(other.list(&ListParams::default()).await.unwrap_err()).0,
        403
    );
    // Not the status subresource, not a write.
    let (code, _, message) = status(
        cms.create(&PostParams::default(), &cm("b", json!([])))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("cannot create resource \"configmaps\""),
        "{message}"
    );

    // A Role with resourceNames narrows by name; a group subject works too.
    grant(
        &server,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: patch-a, namespace: apps}
rules:
  - apiGroups: [""]
    resources: ["configmaps"]
    resourceNames: ["a"]
    verbs: ["patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: sas-patch-a, namespace: apps}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: patch-a}
subjects:
  - {kind: Group, name: "system:serviceaccounts:apps"}
"#,
    );
    let change = Patch::Merge(json!({"data": {"k": "w"}}));
    cms.patch("a", &PatchParams::default(), &change).await?;
    admin_cms
        .create(&PostParams::default(), &cm("c", json!([])))
        .await?;
    assert_eq!(
        status(
            cms.patch("c", &PatchParams::default(), &change)
                .await
                .unwrap_err()
        )
        .0,
        403
    );

    // A binding to a role that does not exist grants nothing and says so.
    grant(
        &server,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: robot-missing}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nope}
subjects:
  - {kind: ServiceAccount, name: robot, namespace: apps}
"#,
    );
    let (_, _, message) = status(cms.delete("a", &Default::default()).await.unwrap_err());
    assert!(
        message.ends_with(
            "in the namespace \"apps\": RBAC: clusterrole.rbac.authorization.k8s.io \"nope\" not found"
        ),
        "{message}"
    );

    // Access reviews are answered by RBAC too.
    let sars: Api<SubjectAccessReview> = Api::all(admin.clone());
    let ask = |verb: &str, ns: &str| SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(SA.into()),
            groups: Some(vec!["system:serviceaccounts:apps".into()]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                resource: Some("configmaps".into()),
                namespace: Some(ns.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let yes = sars
        .create(&PostParams::default(), &ask("list", "apps"))
        .await?;
    let yes = yes.status.unwrap();
    assert!(yes.allowed);
    assert_eq!(
        yes.reason.as_deref(),
        Some(
            "RBAC: allowed by RoleBinding \"robot-reads/apps\" of ClusterRole \"cm-reader\" to \
             ServiceAccount \"apps/robot\""
        )
    );
    let no = sars
        .create(&PostParams::default(), &ask("list", "other"))
        .await?;
    assert!(!no.status.unwrap().allowed);
    Ok(())
}

#[tokio::test]
async fn subresources_and_wildcards() -> TestResult {
    let (server, _admin, robot) = setup().await;
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(robot.clone());
    // `*/status` allows the status of anything, not the object.
    grant(
        &server,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: statuses}
rules:
  - apiGroups: ["*"]
    resources: ["*/status"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: robot-statuses}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: statuses}
subjects:
  - {kind: User, name: "system:serviceaccount:apps:robot"}
"#,
    );
    ns.get_status("apps").await?;
    let (_, _, message) = status(ns.get("apps").await.unwrap_err());
    assert_eq!(
        message,
        format!(
            "namespaces \"apps\" is forbidden: User \"{SA}\" cannot get resource \"namespaces\" \
             in API group \"\" at the cluster scope"
        )
    );
    let (_, _, message) = status(
        ns.patch_status("apps", &PatchParams::default(), &Patch::Merge(json!({})))
            .await
            .unwrap_err(),
    );
    assert!(
        message.contains("cannot patch resource \"namespaces/status\""),
        "{message}"
    );
    Ok(())
}

#[tokio::test]
async fn block_owner_deletion_needs_update_on_the_owners_finalizers() -> TestResult {
    let (server, admin, robot) = setup().await;
    server.enable_owner_references_permission_enforcement();
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "apps");
    let owner = admin_cms
        .create(&PostParams::default(), &cm("owner", json!([])))
        .await?;
    let uid = owner.metadata.uid.unwrap();
    grant(
        &server,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: cms, namespace: apps}
rules:
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get", "create", "update", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: cms, namespace: apps}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: cms}
subjects:
  - {kind: ServiceAccount, name: robot, namespace: apps}
"#,
    );
    let cms: Api<ConfigMap> = Api::namespaced(robot.clone(), "apps");
    let owned = |block: bool| {
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid,
                "blockOwnerDeletion": block}])
    };
    // Owner references without blockOwnerDeletion need nothing more on create.
    cms.create(&PostParams::default(), &cm("plain", owned(false)))
        .await?;
    // blockOwnerDeletion: refused with the plugin's words.
    let (code, reason, message) = status(
        cms.create(&PostParams::default(), &cm("blocking", owned(true)))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        "configmaps \"blocking\" is forbidden: cannot set blockOwnerDeletion if an \
         ownerReference refers to a resource you can't set finalizers on: , <nil>"
    );
    assert!(server.get("configmaps", Some("apps"), "blocking").is_none());
    // Changing owner references on update needs delete on the object itself.
    let (_, _, message) = status(
        cms.patch(
            "plain",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": owned(true)}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        message,
        "configmaps \"plain\" is forbidden: cannot set an ownerRef on a resource you can't \
         delete: , <nil>"
    );
    // An owner kind nobody serves.
    let (_, _, message) = status(
        cms.create(
            &PostParams::default(),
            &cm(
                "stray",
                json!([{"apiVersion": "example.com/v1", "kind": "Thing", "name": "t",
                        "uid": "u-1", "blockOwnerDeletion": true}]),
            ),
        )
        .await
        .unwrap_err(),
    );
    assert!(
        message.contains(
            "cannot find RESTMapping for APIVersion example.com/v1 Kind Thing: no matches for \
             kind \"Thing\" in version \"example.com/v1\""
        ),
        "{message}"
    );

    // Granted update on configmaps/finalizers (and delete): both go through.
    grant(
        &server,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: cms, namespace: apps}
rules:
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get", "create", "update", "patch", "delete"]
  - apiGroups: [""]
    resources: ["configmaps/finalizers"]
    verbs: ["update"]
"#,
    );
    cms.create(&PostParams::default(), &cm("blocking", owned(true)))
        .await?;
    cms.patch(
        "plain",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"ownerReferences": owned(true)}})),
    )
    .await?;
    // A write that leaves the references as they are is not looked at.
    cms.patch(
        "blocking",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "x"}})),
    )
    .await?;
    Ok(())
}
