//! The address filters, tests and functions, IPv4 and IPv6, as a template uses them.

use kipam::render::{Renderer, TemplateData};
use serde_json::{Value, json};

use super::{cluster, prefix, range};

/// Evaluates `expression` in a template and returns its value (through `tojson`, so numbers
/// stay numbers), or the error message.
fn eval(expression: &str) -> Result<Value, String> {
    eval_with(expression, &data())
}

fn eval_with(expression: &str, data: &TemplateData) -> Result<Value, String> {
    let source = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: eval\ndata:\n  value: {{{{ ({expression}) | tojson }}}}\n"
    );
    let renderer = Renderer::from_memory(&[("eval/10_eval.yaml", &source)], &[])
        .map_err(|err| err.to_string())?;
    let rendered = renderer
        .render("eval", data)
        .map_err(|err| err.to_string())?;
    Ok(rendered.objects[0]["data"]["value"].clone())
}

fn data() -> TemplateData {
    TemplateData::new(
        cluster("filters", "dc-1")
            .with_allocation(
                "v4",
                range(
                    "dc-1",
                    &["192.168.1.0-192.168.1.7", "192.168.1.16-192.168.1.23"],
                ),
            )
            .with_allocation("v6", prefix("dc-1", "2001:db8:0:1::/64")),
    )
}

/// The message of a filter error raised by `eval`.
fn error_of(expression: &str) -> String {
    match eval(expression) {
        Ok(value) => panic!("{expression} gave {value}"),
        Err(err) => err
            .strip_prefix("addon eval: eval/10_eval.yaml:6: ")
            .unwrap_or(&err)
            .to_string(),
    }
}

#[test]
fn nth_host() {
    for (expression, expected) in [
        ("'192.168.1.0/24' | nth_host(0)", "192.168.1.0"),
        ("'192.168.1.0/24' | nth_host(5)", "192.168.1.5"),
        ("'192.168.1.0/24' | nth_host(-1)", "192.168.1.255"),
        ("'192.168.1.77/24' | nth_host(1)", "192.168.1.1"),
        ("'10.0.0.0/8' | nth_host(305)", "10.0.1.49"),
        ("'192.168.1.10-192.168.1.20' | nth_host(10)", "192.168.1.20"),
        // Across the disjoint pieces of a range allocation.
        (
            "Cluster.Network.IPAMAllocations.v4.Addresses | nth_host(8)",
            "192.168.1.16",
        ),
        (
            "Cluster.Network.IPAMAllocations.v4.Addresses | nth_host(-9)",
            "192.168.1.7",
        ),
        ("'2001:db8::/32' | nth_host(1)", "2001:db8::1"),
        (
            "'2001:db8::/32' | nth_host(-1)",
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
        ),
        (
            "Cluster.Network.IPAMAllocations.v6.CIDR | nth_host(18446744073709551615)",
            "2001:db8:0:1:ffff:ffff:ffff:ffff",
        ),
        (
            "'::/0' | nth_host(-1)",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ),
    ] {
        assert_eq!(eval(expression), Ok(json!(expected)), "{expression}");
    }
    assert_eq!(
        error_of("'192.168.1.0/30' | nth_host(4)"),
        "nth_host: index 4 is outside the 4 addresses of \"192.168.1.0/30\""
    );
    assert_eq!(
        error_of("'2001:db8::/64' | nth_host(-18446744073709551617)"),
        "nth_host: index -18446744073709551617 is outside the 18446744073709551616 addresses of \"2001:db8::/64\""
    );
    assert_eq!(
        error_of("'not-an-address' | nth_host(0)"),
        "nth_host: \"not-an-address\" is not an address, CIDR or range"
    );
    assert_eq!(
        error_of("['10.0.0.0/30', '2001:db8::/126'] | nth_host(0)"),
        "nth_host: the list mixes IPv4 and IPv6"
    );
}

#[test]
fn prefix_len() {
    for (expression, expected) in [
        ("'192.168.1.0/26' | prefix_len", 26),
        ("'192.168.1.5' | prefix_len", 32),
        ("'192.168.1.8-192.168.1.15' | prefix_len", 29),
        ("'2001:db8::/48' | prefix_len", 48),
        ("'2001:db8::1' | prefix_len", 128),
        ("'2001:db8::-2001:db8::ff' | prefix_len", 120),
        ("'0.0.0.0/0' | prefix_len", 0),
    ] {
        assert_eq!(eval(expression), Ok(json!(expected)), "{expression}");
    }
    assert_eq!(
        error_of("'192.168.1.1-192.168.1.2' | prefix_len"),
        "prefix_len: \"192.168.1.1-192.168.1.2\" is not one CIDR block"
    );
}

#[test]
fn netmask_network_and_broadcast() {
    for (expression, expected) in [
        ("'192.168.1.0/26' | netmask", "255.255.255.192"),
        ("'10.1.2.3/8' | netmask", "255.0.0.0"),
        ("'0.0.0.0/0' | netmask", "0.0.0.0"),
        ("'2001:db8::/48' | netmask", "ffff:ffff:ffff::"),
        (
            "'2001:db8::1/128' | netmask",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ),
        ("'192.168.1.77/26' | network", "192.168.1.64"),
        ("'2001:db8:0:1:2:3:4:5/64' | network", "2001:db8:0:1::"),
        ("'192.168.1.77/26' | broadcast", "192.168.1.127"),
        (
            "'2001:db8::/64' | broadcast",
            "2001:db8::ffff:ffff:ffff:ffff",
        ),
        ("'10.0.0.0/31' | broadcast", "10.0.0.1"),
    ] {
        assert_eq!(eval(expression), Ok(json!(expected)), "{expression}");
    }
    assert_eq!(
        error_of("'192.168.1.0-192.168.1.7' | netmask"),
        "netmask: \"192.168.1.0-192.168.1.7\" is not a CIDR such as 192.168.1.0/26"
    );
    assert_eq!(
        error_of("'192.168.1.0/33' | network"),
        "network: \"192.168.1.0/33\" is not a CIDR such as 192.168.1.0/26"
    );
    assert_eq!(
        error_of("42 | broadcast"),
        "broadcast: expects a CIDR such as 192.168.1.0/26, got a number"
    );
}

