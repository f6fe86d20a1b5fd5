//! Reading YAML streams (manifests and the state file) into [`RawNode`] trees, with the
//! parser's budgets set on purpose.
//!
//! serde-saphyr protects itself with budgets whose defaults suit a configuration file (at most
//! 1,024 documents, 250,000 nodes, 1,000,000 events per stream). kipam's state file holds one
//! document per cluster and pool, so those defaults would make a state written for 1,500
//! clusters unreadable by the next run. Instead, one bound is documented — [`MAX_FILE_BYTES`]
//! per file — and the budgets are derived from it so that any file under that size that is
//! ordinary YAML fits, while alias bombs and nesting storms stay refused.

use std::cell::RefCell;
use std::path::Path;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use crate::validation::strict::{RawNode, RawValue};

/// The largest file kipam reads (manifest or state): 256 MiB. A state file of 100,000
/// allocations is about 40 MiB.
pub const MAX_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// Documents per file: far above any real input (a document takes at least a few bytes).
const MAX_DOCUMENTS: usize = 4_000_000;
/// Nodes (scalars, lists, mappings) per file: one node per 8 bytes of input, the density of
/// a state file is about one per 15.
const MAX_NODES: usize = (MAX_FILE_BYTES / 8) as usize;
/// Parser events per file: about one per node plus the ends of lists, mappings, documents.
const MAX_EVENTS: usize = 3 * MAX_NODES;
/// Nesting: kipam's kinds are at most 7 levels deep; 64 is the parser's default.
const MAX_DEPTH: usize = 64;
/// Events replayed by aliases (`*defaults`, `<<: *defaults`) per file. This is what bounds
/// an alias bomb; 8,000,000 is eight events of defaults merged into each of 1,000,000 objects.
const MAX_REPLAYED_EVENTS: usize = 8_000_000;

/// Reads the file at `path`, refusing files larger than [`MAX_FILE_BYTES`].
pub fn read_text(path: &Path) -> std::io::Result<String> {
    let meta = std::fs::metadata(path)?;
    if meta.is_file() && meta.len() > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!(
                "the file is {} bytes; kipam reads files of at most {} bytes (256 MiB)",
                meta.len(),
                MAX_FILE_BYTES
            ),
        ));
    }
    std::fs::read_to_string(path)
}

/// The parser options kipam reads with.
fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_reader_input_bytes = Some(MAX_FILE_BYTES as usize);
    budget.max_documents = MAX_DOCUMENTS;
    budget.max_nodes = MAX_NODES;
    budget.max_events = MAX_EVENTS;
    budget.max_total_scalar_bytes = MAX_FILE_BYTES as usize;
    budget.max_depth = MAX_DEPTH;
    // Anchors, aliases and merge keys are bounded by the replayed events below, not by
    // counts that a large, ordinary file (one `<<: *defaults` per object) would exceed; nor
    // by the aliases-per-anchor ratio, which refuses one anchor used by many objects.
    budget.max_anchors = MAX_DOCUMENTS;
    budget.max_aliases = MAX_DOCUMENTS;
    budget.max_merge_keys = MAX_DOCUMENTS;
    budget.enforce_alias_anchor_ratio = false;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.alias_limits.max_total_replayed_events = MAX_REPLAYED_EVENTS;
    options
}

/// Receives each document of a stream as soon as it is parsed, so that reading a stream of
/// 100,000 documents never holds more than one document's tree at a time.
pub trait DocumentSink: Default {
    fn document(&mut self, node: RawNode);
}

impl DocumentSink for Vec<RawNode> {
    fn document(&mut self, node: RawNode) {
        self.push(node);
    }
}

/// Adapts a [`DocumentSink`] to the collection the parser fills.
#[derive(Default)]
struct Collect<S>(S);

impl<S: DocumentSink> Extend<Node> for Collect<S> {
    fn extend<I: IntoIterator<Item = Node>>(&mut self, iter: I) {
        for Node(node) in iter {
            if !node.is_null() {
                self.0.document(node);
            }
        }
    }
}

