//! A fast reader for the plain subset of YAML that addon templates usually produce.
//!
//! The full YAML parser costs about 100 ns per byte, several times more than rendering the
//! template itself, which would put the 20,000 renders per second out of reach. Most
//! rendered manifests, though, use only block mappings and sequences of keys and strings.
//! This module reads exactly that subset and answers `None` for anything else — numbers,
//! booleans, nulls written as words, anchors, tags, multi-line scalars, comments after a
//! value, escapes, tabs — so the caller falls back to the full parser. It never reports an
//! error of its own: what it accepts it reads exactly as the full parser does (a differential
//! property test below holds it to that), and what it does not accept it leaves alone.
//!
//! Accepted:
//! - documents separated by lines that are exactly `---`; blank lines and whole-line comments;
//! - block mappings whose keys are plain words (`[A-Za-z][A-Za-z0-9._/-]*`);
//! - block sequences of scalars (`- value`), nested blocks under `key:` or `-`;
//! - scalars: plain words that no YAML schema reads as anything but a string, and single- or
//!   double-quoted strings without escapes; `[]`, `{}`, and one-line flow lists of scalars.

use serde_json::{Map, Value};

/// The documents of `text`, empty ones dropped, or `None` when `text` leaves the subset.
pub(crate) fn parse_documents(text: &str) -> Option<Vec<Value>> {
    if text.contains(['\t', '\r', '\u{feff}']) {
        return None;
    }
    let mut documents = Vec::new();
    let mut lines: Vec<Line<'_>> = Vec::new();
    for raw in text.lines() {
        let content = raw.trim_end_matches(' ');
        if content == "---" {
            documents.extend(parse_document(&lines)?);
            lines.clear();
            continue;
        }
        let trimmed = content.trim_start_matches(' ');
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if content.starts_with(['%', '.']) || content.starts_with("--") {
            // Directives, `...` document ends, `--- value` headers.
            return None;
        }
        lines.push(Line {
            indent: content.len() - trimmed.len(),
            text: trimmed,
        });
    }
    documents.extend(parse_document(&lines)?);
    Some(documents)
}

/// One non-blank, non-comment line: its indentation and what follows it.
#[derive(Clone, Copy)]
struct Line<'a> {
    indent: usize,
    text: &'a str,
}

impl Line<'_> {
    fn is_item(&self) -> bool {
        self.text == "-" || self.text.starts_with("- ")
    }
}

