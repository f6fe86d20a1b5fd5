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

// The render sandbox: what a template builds without printing it is bounded by memory.

mod sandbox {
    use std::time::Duration;

    use kipam::render::sandbox::SandboxOptions;
    use kipam::render::{RenderError, Renderer};

    use super::{data, renderer};

    /// Doubles a 16-byte string 25 times (512 MiB) without printing it: fuel and the output
    /// bound both let it through.
    const DOUBLING: &str = "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}\n\
{% for i in range(25) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}\n\
apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n  n: \"{{ ns.s | length }}\"\n";

    /// The same growth with lists.
    const LIST_DOUBLING: &str = "{% set ns = namespace(l=[1, 2, 3, 4]) %}\n\
{% for i in range(26) %}{% set ns.l = (ns.l + ns.l) | list %}{% endfor %}\n\
apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n  n: \"{{ ns.l | length }}\"\n";

    const MIB: u64 = 1024 * 1024;

    fn sandboxed(r: Renderer, max_memory: u64) -> Renderer {
        r.with_sandbox(SandboxOptions {
            program: env!("CARGO_BIN_EXE_kipam").into(),
            max_memory,
            timeout: Duration::from_secs(30),
        })
    }

    #[test]
    fn a_template_doubling_a_string_is_stopped_by_the_memory_bound_naming_the_addon() {
        let r = sandboxed(renderer(DOUBLING), 64 * MIB);
        let err = match r.render("big", &data()) {
            Ok(rendered) => panic!("rendered without bound: {:?}", rendered.objects),
            Err(e) => e,
        };
        assert!(
            matches!(err, RenderError::MemoryExceeded { limit, .. } if limit == 64 * MIB),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "addon big: rendering needed more than 64 MiB of memory (--max-render-memory) and \
             was stopped; does a template build ever larger strings or lists?"
        );
    }

    #[test]
    fn a_template_doubling_a_list_is_stopped_too() {
        let r = sandboxed(renderer(LIST_DOUBLING), 64 * MIB);
        let err = r.render("big", &data()).err();
        assert!(
            matches!(err, Some(RenderError::MemoryExceeded { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn after_a_stopped_render_the_next_one_works() {
        let small = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: small\n";
        let r = match Renderer::from_memory(
            &[
                ("big/10_big.yaml", DOUBLING),
                ("small/10_small.yaml", small),
            ],
            &[],
        ) {
            Ok(r) => sandboxed(r, 64 * MIB),
            Err(e) => panic!("{e}"),
        };
        for _ in 0..3 {
            assert!(matches!(
                r.render("big", &data()),
                Err(RenderError::MemoryExceeded { .. })
            ));
            let rendered = r.render("small", &data()).expect("a fresh child renders");
            assert_eq!(rendered.objects.len(), 1);
            assert_eq!(rendered.objects[0]["metadata"]["name"], "small");
        }
    }

    #[test]
    fn a_sandboxed_render_equals_the_in_process_one_and_keeps_error_messages() {
        let r = match Renderer::load(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("addons")
                .as_path(),
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("templates")
                .as_path(),
        ) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        };
        let d = kipam::render::TemplateData::new(
            kipam::render::ClusterData::new("alpha", "dc-1").with_allocation(
                "metallb",
                kipam::render::AllocationData::range("dc-1", ["10.0.0.1-10.0.0.9"]),
            ),
        );
        let direct = r.render("metallb", &d).expect("renders in process");
        let boxed = sandboxed(r, 256 * MIB);
        for _ in 0..3 {
            let via = boxed.render("metallb", &d).expect("renders in the sandbox");
            assert_eq!(via, direct);
        }
        // A template error crosses the process boundary word for word.
        let broken = renderer("name: {{ Cluster.Nmae }}\n");
        let expected = broken.render("big", &data()).err().map(|e| e.to_string());
        let boxed = sandboxed(broken, 256 * MIB);
        let got = boxed.render("big", &data()).err().map(|e| e.to_string());
        assert!(expected.is_some());
        assert_eq!(got, expected);
    }

    #[test]
    fn a_render_that_does_not_answer_in_time_is_stopped() {
        // Finite but slow: 200,000 string repetitions under ample fuel.
        let slow = "{% for i in range(1000) %}{% for j in range(200) %}{% set x = 'y' * 1000 %}\
                    {% endfor %}{% endfor %}\nk: v\n";
        let r = renderer(slow)
            .with_fuel(100_000_000)
            .with_sandbox(SandboxOptions {
                program: env!("CARGO_BIN_EXE_kipam").into(),
                max_memory: 256 * MIB,
                timeout: Duration::from_millis(50),
            });
        let err = r.render("big", &data()).err();
        assert!(
            matches!(&err, Some(RenderError::Sandbox { reason, .. }) if reason.contains("no answer within")),
            "{err:?}"
        );
    }

    #[test]
    fn a_missing_sandbox_program_is_named() {
        let r = renderer("k: v\n").with_sandbox(SandboxOptions {
            program: "/nonexistent/kipam".into(),
            max_memory: 256 * MIB,
            timeout: Duration::from_secs(5),
        });
        let err = r.render("big", &data()).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("/nonexistent/kipam") && e.contains("addon big")),
            "{err:?}"
        );
    }
}
