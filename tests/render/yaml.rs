//! What `RenderedAddon::to_yaml` writes reads back as the same objects, whatever the strings.

use kipam::render::RenderedAddon;
use proptest::prelude::*;
use serde_json::{Value, json};

fn addon(objects: Vec<Value>) -> RenderedAddon {
    RenderedAddon {
        addon: "test".to_string(),
        objects,
    }
}

fn read_back(yaml: &str) -> Vec<Value> {
    match serde_saphyr::from_multiple(yaml) {
        Ok(objects) => objects,
        Err(err) => panic!("{err}\n{yaml}"),
    }
}

#[test]
fn strings_that_yaml_would_read_as_something_else_are_quoted() {
    // YAML 1.1 booleans, octal and hex numbers, sexagesimal numbers (an IPv6 address made of
    // decimal-looking groups is one), timestamps, nulls: consumers such as kubectl or PyYAML
    // must still read strings.
    let tricky = [
        "yes",
        "No",
        "on",
        "OFF",
        "y",
        "n",
        "true",
        "null",
        "~",
        "",
        "012",
        "0x1f",
        "1e3",
        "1_000",
        ".inf",
        "2001:10:20:30:40:50:0:1",
        "1:20",
        "2026-11-22",
        "- a",
        "a: b",
        "#a",
        "*a",
        "&a",
        "!a",
        "@a",
        "'a'",
        "\"a\"",
        "[a]",
        "{a}",
        "---",
        "...",
        " a",
        "a ",
        "a\nb",
    ];
    let object = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "tricky"},
        "data": tricky.iter().enumerate().map(|(i, s)| (format!("k{i:02}"), json!(s))).collect::<serde_json::Map<_, _>>(),
    });
    let yaml = addon(vec![object.clone()]).to_yaml();
    assert_eq!(read_back(&yaml), [object]);
    for line in yaml.lines().filter(|l| l.starts_with("  k")) {
        let value = line.split_once(": ").map_or("", |(_, v)| v);
        assert!(
            value.starts_with(['"', '\'', '|', '>']),
            "written unquoted: {line:?}"
        );
    }
}

#[test]
fn no_objects_write_nothing() {
    assert_eq!(addon(Vec::new()).to_yaml(), "");
}

#[test]
fn keys_are_sorted_at_every_level() {
    let object = json!({"kind": "K", "apiVersion": "v1", "metadata": {"name": "x", "labels": {"b": "1", "a": "2"}}});
    assert_eq!(
        addon(vec![object]).to_yaml(),
        "---\napiVersion: v1\nkind: K\nmetadata:\n  labels:\n    a: \"2\"\n    b: \"1\"\n  name: x\n"
    );
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<String>().prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(Value::Null),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-zA-Z0-9./_ :-]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn written_yaml_reads_back_identically(data in prop::collection::vec(json_value(), 1..3)) {
        let objects: Vec<Value> = data
            .into_iter()
            .enumerate()
            .map(|(i, data)| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("o{i}")}, "data": data}))
            .collect();
        let yaml = addon(objects.clone()).to_yaml();
        prop_assert_eq!(read_back(&yaml), objects, "{}", yaml);
    }
}
