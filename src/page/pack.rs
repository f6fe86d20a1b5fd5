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
use std::fmt::Write as _;

use serde::ser::{self, Serialize};
use serde_json::Value;

/// Packs values into units that share one shape table.
#[derive(Debug, Default)]
pub struct Packer {
    shapes: Vec<Vec<String>>,
    /// Shape by its keys, each followed by a NUL (no key holds one).
    ids: QuickMap<String, usize>,
    /// The length of the last unit written (room for the next).
    last_unit: usize,
}

/// Why a value cannot be packed (what JSON cannot hold either: a float that is not finite,
/// an enum variant with data).
#[derive(Debug, thiserror::Error)]
#[error("cannot pack the report's data: {0}")]
pub struct PackError(String);

impl ser::Error for PackError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        PackError(msg.to_string())
    }
}

impl Packer {
    /// The keys of every object shape, in the order units refer to them (shape `k` is at
    /// index `k - 1`).
    pub fn shapes(&self) -> &[Vec<String>] {
        &self.shapes
    }

    /// `value` as a unit, `[strings, packed]`, written as JSON text. The value is walked
    /// twice by its own `Serialize`: once to count its strings, once to write it; no JSON
    /// tree is built in between.
    pub fn unit<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<String, PackError> {
        let mut count = Walk {
            packer: self,
            counting: true,
            ids: QuickMap::default(),
            counts: Vec::new(),
            order: Vec::new(),
            next: 0,
            refs: Vec::new(),
            out: String::new(),
            keys: String::new(),
        };
        value.serialize(&mut count)?;
        let Walk {
            ids, counts, order, ..
        } = count;
        // The most frequent strings get the shortest references; ties by text, so a unit
        // packs the same every time.
        let mut repeated: Vec<(String, u32)> = ids
            .into_iter()
            .filter(|&(_, id)| counts[id as usize] > 1)
            .collect();
        repeated.sort_unstable_by(|a, b| {
            counts[b.1 as usize]
                .cmp(&counts[a.1 as usize])
                .then_with(|| a.0.cmp(&b.0))
        });
        let mut table: Vec<String> = Vec::new();
        // By string id: its index in the table, 0 when it is written out.
        let mut refs: Vec<usize> = vec![0; counts.len()];
        for (text, id) in repeated {
            let n = counts[id as usize] as usize;
            let index = table.len() + 1;
            // `[-i]` against the quoted text, each time, plus one entry in the table.
            let reference = digits(index) + 3;
            let literal = text.len() + 2;
            if n * literal > n * reference + literal + 1 {
                table.push(text);
                refs[id as usize] = index;
            }
        }
        let mut out = String::with_capacity(self.last_unit + self.last_unit / 4);
        out.push('[');
        out.push_str(&serde_json::to_string(&table).map_err(|e| PackError(e.to_string()))?);
        out.push(',');
        let mut write = Walk {
            packer: self,
            counting: false,
            ids: QuickMap::default(),
            counts: Vec::new(),
            order,
            next: 0,
            refs,
            out,
            keys: String::new(),
        };
        value.serialize(&mut write)?;
        let mut out = write.out;
        out.push(']');
        self.last_unit = out.len();
        Ok(out)
    }

    fn shape_of(&mut self, keys: &str) -> usize {
        if let Some(&k) = self.ids.get(keys) {
            return k;
        }
        self.shapes
            .push(keys.split_terminator('\0').map(str::to_string).collect());
        let k = self.shapes.len();
        self.ids.insert(keys.to_string(), k);
        k
    }
}

/// One walk over a value: counting its strings (`counting`), or writing it packed (`out`).
/// `keys` holds the keys of the objects being written, innermost last, each followed by a
/// NUL. Both walks meet the strings in the same order (the value's own `Serialize`), so the
/// writing walk finds each string's fate by its place in `order`, without hashing it again.
struct Walk<'p> {
    packer: &'p mut Packer,
    counting: bool,
    /// Counting: each distinct string's id, and how often it occurs.
    ids: QuickMap<String, u32>,
    counts: Vec<u32>,
    /// The id of every string met, in order; writing: the next one's place.
    order: Vec<u32>,
    next: usize,
    /// Writing: by id, the string's index in the unit's table (0: written out).
    refs: Vec<usize>,
    out: String,
    keys: String,
}

