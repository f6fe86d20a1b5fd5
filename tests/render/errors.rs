//! The messages a template author sees, exactly: each names the addon, the file and line, and
//! the cause. The broken addons live under `tests/render/fixtures/`.

use std::path::Path;

use kipam::render::{RenderError, Renderer, TemplateData};
use serde_json::json;

use super::{cluster, range};

const BROKEN: &str = "tests/render/fixtures/broken";

fn broken() -> Renderer {
    let root = Path::new(BROKEN);
    match Renderer::load(&root.join("addons"), &root.join("templates")) {
        Ok(renderer) => renderer,
        Err(err) => panic!("the broken fixtures must load (they fail when rendered): {err}"),
    }
}

/// A cluster with a `metallb` range allocation.
fn data() -> TemplateData {
    TemplateData::new(
        cluster("alpha", "dc-1")
            .with_allocation("metallb", range("dc-1", &["192.168.1.0-192.168.1.7"])),
    )
}

fn render_error(addon: &str, data: &TemplateData) -> RenderError {
    match broken().render(addon, data) {
        Ok(rendered) => panic!("{addon} rendered: {}", rendered.to_yaml()),
        Err(err) => err,
    }
}

fn load_error(root: &str) -> String {
    let root = Path::new(root);
    match Renderer::load(&root.join("addons"), &root.join("templates")) {
        Ok(_) => panic!("{} loaded", root.display()),
        Err(err) => err.to_string(),
    }
}

#[test]
fn a_typo_names_the_misspelled_key() {
    let err = render_error("typo", &data());
    assert_eq!(
        err.to_string(),
        "addon typo: tests/render/fixtures/broken/addons/typo/10_pool.yaml:9: \
         `Cluster.Network.IPAMAlocations` is undefined"
    );
    assert!(matches!(err, RenderError::Template { line: Some(9), .. }));
}

#[test]
fn an_undefined_key_names_what_is_missing() {
    // The cluster has no `metallb` allocation and the template does not check for one.
    let data = TemplateData::new(cluster("beta", "dc-1"));
    assert_eq!(
        render_error("undefined-key", &data).to_string(),
        "addon undefined-key: tests/render/fixtures/broken/addons/undefined-key/10_pool.yaml:9: \
         `Cluster.Network.IPAMAllocations.metallb` is undefined"
    );
}

#[test]
fn an_undefined_variable_is_an_error_not_an_empty_field() {
    let renderer = match Renderer::from_memory(
        &[(
            "vars/10_cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n  namespace: {{ Variables.namespace }}\n",
        )],
        &[],
    ) {
        Ok(renderer) => renderer,
        Err(err) => panic!("{err}"),
    };
    let err = match renderer.render("vars", &data()) {
        Ok(rendered) => panic!("rendered: {}", rendered.to_yaml()),
        Err(err) => err.to_string(),
    };
    assert_eq!(
        err,
        "addon vars: vars/10_cm.yaml:5: `Variables.namespace` is undefined"
    );
    let ok = renderer.render(
        "vars",
        &data().with_variable("namespace", json!("kube-system")),
    );
    assert!(ok.is_ok());
}

#[test]
fn a_runaway_loop_runs_out_of_fuel() {
    let err = render_error("runaway", &data());
    assert_eq!(
        err.to_string(),
        "addon runaway: tests/render/fixtures/broken/addons/runaway/10_loop.yaml:8: \
         the template ran out of fuel after 1000000 instructions (a runaway loop?)"
    );
    assert!(matches!(
        err,
        RenderError::OutOfFuel {
            fuel: 1_000_000,
            ..
        }
    ));
}

#[test]
fn the_fuel_limit_can_be_changed() {
    let renderer = broken().with_fuel(50_000);
    let err = match renderer.render("runaway", &data()) {
        Ok(_) => panic!("rendered"),
        Err(err) => err,
    };
    assert!(
        matches!(err, RenderError::OutOfFuel { fuel: 50_000, .. }),
        "{err}"
    );
}

#[test]
fn a_misspelled_filter_is_named() {
    assert_eq!(
        render_error("unknown-filter", &data()).to_string(),
        "addon unknown-filter: tests/render/fixtures/broken/addons/unknown-filter/10_pool.yaml:6: \
         unknown filter: filter netmsk is unknown"
    );
}

