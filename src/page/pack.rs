//! A lossless, generic packing of JSON for the offline report: the same values, fewer bytes.
//!
//! The report inlines, for every pool datacenter, the JSON the served page fetches. Written
//! plainly, most of it is keys repeated in every object (`largestFreeBlock`,
//! `fragmentationPercent`, …) and names repeated in every row (the pool, the datacenter, the
//! cluster). Packed:
//!
//! - an object is `[k, v1, v2, …]`: `k ≥ 1` names its keys, in order, in the shape table
//!   shared by the whole report ([`Packer::shapes`]), and the values follow;
//! - an array is `[0, item1, item2, …]`;
//! - a string that occurs more than once in a unit (see below), where that saves bytes, is
//!   `[-i]`: the `i`-th string of the unit's own table; any other string stays as it is;
//! - numbers, `true`, `false` and `null` stay as they are.
//!
//! A unit is `[strings, value]`: one pool datacenter, or the summary. Each carries its own
//! string table, so the page unpacks only the unit it shows. Unpacking knows nothing of what
//! the values mean: it puts the keys back and looks strings up (`unpack` in the page's
//! script), so what the page draws is exactly the JSON the Rust side made.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// Packs values into units that share one shape table.
#[derive(Debug, Default)]
pub struct Packer {
    shapes: Vec<Vec<String>>,
    /// Shape by its keys, each followed by a NUL (no key holds one).
    ids: HashMap<String, usize>,
    key: String,
}

impl Packer {
    /// The keys of every object shape, in the order units refer to them (shape `k` is at
    /// index `k - 1`).
    pub fn shapes(&self) -> &[Vec<String>] {
        &self.shapes
    }

    /// `value` as a unit: `[strings, packed]`.
    pub fn unit(&mut self, value: Value) -> Value {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        count_strings(&value, &mut counts);
        // The most frequent strings get the shortest references; ties by text, so a unit
        // packs the same every time.
        let mut repeated: Vec<(&str, usize)> = counts.into_iter().filter(|&(_, n)| n > 1).collect();
        repeated.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut table: Vec<Value> = Vec::new();
        let mut refs: HashMap<String, usize> = HashMap::new();
        for (text, n) in repeated {
            let index = table.len() + 1;
            // `[-i]` against the quoted text, each time, plus one entry in the table.
            let reference = digits(index) + 3;
            let literal = text.len() + 2;
            if n * literal > n * reference + literal + 1 {
                refs.insert(text.to_string(), index);
                table.push(Value::String(text.to_string()));
            }
        }
        let packed = self.pack(value, &refs);
        Value::Array(vec![Value::Array(table), packed])
    }

    fn pack(&mut self, value: Value, refs: &HashMap<String, usize>) -> Value {
        match value {
            Value::String(s) => match refs.get(&s) {
                Some(&i) => Value::Array(vec![Value::from(-(i as i64))]),
                None => Value::String(s),
            },
            Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len() + 1);
                out.push(Value::from(0));
                out.extend(items.into_iter().map(|v| self.pack(v, refs)));
                Value::Array(out)
            }
            Value::Object(map) => {
                let shape = self.shape_of(&map);
                let mut out = Vec::with_capacity(map.len() + 1);
                out.push(Value::from(shape));
                out.extend(map.into_iter().map(|(_, v)| self.pack(v, refs)));
                Value::Array(out)
            }
            other => other,
        }
    }

    fn shape_of(&mut self, map: &Map<String, Value>) -> usize {
        self.key.clear();
        for k in map.keys() {
            self.key.push_str(k);
            self.key.push('\0');
        }
        if let Some(&k) = self.ids.get(self.key.as_str()) {
            return k;
        }
        self.shapes.push(map.keys().cloned().collect());
        let k = self.shapes.len();
        self.ids.insert(self.key.clone(), k);
        k
    }
}

fn count_strings<'a>(value: &'a Value, counts: &mut HashMap<&'a str, usize>) {
    match value {
        Value::String(s) => *counts.entry(s.as_str()).or_default() += 1,
        Value::Array(items) => items.iter().for_each(|v| count_strings(v, counts)),
        Value::Object(map) => map.values().for_each(|v| count_strings(v, counts)),
        _ => {}
    }
}

/// A unit unpacked: the value [`Packer::unit`] was given. The page's script does the same
/// (`unpack` in `app.js`); this one is for checks (tests, and reading a report back).
pub fn unpack(unit: &Value, shapes: &[Vec<String>]) -> Result<Value, String> {
    let strings = unit
        .get(0)
        .and_then(Value::as_array)
        .ok_or("a unit starts with its strings")?;
    unpack_in(unit.get(1).unwrap_or(&Value::Null), strings, shapes)
}

fn unpack_in(v: &Value, strings: &[Value], shapes: &[Vec<String>]) -> Result<Value, String> {
    let Value::Array(items) = v else {
        return Ok(v.clone());
    };
    let tag = items.first().and_then(Value::as_i64).ok_or("no tag")?;
    let rest = || items[1..].iter().map(|x| unpack_in(x, strings, shapes));
    match usize::try_from(tag) {
        Err(_) => usize::try_from(-tag - 1)
            .ok()
            .and_then(|i| strings.get(i))
            .cloned()
            .ok_or_else(|| format!("no string {tag}")),
        Ok(0) => rest().collect::<Result<Vec<_>, _>>().map(Value::Array),
        Ok(k) => {
            let keys = shapes.get(k - 1).ok_or_else(|| format!("no shape {k}"))?;
            let values = rest().collect::<Result<Vec<_>, _>>()?;
            Ok(Value::Object(keys.iter().cloned().zip(values).collect()))
        }
    }
}

fn digits(n: usize) -> usize {
    n.to_string().len()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn round_trip(p: &Packer, unit: &Value) -> Value {
        unpack(unit, p.shapes()).expect("unpacks")
    }

    #[test]
    fn a_unit_unpacks_to_the_same_value() {
        let value = json!({
            "pool": "metallb", "datacenter": "dc-1", "count": 3, "ok": true, "none": null,
            "holders": [
                {"cluster": "alpha", "pool": "metallb", "datacenter": "dc-1", "size": "8"},
                {"cluster": "bravo", "pool": "metallb", "datacenter": "dc-1", "size": "8"},
                {"cluster": "bravo", "pool": "metallb", "message": "x"}
            ],
            "empty": [], "nested": [[1, 2], [], [-1], [0]], "emptyObject": {},
            "numbers": [-1, 0, 1.5], "short": ["a", "a", "a"]
        });
        let mut p = Packer::default();
        let unit = p.unit(value.clone());
        assert_eq!(round_trip(&p, &unit), value);
        // Keys are written once per shape, in the shared table; a repeated name once per
        // unit.
        let text = unit.to_string();
        assert!(!text.contains("cluster"), "{text}");
        assert_eq!(text.matches("metallb").count(), 1, "{text}");
        // A second unit shares the shapes and has its own strings.
        let other =
            json!({"cluster": "charlie", "pool": "other", "datacenter": "dc-2", "size": "1"});
        let second = p.unit(other.clone());
        assert_eq!(round_trip(&p, &second), other);
        assert_eq!(p.shapes().len(), 4, "{:?}", p.shapes());
    }

    #[test]
    fn only_strings_worth_it_are_in_the_table() {
        let mut p = Packer::default();
        let unit = p.unit(json!([
            "0",
            "0",
            "0",
            "a long name",
            "a long name",
            "once only"
        ]));
        assert_eq!(unit[0], json!(["a long name"]));
        assert_eq!(unit[1], json!([0, "0", "0", "0", [-1], [-1], "once only"]));
    }
}