impl<'p> Walk<'p> {
    fn string(&mut self, s: &str) -> Result<(), PackError> {
        if self.counting {
            let id = match self.ids.get(s) {
                Some(&id) => id,
                None => {
                    let id = u32::try_from(self.counts.len())
                        .map_err(|_| PackError("too many strings in one unit".into()))?;
                    self.ids.insert(s.to_string(), id);
                    self.counts.push(0);
                    id
                }
            };
            self.counts[id as usize] += 1;
            self.order.push(id);
            return Ok(());
        }
        let reference = self
            .order
            .get(self.next)
            .and_then(|&id| self.refs.get(id as usize))
            .copied()
            .ok_or_else(|| PackError("the value changed between its two walks".into()))?;
        self.next += 1;
        if reference > 0 {
            let _ = write!(self.out, "[-{reference}]");
        } else {
            escape(&mut self.out, s);
        }
        Ok(())
    }

    fn raw(&mut self, text: std::fmt::Arguments<'_>) {
        if !self.counting {
            let _ = self.out.write_fmt(text);
        }
    }

    fn open<'w>(&'w mut self, array: bool) -> Compound<'w, 'p> {
        let start = self.out.len();
        let keys = self.keys.len();
        if !self.counting {
            self.out.push_str(if array { "[0" } else { "[" });
        }
        Compound {
            walk: self,
            start,
            keys,
            object: !array,
            first: true,
        }
    }
}

/// JSON's string escaping (the page's own escaping for HTML comes after).
fn escape(out: &mut String, s: &str) {
    out.push('"');
    // Runs that need no escape are copied whole.
    let mut from = 0;
    for (i, b) in s.bytes().enumerate() {
        let escaped = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..0x20 => "",
            _ => continue,
        };
        out.push_str(&s[from..i]);
        if escaped.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(escaped);
        }
        from = i + 1;
    }
    out.push_str(&s[from..]);
    out.push('"');
}

/// An array or an object being walked.
struct Compound<'w, 'p> {
    walk: &'w mut Walk<'p>,
    /// Where it starts in the output, and in the keys.
    start: usize,
    keys: usize,
    object: bool,
    first: bool,
}

impl Compound<'_, '_> {
    fn value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), PackError> {
        if !self.walk.counting && (!self.object || !self.first) {
            self.walk.out.push(',');
        }
        self.first = false;
        value.serialize(&mut *self.walk)
    }

    fn key(&mut self, key: &str) {
        self.walk.keys.push_str(key);
        self.walk.keys.push('\0');
    }

    fn close(self) -> Result<(), PackError> {
        if self.object {
            let k = self.walk.packer.shape_of(&self.walk.keys[self.keys..]);
            self.walk.keys.truncate(self.keys);
            if !self.walk.counting {
                // The shape is known once every key is: it goes first.
                let mut tag = [0u8; 24];
                let mut at = tag.len();
                if !self.first {
                    at -= 1;
                    tag[at] = b',';
                }
                let mut n = k;
                loop {
                    at -= 1;
                    tag[at] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                let tag = std::str::from_utf8(&tag[at..]).unwrap_or_default();
                self.walk.out.insert_str(self.start + 1, tag);
            }
        }
        if !self.walk.counting {
            self.walk.out.push(']');
        }
        Ok(())
    }
}

/// Booleans and integers: their JSON text is their own.
macro_rules! written_as_is {
    ($($name:ident($t:ty)),*) => {
        $(fn $name(self, v: $t) -> Result<(), PackError> {
            self.raw(format_args!("{v}"));
            Ok(())
        })*
    };
}

impl<'w, 'p> ser::Serializer for &'w mut Walk<'p> {
    type Ok = ();
    type Error = PackError;
    type SerializeSeq = Compound<'w, 'p>;
    type SerializeTuple = Compound<'w, 'p>;
    type SerializeTupleStruct = Compound<'w, 'p>;
    type SerializeTupleVariant = ser::Impossible<(), PackError>;
    type SerializeMap = Compound<'w, 'p>;
    type SerializeStruct = Compound<'w, 'p>;
    type SerializeStructVariant = ser::Impossible<(), PackError>;