/// The non-empty documents of a YAML stream, each with the line it starts on.
pub fn parse_stream(text: &str) -> Result<Vec<RawNode>, String> {
    parse_each(text)
}

/// Parses a YAML stream, handing each non-empty document to a new `S` as it is parsed.
pub fn parse_each<S: DocumentSink>(text: &str) -> Result<S, String> {
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{} bytes is more than the {MAX_FILE_BYTES} bytes (256 MiB) kipam reads",
            text.len()
        ));
    }
    // The visitor builds the final tree directly (no second, span-carrying copy of it) and
    // needs the source to keep scalars as written.
    SOURCE.with(|s| *s.borrow_mut() = text.to_string());
    let parsed = serde_saphyr::from_str_multiple_with_options::<Node, Collect<S>>(text, options());
    SOURCE.with(|s| s.borrow_mut().clear());
    parsed.map(|c| c.0).map_err(|e| in_kipam_terms(&e))
}

/// The parser's error in kipam's words: where, and what to do, without the parser's own
/// settings (`set DuplicateKeyPolicy in Options`) or internal names (`RecordedAnchorEvents`).
fn in_kipam_terms(err: &serde_saphyr::Error) -> String {
    use serde_saphyr::Error as E;
    use serde_saphyr::budget::BudgetBreach as B;
    let mut err = err.without_snippet();
    // Unwrapped down to the parser's own error: an alias adds where it was defined and used.
    while let E::AliasError { error, .. } | E::WithSnippet { error, .. } = err {
        err = error;
    }
    let at = err
        .location()
        .filter(|l| l.line() > 0)
        .map(|l| format!("line {} column {}: ", l.line(), l.column()))
        .unwrap_or_default();
    let aliases = "too many aliases: the anchors and aliases (`&name`, `*name`, `<<: *name`) \
                   expand to more than kipam reads (is it an alias bomb?); write the values out";
    let what = match err {
        E::DuplicateMappingKey { key: Some(key), .. } => format!(
            "the key `{key}` appears twice in one mapping; YAML allows each key once: remove \
             or rename one of them"
        ),
        E::DuplicateMappingKey { key: None, .. } => {
            "a key appears twice in one mapping; YAML allows each key once: remove or rename \
             one of them"
                .to_string()
        }
        E::AliasReplayLimitExceeded { .. }
        | E::AliasReplayCounterOverflow { .. }
        | E::AliasReplayStackDepthExceeded { .. } => aliases.to_string(),
        E::Budget { breach, .. } => match breach {
            B::Aliases { .. }
            | B::Anchors { .. }
            | B::MergeKeys { .. }
            | B::AliasAnchorRatio { .. }
            | B::RecordedAnchorEvents { .. }
            | B::RecordedAnchorBytes { .. } => aliases.to_string(),
            B::Depth { .. } => format!("nested more than {MAX_DEPTH} levels deep"),
            B::Documents { .. } => format!("more than {MAX_DOCUMENTS} documents in one file"),
            _ => format!(
                "larger than kipam reads in one file ({MAX_FILE_BYTES} bytes, 256 MiB, of \
                 ordinary YAML)"
            ),
        },
        other => {
            let text = other.to_string();
            // The parser ends its message with where; that is said first here.
            let text = match text.rfind(" at line ") {
                Some(i) if !at.is_empty() => text[..i].to_string(),
                _ => text,
            };
            return format!("{at}{}", text.trim_start_matches("error: "));
        }
    };
    format!("{at}{what}")
}

thread_local! {
    /// The text being parsed on this thread, for [`Node`] to slice scalars out of.
    static SOURCE: RefCell<String> = const { RefCell::new(String::new()) };
}

