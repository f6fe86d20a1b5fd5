//! Property: whatever happens to the example manifests or to the state file — a field dropped,
//! a document or list item duplicated, a value retyped, a key renamed, the text truncated —
//! `kipam offline` never panics; it either runs (exit 0 or 1) or refuses with exit 2 and a
//! message, and a refused run leaves the state file byte for byte as it was.

use std::path::Path;

use proptest::prelude::*;
use serde_json::Value;

use super::{Workdir, text};

#[derive(Clone, Copy, Debug)]
enum Mutation {
    Drop,
    Duplicate,
    Retype,
    Rename,
    Truncate,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        Just(Mutation::Drop),
        Just(Mutation::Duplicate),
        Just(Mutation::Retype),
        Just(Mutation::Rename),
        Just(Mutation::Truncate),
    ]
}

fn examples_text() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| format!("---\n{}", std::fs::read_to_string(p).unwrap()))
        .collect()
}

/// Every node as a JSON pointer into its document: `(document, pointer)`.
fn pointers(docs: &[Value]) -> Vec<(usize, String)> {
    fn walk(v: &Value, at: String, doc: usize, out: &mut Vec<(usize, String)>) {
        out.push((doc, at.clone()));
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    let key = k.replace('~', "~0").replace('/', "~1");
                    walk(child, format!("{at}/{key}"), doc, out);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    walk(child, format!("{at}/{i}"), doc, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        walk(d, String::new(), i, &mut out);
    }
    out
}

fn split(pointer: &str) -> (&str, String) {
    let Some(cut) = pointer.rfind('/') else {
        return ("", String::new());
    };
    let last = pointer[cut + 1..].replace("~1", "/").replace("~0", "~");
    (&pointer[..cut], last)
}

/// Maps whose keys are data (datacenter, pool, label names) or free-form, not field names.
fn is_data(parent: &str) -> bool {
    ["/datacenters", "/ipam", "/labels", "/annotations"]
        .iter()
        .any(|m| parent.ends_with(m))
        || parent.contains("/variables")
}

/// Applies `m` to the YAML stream `yaml`, choosing what to change with `pick`. Returns the
/// new stream and whether kipam must refuse it (a renamed field, a duplicated document).
fn mutate(yaml: &str, m: Mutation, pick: usize, variant: usize) -> (String, bool) {
    if let Mutation::Truncate = m {
        let mut cut = pick % yaml.len().max(1);
        while !yaml.is_char_boundary(cut) {
            cut -= 1;
        }
        return (yaml[..cut].to_string(), false);
    }
    let mut must_refuse = false;
    let mut docs: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap_or_default();
    docs.retain(|d| !d.is_null());
    let all = pointers(&docs);
    if all.is_empty() {
        return (yaml.to_string(), false);
    }
    let (doc, pointer) = all[pick % all.len()].clone();
    match m {
        Mutation::Drop => {
            if pointer.is_empty() {
                docs.remove(doc);
            } else {
                let (parent, last) = split(&pointer);
                match docs[doc].pointer_mut(parent) {
                    Some(Value::Object(map)) => {
                        map.remove(&last);
                    }
                    Some(Value::Array(items)) => {
                        if let Ok(i) = last.parse::<usize>() {
                            items.remove(i);
                        }
                    }
                    _ => {}
                }
            }
        }
        Mutation::Duplicate => {
            let (parent, last) = split(&pointer);
            let in_list =
                !pointer.is_empty() && matches!(docs[doc].pointer(parent), Some(Value::Array(_)));
            if in_list {
                if let (Some(Value::Array(items)), Ok(i)) =
                    (docs[doc].pointer_mut(parent), last.parse::<usize>())
                {
                    let copy = items[i].clone();
                    items.insert(i, copy);
                }
            } else {
                let copy = docs[doc].clone();
                docs.insert(doc, copy);
                must_refuse = true; // the same object twice
            }
        }
        Mutation::Retype => {
            let replacement = match variant % 7 {
                0 => Value::Null,
                1 => Value::Bool(true),
                2 => serde_json::json!(8.5),
                3 => serde_json::json!(-3),
                4 => serde_json::json!("text"),
                5 => serde_json::json!(["x"]),
                _ => serde_json::json!({"x": 1}),
            };
            if let Some(slot) = docs[doc].pointer_mut(&pointer) {
                *slot = replacement;
            }
        }
        Mutation::Rename => {
            if !pointer.is_empty() {
                let (parent, last) = split(&pointer);
                if let Some(Value::Object(map)) = docs[doc].pointer_mut(parent)
                    && let Some(v) = map.remove(&last)
                {
                    let renamed = match variant % 4 {
                        0 => format!("{last}s"),
                        1 => last.to_uppercase(),
                        2 => last.chars().skip(1).collect(),
                        _ => format!("x{last}"),
                    };
                    must_refuse = !is_data(parent) && !map.contains_key(&renamed);
                    map.insert(renamed, v);
                }
            }
        }
        Mutation::Truncate => unreachable!(),
    }
    let text = docs
        .iter()
        .map(|d| format!("---\n{}", serde_saphyr::to_string(d).unwrap_or_default()))
        .collect();
    (text, must_refuse)
}

/// Runs offline over `input` with the state `state`, and checks the property.
fn check(w: &Workdir, input: &str, state: &[u8], must_refuse: bool) -> Result<(), TestCaseError> {
    let files = w.write("in.yaml", input);
    let state_path = w.path("state.yaml");
    std::fs::write(&state_path, state).unwrap();
    let run = super::offline(&[files.to_str().unwrap()], &state_path);
    let code = run.status.code();
    let err = text(&run.stderr);
    prop_assert!(
        matches!(code, Some(0..=2)),
        "exit {code:?} (a panic exits 101):\n{err}\n--- input:\n{input}"
    );
    prop_assert!(
        !must_refuse || code == Some(2),
        "must be refused, exit {code:?}\n--- input:\n{input}\n--- state:\n{}",
        String::from_utf8_lossy(state)
    );
    if code == Some(2) {
        prop_assert!(err.starts_with("error: ") && err.len() > 10, "{err}");
        prop_assert!(!err.contains("panicked"), "{err}");
        let after = std::fs::read(&state_path).unwrap();
        prop_assert!(
            after == state,
            "a refused run changed the state file:\n{err}"
        );
    }
    Ok(())
}

fn baseline(w: &Workdir) -> (String, Vec<u8>) {
    let input = examples_text();
    let files = w.write("base.yaml", &input);
    let state = w.path("base-state.yaml");
    let run = super::offline(&[files.to_str().unwrap()], &state);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    (input, std::fs::read(&state).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn mutated_manifests_never_panic_and_refusals_keep_the_state(
        m in mutation(),
        pick in any::<usize>(),
        variant in any::<usize>(),
    ) {
        let w = Workdir::new("mutate-manifests");
        let (input, state) = baseline(&w);
        let (mutated, must_refuse) = mutate(&input, m, pick, variant);
        check(&w, &mutated, &state, must_refuse)?;
    }

    #[test]
    fn mutated_state_never_panics_and_refusals_keep_it(
        m in mutation(),
        pick in any::<usize>(),
        variant in any::<usize>(),
    ) {
        let w = Workdir::new("mutate-state");
        let (input, state) = baseline(&w);
        let (mutated, must_refuse) = mutate(&String::from_utf8(state).unwrap(), m, pick, variant);
        check(&w, &input, mutated.as_bytes(), must_refuse)?;
    }
}

#[test]
fn renamed_fields_in_the_examples_are_always_refused() {
    // Every field of a fixed-shape object renamed (not map keys such as datacenter or pool
    // names, which are data): each such run must be refused.
    let w = Workdir::new("rename-every-field");
    let (input, state) = baseline(&w);
    let mut docs: Vec<Value> = serde_saphyr::from_multiple(&input).unwrap();
    docs.retain(|d| !d.is_null());
    let mut refused = 0;
    for (doc, pointer) in pointers(&docs) {
        let (parent, _) = split(&pointer);
        if pointer.is_empty()
            || is_data(parent)
            || !matches!(docs[doc].pointer(parent), Some(Value::Object(_)))
        {
            continue;
        }
        let mut changed = docs.clone();
        let (parent, last) = split(&pointer);
        if let Some(Value::Object(map)) = changed[doc].pointer_mut(parent) {
            let v = map.remove(&last).unwrap();
            map.insert(format!("{last}s"), v);
        }
        let yaml: String = changed
            .iter()
            .map(|d| format!("---\n{}", serde_saphyr::to_string(d).unwrap()))
            .collect();
        let files = w.write("in.yaml", &yaml);
        let state_path = w.path("state.yaml");
        std::fs::write(&state_path, &state).unwrap();
        let run = super::offline(&[files.to_str().unwrap()], &state_path);
        let err = text(&run.stderr);
        assert_eq!(
            run.status.code(),
            Some(2),
            "{pointer} in document {doc}: {err}"
        );
        assert!(err.contains(&format!("{last}s")), "names the field: {err}");
        assert_eq!(std::fs::read(&state_path).unwrap(), state);
        refused += 1;
    }
    assert!(refused > 50, "only {refused} fields tried");
}