/// `Some(None)` for an empty document, `Some(Some(value))` for a document, `None` to give up.
fn parse_document(lines: &[Line<'_>]) -> Option<Option<Value>> {
    let Some(first) = lines.first() else {
        return Some(None);
    };
    if first.indent != 0 {
        return None;
    }
    let mut pos = 0;
    let value = parse_block(lines, &mut pos, 0)?;
    (pos == lines.len()).then_some(Some(value))
}

fn parse_block(lines: &[Line<'_>], pos: &mut usize, indent: usize) -> Option<Value> {
    if lines.get(*pos)?.is_item() {
        parse_sequence(lines, pos, indent)
    } else {
        parse_mapping(lines, pos, indent)
    }
}

fn parse_mapping(lines: &[Line<'_>], pos: &mut usize, indent: usize) -> Option<Value> {
    let mut map = Map::new();
    while let Some(line) = lines.get(*pos) {
        if line.indent < indent {
            break;
        }
        if line.indent > indent || line.is_item() {
            return None;
        }
        let (key, rest) = line.text.split_once(':')?;
        if !is_plain_word(key) || map.contains_key(key) {
            return None;
        }
        let rest = match rest {
            "" => "",
            rest => rest.strip_prefix(' ')?.trim_start_matches(' '),
        };
        *pos += 1;
        let value = if rest.is_empty() {
            nested(lines, pos, indent, true)?
        } else {
            let value = parse_scalar(rest)?;
            no_continuation(lines, *pos, indent)?;
            value
        };
        map.insert(key.to_string(), value);
    }
    Some(Value::Object(map))
}

fn parse_sequence(lines: &[Line<'_>], pos: &mut usize, indent: usize) -> Option<Value> {
    let mut items = Vec::new();
    while let Some(line) = lines.get(*pos) {
        if line.indent < indent || (line.indent == indent && !line.is_item()) {
            break;
        }
        if line.indent > indent {
            return None;
        }
        let rest = line.text[1..].trim_start_matches(' ');
        *pos += 1;
        if rest.is_empty() {
            items.push(nested(lines, pos, indent, false)?);
        } else {
            // `- key: value` (a mapping inside the item) is left to the full parser.
            if rest.contains(':') && !rest.starts_with(['"', '\'', '[']) {
                return None;
            }
            items.push(parse_scalar(rest)?);
            no_continuation(lines, *pos, indent)?;
        }
    }
    Some(Value::Array(items))
}

/// The value under `key:` or `-` with nothing after it: a deeper block, a sequence at the
/// same indentation (allowed under a mapping key), or null.
fn nested(lines: &[Line<'_>], pos: &mut usize, indent: usize, under_key: bool) -> Option<Value> {
    match lines.get(*pos) {
        Some(next) if next.indent > indent => parse_block(lines, pos, next.indent),
        Some(next) if under_key && next.indent == indent && next.is_item() => {
            parse_sequence(lines, pos, indent)
        }
        _ => Some(Value::Null),
    }
}

/// A scalar on one line must not continue on the next, more indented line.
fn no_continuation(lines: &[Line<'_>], pos: usize, indent: usize) -> Option<()> {
    match lines.get(pos) {
        Some(next) if next.indent > indent => None,
        _ => Some(()),
    }
}

fn parse_scalar(text: &str) -> Option<Value> {
    match text {
        "[]" => return Some(Value::Array(Vec::new())),
        "{}" => return Some(Value::Object(Map::new())),
        _ => {}
    }
    if let Some(inner) = text.strip_prefix('[') {
        return parse_flow_list(inner);
    }
    let (value, rest) = take_scalar(text)?;
    rest.is_empty().then_some(value)
}

/// The items of `[a, "b", 'c']` (the opening bracket already consumed).
fn parse_flow_list(mut text: &str) -> Option<Value> {
    let mut items = Vec::new();
    loop {
        text = text.trim_start_matches(' ');
        let (item, rest) = take_scalar(text)?;
        items.push(item);
        let rest = rest.trim_start_matches(' ');
        if let Some(rest) = rest.strip_prefix(',') {
            text = rest;
        } else if rest == "]" {
            return Some(Value::Array(items));
        } else {
            return None;
        }
    }
}

/// One scalar at the start of `text` and what follows it.
fn take_scalar(text: &str) -> Option<(Value, &str)> {
    for quote in ['"', '\''] {
        if let Some(inner) = text.strip_prefix(quote) {
            let end = inner.find(quote)?;
            let (content, rest) = (&inner[..end], &inner[end + 1..]);
            // Escapes (`\` in double quotes, `''` in single quotes) and control characters
            // are left to the full parser.
            if content.contains(['\\', '"', '\'']) || content.chars().any(char::is_control) {
                return None;
            }
            return Some((Value::String(content.to_string()), rest));
        }
    }
    let end = text.find([',', ']', ' ']).unwrap_or(text.len());
    let (word, rest) = text.split_at(end);
    is_plain_word(word).then(|| (Value::String(word.to_string()), rest))
}

/// A plain scalar that every YAML schema (1.1 and 1.2) reads as this very string: it starts
/// with a letter, holds only letters, digits and `._/-`, and is not a boolean, null or
/// special float spelled as a word.
fn is_plain_word(word: &str) -> bool {
    const WORDS: [&str; 12] = [
        "true", "false", "yes", "no", "on", "off", "y", "n", "null", "nan", "inf", "infinity",
    ];
    let mut chars = word.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
        && !WORDS.iter().any(|w| w.eq_ignore_ascii_case(word))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn full(text: &str) -> Option<Vec<Value>> {
        serde_saphyr::from_multiple(text).ok()
    }

    #[test]
    fn reads_a_typical_manifest() {
        let text = "\n---\napiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: p\n  labels:\n    a.b/c: d\n# note\nspec:\n  addresses: [\"10.0.0.0-10.0.0.7\", '2001:db8::/64']\n  other:\n  - x\n  -\n    k: v\n  empty:\n---\n---\nkind: B\n";
        let docs = parse_documents(text);
        assert_eq!(
            docs,
            Some(vec![
                json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                       "metadata": {"name": "p", "labels": {"a.b/c": "d"}},
                       "spec": {"addresses": ["10.0.0.0-10.0.0.7", "2001:db8::/64"],
                                "other": ["x", {"k": "v"}], "empty": null}}),
                json!({"kind": "B"}),
            ])
        );
        assert_eq!(docs, full(text));
    }

    #[test]
    fn leaves_everything_else_to_the_full_parser() {
        for text in [
            "a: 1",
            "a: true",
            "a: yes",
            "a: Null",
            "a: ~",
            "a: 10.0.0.1",
            "a: b # comment",
            "a: |\n  text",
            "a: b\n  c",
            "a: &x b\nc: *x",
            "a: !!str b",
            "a: \"b\\n\"",
            "a: 'it''s'",
            "- a: b",
            "a: b\na: c",
            "  a: b",
            "a:\tb",
            "%YAML 1.2\n---\na: b",
            "a: b\n...\n",
            "--- a",
            "a: [b, [c]]",
            "a: {b: c}",
            "\"a\": b",
            "a: b: c",
        ] {
            assert_eq!(parse_documents(text), None, "{text:?}");
        }
    }

    /// Scalars picked to trip a reader that resolves types differently from YAML's schemas.
    fn scalar() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "true",
                "True",
                "FALSE",
                "yes",
                "No",
                "on",
                "OFF",
                "y",
                "N",
                "null",
                "Null",
                "~",
                "nan",
                ".nan",
                "inf",
                ".Inf",
                "-.inf",
                "0",
                "1",
                "-1",
                "+1",
                "0x1f",
                "0o17",
                "017",
                "1e3",
                "1.5",
                "1_000",
                "12:30:00",
                "2001:db8::1",
                "10.0.0.1",
                "10.0.0.0/8",
                "a b",
                "a#b",
                "a #b",
                "#a",
                "-",
                "-a",
                "?",
                "? a",
                ":",
                "a:",
                "a: b",
                "'a'",
                "\"a\"",
                "''",
                "\"\"",
                "[a]",
                "{a}",
                "[]",
                "{}",
                "a,b",
                "a]",
                "!a",
                "&a",
                "*a",
                "|",
                ">",
                "@a",
                "`a",
                "%a",
                "metallb.io/v1beta1",
                "kipam-managed-pool",
                "ipam.kipam.dev/addon",
                "A_b.c-d/e",
                "e5",
                "x1",
            ])
            .prop_map(str::to_string),
            "[a-z0-9.:/ #'\"\\[\\]{},-]{0,8}",
        ]
    }

    /// A YAML rendering of a scalar: plain, single-quoted or double-quoted, as written.
    fn styled(s: String, style: u8) -> String {
        match style % 3 {
            0 => s,
            1 => format!("'{s}'"),
            _ => format!("\"{s}\""),
        }
    }

    /// Mapping keys: mostly plain words, sometimes anything.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![3 => "[a-zA-Z][a-zA-Z0-9./_-]{0,6}", 1 => scalar()]
    }

    /// A node as YAML lines; `inline` when it fits after `key:` or `-` on the same line,
    /// `sequence` when it is a block sequence.
    #[derive(Clone, Debug)]
    struct Node {
        lines: Vec<String>,
        inline: bool,
        sequence: bool,
    }

    fn node(depth: u32) -> BoxedStrategy<Node> {
        let leaf = prop_oneof![
            (scalar(), any::<u8>()).prop_map(|(s, style)| styled(s, style)),
            prop::collection::vec((scalar(), any::<u8>()), 0..4).prop_map(|items| {
                let items: Vec<String> = items.into_iter().map(|(s, st)| styled(s, st)).collect();
                format!("[{}]", items.join(", "))
            }),
            Just(String::new()),
        ]
        .prop_map(|line| Node {
            lines: vec![line],
            inline: true,
            sequence: false,
        })
        .boxed();
        if depth == 0 {
            return leaf;
        }
        let entry = (key(), node(depth - 1), any::<bool>());
        prop_oneof![
            leaf,
            prop::collection::vec(entry, 1..4).prop_map(|entries| {
                let mut lines = Vec::new();
                for (key, value, flush) in entries {
                    // A sequence under a key may sit at the key's own indentation.
                    let indent = if value.sequence && flush { "" } else { "  " };
                    block(&mut lines, format!("{key}:"), value, indent);
                }
                Node {
                    lines,
                    inline: false,
                    sequence: false,
                }
            }),
            prop::collection::vec(node(depth - 1), 1..4).prop_map(|items| {
                let mut lines = Vec::new();
                for item in items {
                    block(&mut lines, "-".to_string(), item, "  ");
                }
                Node {
                    lines,
                    inline: false,
                    sequence: true,
                }
            }),
        ]
        .boxed()
    }

    /// Appends `head value` for an inline value, or `head` and the value indented below.
    fn block(lines: &mut Vec<String>, head: String, value: Node, indent: &str) {
        if value.inline {
            lines.push(format!("{head} {}", value.lines[0]).trim_end().to_string());
        } else {
            lines.push(head);
            lines.extend(value.lines.into_iter().map(|l| format!("{indent}{l}")));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the quick reader accepts, the full parser reads identically.
        #[test]
        fn agrees_with_the_full_parser(docs in prop::collection::vec(node(3), 1..3)) {
            let text = docs
                .iter()
                .map(|d| d.lines.join("\n"))
                .collect::<Vec<_>>()
                .join("\n---\n");
            if let Some(quick) = parse_documents(&text) {
                prop_assert_eq!(Some(quick), full(&text), "{}", text);
            }
        }
    }
}