    written_as_is!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64)
    );
    fn serialize_f32(self, v: f32) -> Result<(), PackError> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), PackError> {
        if !v.is_finite() {
            return Err(PackError(format!("{v} is not a JSON number")));
        }
        let text = serde_json::Number::from_f64(v)
            .map(|n| n.to_string())
            .unwrap_or_default();
        self.raw(format_args!("{text}"));
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), PackError> {
        self.string(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), PackError> {
        self.string(v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), PackError> {
        let mut seq = self.open(true);
        for b in v {
            seq.value(b)?;
        }
        seq.close()
    }
    fn serialize_none(self) -> Result<(), PackError> {
        self.raw(format_args!("null"));
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<(), PackError> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), PackError> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), PackError> {
        self.serialize_none()
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), PackError> {
        self.string(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<(), PackError> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: &T,
    ) -> Result<(), PackError> {
        Err(PackError(format!("the variant {variant} holds data")))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, PackError> {
        Ok(self.open(true))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, PackError> {
        Ok(self.open(true))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, PackError> {
        Ok(self.open(true))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, PackError> {
        Err(PackError(format!("the variant {variant} holds data")))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, PackError> {
        Ok(self.open(false))
    }
    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, PackError> {
        Ok(self.open(false))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, PackError> {
        Err(PackError(format!("the variant {variant} holds data")))
    }
}

/// Arrays of every kind: each value in turn.
macro_rules! values_in_turn {
    ($($kind:ident :: $method:ident),*) => {$(
        impl ser::$kind for Compound<'_, '_> {
            type Ok = ();
            type Error = PackError;
            fn $method<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), PackError> {
                self.value(v)
            }
            fn end(self) -> Result<(), PackError> {
                self.close()
            }
        }
    )*};
}

values_in_turn!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field
);

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = PackError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), PackError> {
        // Keys are few (the maps of the report are small); JSON's are strings.
        match serde_json::to_value(key) {
            Ok(Value::String(k)) => {
                self.key(&k);
                Ok(())
            }
            _ => Err(PackError("a map key that is not a string".into())),
        }
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), PackError> {
        self.value(v)
    }
    fn end(self) -> Result<(), PackError> {
        self.close()
    }
}

impl ser::SerializeStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = PackError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> Result<(), PackError> {
        self.key(key);
        self.value(v)
    }
    fn end(self) -> Result<(), PackError> {
        self.close()
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

/// A quick hash for the report's tables: the report hashes every string it writes (twice)
/// and the default hasher, built to resist chosen keys, was a tenth of its build time. The
/// keys here are the report's own texts, and a worst case would only be slower.
#[derive(Clone, Copy, Debug, Default)]
pub struct QuickHash;

impl std::hash::BuildHasher for QuickHash {
    type Hasher = QuickHasher;
    fn build_hasher(&self) -> QuickHasher {
        QuickHasher(0)
    }
}

/// Eight bytes at a time: rotate, mix the word in, multiply by an odd constant.
#[derive(Clone, Copy, Debug)]
pub struct QuickHasher(u64);

impl QuickHasher {
    fn word(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for QuickHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0; 8];
            w.copy_from_slice(c);
            self.word(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(w));
        }
    }
    fn write_u8(&mut self, n: u8) {
        self.word(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.word(n);
    }
    fn write_usize(&mut self, n: usize) {
        self.word(n as u64);
    }
    fn finish(&self) -> u64 {
        // The high bits are the best mixed; the table reads the low ones.
        self.0.rotate_left(26)
    }
}

/// A map with [`QuickHash`].
pub type QuickMap<K, V> = HashMap<K, V, QuickHash>;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn round_trip(p: &Packer, unit: &str) -> Value {
        let unit: Value = serde_json::from_str(unit).expect("JSON");
        unpack(&unit, p.shapes()).expect("unpacks")
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
            "numbers": [-1, 0, 1.5], "short": ["a", "a", "a"],
            "escaped": ["a \"quoted\" \\ back\nline\ttab\r\u{1}\u{1f}end", "é ü → 🙂 \"", "\n", ""]
        });
        let mut p = Packer::default();
        let unit = p.unit(&value).unwrap();
        assert_eq!(round_trip(&p, &unit), value);
        // Keys are written once per shape, in the shared table; a repeated name once per
        // unit.
        let text = unit.clone();
        assert!(!text.contains("cluster"), "{text}");
        assert_eq!(text.matches("metallb").count(), 1, "{text}");
        // A second unit shares the shapes and has its own strings.
        let other =
            json!({"cluster": "charlie", "pool": "other", "datacenter": "dc-2", "size": "1"});
        let second = p.unit(&other).unwrap();
        assert_eq!(round_trip(&p, &second), other);
        assert_eq!(p.shapes().len(), 4, "{:?}", p.shapes());
    }

    #[test]
    fn only_strings_worth_it_are_in_the_table() {
        let mut p = Packer::default();
        let unit = p
            .unit(&json!([
                "0",
                "0",
                "0",
                "a long name",
                "a long name",
                "once only"
            ]))
            .unwrap();
        let unit: Value = serde_json::from_str(&unit).unwrap();
        assert_eq!(unit[0], json!(["a long name"]));
        assert_eq!(unit[1], json!([0, "0", "0", "0", [-1], [-1], "once only"]));
    }
}
