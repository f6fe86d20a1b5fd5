//! The size bound: a rendered addon, and a string kipam's filters build, cannot grow past
//! `--max-addon-size`; the default lets real addons through.

use kipam::render::{ClusterData, DEFAULT_MAX_OUTPUT, RenderError, Renderer, TemplateData};

fn renderer(source: &str) -> Renderer {
    match Renderer::from_memory(&[("big/10_big.yaml", source)], &[]) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

fn data() -> TemplateData {
    TemplateData::new(ClusterData::new("alpha", "dc-1"))
}

/// A ConfigMap with `n` entries of 100 bytes.
const MANY: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n\
{% for i in range(Variables.n) %}  k{{ i }}: \"{{ 'x' * 100 }}\"\n{% endfor %}";

fn with_n(n: i64) -> TemplateData {
    let mut d = data();
    d.variables.insert("n".into(), n.into());
    d
}

#[test]
fn default_bound_is_four_mib_and_lets_real_addons_through() {
    assert_eq!(DEFAULT_MAX_OUTPUT, 4 * 1024 * 1024);
    let r = renderer(MANY);
    assert_eq!(r.max_output(), DEFAULT_MAX_OUTPUT);
    let rendered = r
        .render("big", &with_n(1000))
        .expect("renders under the default bound");
    assert_eq!(rendered.objects.len(), 1);
}

#[test]
fn an_addon_over_the_bound_fails_naming_it() {
    let r = renderer(MANY).with_max_output(10_000);
    let err = match r.render("big", &with_n(1000)) {
        Ok(_) => panic!("rendered past the bound"),
        Err(e) => e,
    };
    assert!(
        matches!(err, RenderError::TooLarge { limit: 10_000, .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "addon big: big/10_big.yaml: the rendered addon is larger than the 10000-byte bound \
         (--max-addon-size); rendering stopped"
    );
    // Just under the bound is fine.
    assert!(r.render("big", &with_n(50)).is_ok());
}

#[test]
fn the_bound_covers_all_files_of_an_addon_together() {
    let one = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ name }}\ndata:\n  v: \"{{ 'x' * 600 }}\"\n";
    let a = one.replace("{{ name }}", "a");
    let b = one.replace("{{ name }}", "b");
    let r = Renderer::from_memory(&[("two/10_a.yaml", &a), ("two/20_b.yaml", &b)], &[])
        .expect("loads")
        .with_max_output(1000);
    match r.render("two", &data()) {
        Err(RenderError::TooLarge { file, .. }) => assert_eq!(file, "two/20_b.yaml"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_runaway_string_is_cut_off_at_the_bound_when_printed() {
    // Doubling a string 22 times builds 4 MiB (minijinja does not bound `~`); printing it
    // stops at the bound.
    let source = "{% set ns = namespace(s='x') %}{% for i in range(22) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}\
apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n  v: \"{{ ns.s }}\"\n";
    let r = renderer(source).with_max_output(1 << 20);
    assert!(matches!(
        r.render("big", &data()),
        Err(RenderError::TooLarge { .. })
    ));
}

#[test]
fn to_yaml_refuses_a_string_over_the_bound() {
    let source = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n  v: |\n    {{ Variables.big | to_yaml }}\n";
    let r = renderer(source).with_max_output(1000);
    let mut d = data();
    d.variables.insert("big".into(), "y".repeat(2000).into());
    let err = match r.render("big", &d) {
        Ok(_) => panic!("rendered"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("to_yaml"), "{err}");
    assert!(err.contains("over the 1000-byte bound"), "{err}");
}