/// A [`RawNode`] as the parser hands it over: its value, line and, for scalars that are not
/// strings, the text as written.
struct Node(RawNode);

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        let spanned = Spanned::<Inner>::deserialize(d)?;
        let value = spanned.value.0;
        let line = Some(spanned.referenced.line()).filter(|l| *l > 0);
        let written = match value {
            RawValue::Null | RawValue::Bool(_) | RawValue::Int(_) | RawValue::Float(_) => {
                let span = spanned.referenced.span();
                span.byte_offset().zip(span.byte_len()).and_then(|(o, l)| {
                    SOURCE.with(|s| {
                        s.borrow()
                            .get(o as usize..(o + l) as usize)
                            .filter(|w| !w.is_empty())
                            .map(str::to_string)
                    })
                })
            }
            _ => None,
        };
        Ok(Node(RawNode {
            value,
            written,
            line,
        }))
    }
}

/// The value alone, read through [`RawVisitor`].
struct Inner(RawValue);

impl<'de> Deserialize<'de> for Inner {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Inner, D::Error> {
        d.deserialize_any(RawVisitor).map(Inner)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = RawValue;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E>(self) -> Result<RawValue, E> {
        Ok(RawValue::Null)
    }
    fn visit_none<E>(self) -> Result<RawValue, E> {
        Ok(RawValue::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<RawValue, D::Error> {
        d.deserialize_any(RawVisitor)
    }
    fn visit_bool<E>(self, v: bool) -> Result<RawValue, E> {
        Ok(RawValue::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<RawValue, E> {
        Ok(RawValue::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<RawValue, E> {
        Ok(RawValue::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<RawValue, E> {
        Ok(RawValue::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<RawValue, E> {
        Ok(i128::try_from(v)
            .map(RawValue::Int)
            .unwrap_or(RawValue::Float(v as f64)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<RawValue, E> {
        Ok(RawValue::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<RawValue, E> {
        Ok(RawValue::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<RawValue, E> {
        Ok(RawValue::String(v))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<RawValue, E> {
        Ok(RawValue::String(String::from_utf8_lossy(v).into_owned()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawValue, A::Error> {
        let mut items = Vec::new();
        while let Some(Node(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(RawValue::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawValue, A::Error> {
        let mut entries = Vec::new();
        while let Some((key, Node(value))) = map.next_entry::<String, Node>()? {
            entries.push((key, value));
        }
        Ok(RawValue::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_keep_their_written_form_and_line() {
        let docs = parse_stream("# c\na: 8.5\nb: 18446744073709551616\n---\n---\nc: yes\n")
            .expect("parses");
        assert_eq!(docs.len(), 2, "the empty document is dropped");
        let a = docs[0].get("a").expect("a");
        assert_eq!((a.as_written(), a.line), ("8.5".to_string(), Some(2)));
        assert_eq!(
            docs[0].get("b").map(RawNode::as_written).as_deref(),
            Some("18446744073709551616")
        );
        let c = docs[1].get("c").expect("c");
        assert_eq!(
            (c.value.clone(), c.as_written()),
            (RawValue::Bool(true), "yes".into())
        );
    }

    #[test]
    fn one_anchor_merged_into_many_objects() {
        let mut text = String::from("defaults: &d {type: range, allocationRange: 4}\ndcs:\n");
        for i in 0..2_000 {
            text.push_str(&format!("  dc-{i}: {{<<: *d, poolCidr: 10.0.0.0/24}}\n"));
        }
        let docs = parse_stream(&text).expect("parses");
        let dcs = docs[0].get("dcs").expect("dcs");
        let last = dcs.get("dc-1999").expect("last");
        assert_eq!(last.get_str("type"), Some("range"));
        // A bomb still stops: 9 levels of 10 aliases each is 10^9 replayed events.
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        assert!(parse_stream(&bomb).is_err());
    }

    #[test]
    fn more_than_the_default_1024_documents() {
        let text = "---\na: 1\n".repeat(5_000);
        assert_eq!(parse_stream(&text).map(|d| d.len()), Ok(5_000));
    }
}