#[test]
fn a_mistake_in_a_shared_macro_names_the_macro_file_and_the_addon_file() {
    assert_eq!(
        render_error("macro-error", &data()).to_string(),
        "addon macro-error: tests/render/fixtures/broken/templates/helpers.jinja:3 \
         (rendering tests/render/fixtures/broken/addons/macro-error/10_pool.yaml): \
         `allocation.Adresses` is undefined"
    );
}

#[test]
fn output_that_is_not_yaml_shows_the_rendered_line() {
    let err = render_error("bad-yaml", &data());
    assert_eq!(
        err.to_string(),
        "addon bad-yaml: tests/render/fixtures/broken/addons/bad-yaml/10_pool.yaml: \
         the rendered output is not valid YAML: unclosed bracket '[' \
         (rendered line 6: \"  addresses: [192.168.1.0-192.168.1.7\")"
    );
}

#[test]
fn a_document_that_is_not_an_object_is_refused() {
    assert_eq!(
        render_error("not-an-object", &data()).to_string(),
        "addon not-an-object: tests/render/fixtures/broken/addons/not-an-object/10_list.yaml: \
         rendered document 2 is a list, not a Kubernetes object (a mapping with apiVersion, kind and metadata)"
    );
}

#[test]
fn objects_need_api_version_kind_and_name() {
    for (source, message) in [
        (
            "kind: ConfigMap\nmetadata:\n  name: x\n",
            "rendered document 1 has no apiVersion",
        ),
        (
            "apiVersion: v1\nmetadata:\n  name: x\n",
            "rendered document 1 has no kind",
        ),
        (
            "apiVersion: v1\nkind: 7\n",
            "rendered document 1 has a number as kind, expected a non-empty string",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\n",
            "rendered document 1 (kind ConfigMap) has no metadata.name",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  labels: [a]\n",
            "rendered document 1 (kind ConfigMap) has metadata.labels that are not a mapping",
        ),
    ] {
        let renderer = match Renderer::from_memory(&[("obj/10_x.yaml", source)], &[]) {
            Ok(renderer) => renderer,
            Err(err) => panic!("{err}"),
        };
        let err = match renderer.render("obj", &data()) {
            Ok(_) => panic!("{source:?} rendered"),
            Err(err) => err.to_string(),
        };
        assert_eq!(err, format!("addon obj: obj/10_x.yaml: {message}"));
    }
}

#[test]
fn a_syntax_error_fails_loading_with_file_and_line() {
    assert_eq!(
        load_error("tests/render/fixtures/syntax-error"),
        "tests/render/fixtures/syntax-error/addons/metallb/10_pool.yaml:9: \
         syntax error: unexpected end of variable block, expected identifier"
    );
}

#[test]
fn a_syntax_error_in_a_shared_template_fails_loading() {
    assert_eq!(
        load_error("tests/render/fixtures/macro-syntax-error"),
        "tests/render/fixtures/macro-syntax-error/templates/helpers.jinja:6: \
         syntax error: unknown statement endmacro"
    );
}

#[test]
fn an_unknown_addon_lists_the_known_ones() {
    let err = match super::shipped().render("metalb", &data()) {
        Ok(_) => panic!("rendered"),
        Err(err) => err.to_string(),
    };
    assert_eq!(err, "unknown addon \"metalb\" (known addons: metallb)");
}

#[test]
fn layout_problems_are_reported() {
    assert_eq!(
        match Renderer::load(Path::new("no-such-dir"), Path::new("templates")) {
            Ok(_) => panic!("loaded"),
            Err(err) => err.to_string(),
        },
        format!(
            "--addons-dir no-such-dir: no such directory (looked in {})",
            std::env::current_dir()
                .unwrap_or_default()
                .join("no-such-dir")
                .display()
        )
    );
    assert_eq!(
        match Renderer::load(Path::new("tests/render/fixtures"), Path::new("templates")) {
            Ok(_) => panic!("loaded"),
            Err(err) => err.to_string(),
        },
        "tests/render/fixtures/broken: the addon directory holds no *.yaml templates"
    );
    assert_eq!(
        match Renderer::from_memory(&[("x/a.yaml", "a: 1")], &[("x/a.yaml", "")]) {
            Ok(_) => panic!("loaded"),
            Err(err) => err.to_string(),
        },
        "x/a.yaml: its template name \"x/a.yaml\" is already taken by x/a.yaml"
    );
}

#[test]
fn addon_names_are_listed_sorted() {
    assert_eq!(
        broken().addon_names(),
        [
            "bad-yaml",
            "macro-error",
            "not-an-object",
            "runaway",
            "typo",
            "undefined-key",
            "unknown-filter"
        ]
    );
}