#[test]
fn ip_family() {
    for (expression, expected) in [
        ("'192.168.1.1' | ip_family", "IPv4"),
        ("'192.168.1.0/24' | ip_family", "IPv4"),
        (
            "Cluster.Network.IPAMAllocations.v4.Addresses | ip_family",
            "IPv4",
        ),
        ("'::1' | ip_family", "IPv6"),
        (
            "Cluster.Network.IPAMAllocations.v6.CIDR | ip_family",
            "IPv6",
        ),
        ("'2001:db8::1-2001:db8::9' | ip_family", "IPv6"),
    ] {
        assert_eq!(eval(expression), Ok(json!(expected)), "{expression}");
    }
    assert_eq!(error_of("[] | ip_family"), "ip_family: got an empty list");
}

#[test]
fn address_count() {
    for (expression, expected) in [
        (
            "Cluster.Network.IPAMAllocations.v4.Addresses | address_count",
            json!(16),
        ),
        ("'192.168.1.0/26' | address_count", json!(64)),
        ("'10.0.0.1' | address_count", json!(1)),
        ("'2001:db8::/96' | address_count", json!(4294967296u64)),
    ] {
        assert_eq!(eval(expression), Ok(expected), "{expression}");
    }
    assert_eq!(
        error_of("'::/0' | address_count"),
        "address_count: 340282366920938463463374607431768211456 addresses do not fit in a template integer"
    );
}

#[test]
fn ip_tests() {
    for (expression, expected) in [
        ("'10.0.0.1' is ipv4", true),
        ("'10.0.0.0/8' is ipv4", true),
        ("'2001:db8::/64' is ipv4", false),
        ("'2001:db8::/64' is ipv6", true),
        ("'fe80::1-fe80::9' is ipv6", true),
        ("'hello' is ipv4", false),
        ("42 is ipv6", false),
    ] {
        assert_eq!(eval(expression), Ok(json!(expected)), "{expression}");
    }
}

#[test]
fn to_yaml() {
    let data = data().with_variable(
        "pool",
        json!({"name": "extra", "addresses": ["10.0.0.0/30", "true"], "autoAssign": false}),
    );
    // `to_yaml` writes block YAML that `indent` can place anywhere in a document.
    let source = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  nested:\n    {{ Variables.pool | to_yaml | indent(4) }}\n  words: {{ 'yes' | to_yaml }}\n";
    let renderer = match Renderer::from_memory(&[("y/10_y.yaml", source)], &[]) {
        Ok(renderer) => renderer,
        Err(err) => panic!("{err}"),
    };
    let rendered = match renderer.render("y", &data) {
        Ok(rendered) => rendered,
        Err(err) => panic!("{err}"),
    };
    assert_eq!(
        rendered.objects[0]["data"],
        json!({
            "nested": {"name": "extra", "addresses": ["10.0.0.0/30", "true"], "autoAssign": false},
            "words": "yes",
        })
    );
    assert_eq!(
        eval_with("Variables.pool.addresses | to_yaml", &data),
        Ok(json!("- 10.0.0.0/30\n- \"true\""))
    );
}

#[test]
fn as_bool_and_fail() {
    for (expression, expected) in [
        ("true | as_bool", true),
        ("'TRUE' | as_bool", true),
        ("'false' | as_bool", false),
        ("none | as_bool", false),
    ] {
        assert_eq!(eval(expression), Ok(json!(expected)), "{expression}");
    }
    assert_eq!(
        error_of("1 | as_bool"),
        "as_bool: expects true or false, got a number"
    );
    assert_eq!(
        error_of("fail('the metallb pool must be IPv4')"),
        "the metallb pool must be IPv4"
    );
}

#[test]
fn strings_go_into_yaml_unescaped() {
    // No auto-escaping: a `*.yaml` template gets values as they are, not JSON-quoted.
    let source = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ Cluster.Name }}\ndata:\n  text: '{{ \"<a & \\\"b\\\">\" }}'\n";
    let renderer = match Renderer::from_memory(&[("raw/10_raw.yaml", source)], &[]) {
        Ok(renderer) => renderer,
        Err(err) => panic!("{err}"),
    };
    let rendered = match renderer.render("raw", &data()) {
        Ok(rendered) => rendered,
        Err(err) => panic!("{err}"),
    };
    assert_eq!(rendered.objects[0]["metadata"]["name"], "filters");
    assert_eq!(rendered.objects[0]["data"]["text"], "<a & \"b\">");
}

#[test]
fn an_undefined_input_is_named() {
    for filter in [
        "nth_host(0)",
        "prefix_len",
        "netmask",
        "network",
        "broadcast",
        "ip_family",
        "address_count",
        "to_yaml",
        "as_bool",
        "items",
    ] {
        assert_eq!(
            error_of(&format!(
                "Cluster.Network.IPAMAllocations.v5.CIDR | {filter}"
            )),
            "`Cluster.Network.IPAMAllocations.v5` is undefined",
            "{filter}"
        );
        assert_eq!(
            error_of(&format!("Variables.cidr | {filter}")),
            "`Variables.cidr` is undefined",
            "{filter}"
        );
    }
}
