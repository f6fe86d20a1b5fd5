//! Address filters and tests for addon templates.
//!
//! All arithmetic goes through [`crate::address`], on `u128`, so IPv6 is as exact as IPv4:
//! `"2001:db8::/32" | nth_host(-1)` is the last address of the block, not a rounded float.
//!
//! Inputs are strings in the forms kipam itself writes: a single address (`192.168.1.5`), a
//! CIDR (`192.168.1.0/26`; host bits are allowed where the filter only needs the block, as in
//! `192.168.1.5/26`), a range (`192.168.1.0-192.168.1.7`), or — for filters that count or pick
//! addresses — a list of those, such as a range allocation's `Addresses`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use minijinja::value::{StringInput, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

use crate::address::{AddrRange, AddressCount, Cidr, Family, parse_address};

/// Registers every filter and test of this module. `max_string` bounds the strings the
/// filters build (the renderer's `--max-addon-size`).
pub(crate) fn register(env: &mut Environment<'_>, max_string: Arc<AtomicUsize>) {
    env.add_filter("nth_host", nth_host);
    env.add_filter("prefix_len", prefix_len);
    env.add_filter("netmask", netmask);
    env.add_filter("network", network);
    env.add_filter("broadcast", broadcast);
    env.add_filter("ip_family", ip_family);
    env.add_filter("address_count", address_count);
    env.add_filter("to_yaml", move |state: &State, value: &Value| {
        let yaml = to_yaml(state, value)?;
        let limit = max_string.load(Ordering::Relaxed);
        match yaml.as_str() {
            Some(text) if text.len() > limit => Err(invalid(
                "to_yaml",
                format!(
                    "the YAML is {} bytes, over the {limit}-byte bound (--max-addon-size)",
                    text.len()
                ),
            )),
            _ => Ok(yaml),
        }
    });
    env.add_filter("as_bool", as_bool);
    env.add_filter("items", items);
    env.add_function("fail", fail);
    env.add_test("ipv4", is_ipv4);
    env.add_test("ipv6", is_ipv6);
}

/// One parsed address-like string.
enum Net {
    /// A single address.
    Address(Family, u128),
    /// A CIDR block; the address as written may have host bits set.
    Block(Cidr),
    /// `first-last`.
    Range(AddrRange),
}

impl Net {
    fn parse(text: &str) -> Option<Net> {
        let text = text.trim();
        if let Some((addr, len)) = text.split_once('/') {
            let (family, value) = parse_address(addr).ok()?;
            let len: u8 = len.trim().parse().ok()?;
            if len > family.bits() {
                return None;
            }
            let host_bits = u32::from(family.bits() - len);
            let host_mask = u128::MAX.checked_shr(128 - host_bits).unwrap_or(0);
            return Cidr::new(family, value & !host_mask, len).map(Net::Block);
        }
        if text.contains('-') {
            return text.parse().ok().map(Net::Range);
        }
        parse_address(text)
            .ok()
            .map(|(family, value)| Net::Address(family, value))
    }

    fn family(&self) -> Family {
        match self {
            Net::Address(family, _) => *family,
            Net::Block(cidr) => cidr.family(),
            Net::Range(range) => range.family(),
        }
    }

    /// Every address the input stands for, as one range.
    fn range(&self) -> AddrRange {
        match self {
            Net::Address(family, value) => AddrRange::from_bounds(*family, *value, *value),
            Net::Block(cidr) => cidr.range(),
            Net::Range(range) => *range,
        }
    }

    /// The input as a CIDR block: a block as such, a single address as a full-length block,
    /// a range only when it is exactly one aligned block.
    fn as_block(&self) -> Option<Cidr> {
        match self {
            Net::Block(cidr) => Some(*cidr),
            Net::Address(family, value) => Cidr::new(*family, *value, family.bits()),
            Net::Range(range) => {
                let span = range.last() - range.first();
                // An aligned block has a span of 2^k - 1 and a first address aligned to 2^k.
                if span & span.wrapping_add(1) != 0 || range.first() & span != 0 {
                    return None;
                }
                let host_bits = 128 - span.leading_zeros();
                let len = u32::from(range.family().bits()).checked_sub(host_bits)?;
                Cidr::new(range.family(), range.first(), u8::try_from(len).ok()?)
            }
        }
    }
}

/// Fails on an undefined input the way the engine does, so that the message names the
/// undefined expression (`Cluster.Nmae`) rather than the filter's expectations.
fn defined(state: &State, value: &Value) -> Result<(), Error> {
    if value.is_undefined() {
        StringInput::new(state, value)?;
    }
    Ok(())
}

/// minijinja's `items`, except that an undefined input is reported by name: the built-in one
/// only says "cannot convert value into pairs", which hides a typo in a map's path.
fn items(state: &State, value: &Value) -> Result<Value, Error> {
    defined(state, value)?;
    minijinja::filters::items(value)
}

fn invalid(filter: &str, message: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{filter}: {message}"))
}

/// The string inside `value`, or an error naming the filter and what it got.
fn text<'v>(filter: &str, value: &'v Value, expected: &str) -> Result<&'v str, Error> {
    match value.kind() {
        ValueKind::String => Ok(value.as_str().unwrap_or_default()),
        ValueKind::Undefined => Err(Error::from(ErrorKind::UndefinedError)),
        kind => Err(invalid(filter, format!("expects {expected}, got a {kind}"))),
    }
}

fn parse(filter: &str, text: &str, expected: &str) -> Result<Net, Error> {
    Net::parse(text).ok_or_else(|| invalid(filter, format!("{text:?} is not {expected}")))
}

const ANY: &str = "an address, CIDR or range";
const ANY_OR_LIST: &str = "an address, CIDR or range, or a list of them";
const CIDR: &str = "a CIDR such as 192.168.1.0/26";

/// Parses a CIDR-only input (`network`, `broadcast`, `netmask`).
fn block(filter: &str, value: &Value) -> Result<Cidr, Error> {
    let text = text(filter, value, CIDR)?;
    match parse(filter, text, CIDR)? {
        Net::Block(cidr) => Ok(cidr),
        _ => Err(invalid(filter, format!("{text:?} is not {CIDR}"))),
    }
}

/// Parses one string or a list of strings into ranges of a single family, in order.
fn pieces(filter: &str, value: &Value) -> Result<(Family, Vec<AddrRange>), Error> {
    let nets = match value.kind() {
        ValueKind::Seq | ValueKind::Iterable => {
            let mut nets = Vec::new();
            for item in value.try_iter()? {
                let text = text(filter, &item, ANY_OR_LIST)?;
                nets.push(parse(filter, text, ANY)?);
            }
            nets
        }
        _ => vec![parse(filter, text(filter, value, ANY_OR_LIST)?, ANY)?],
    };
    let Some(first) = nets.first() else {
        return Err(invalid(filter, "got an empty list"));
    };
    let family = first.family();
    if nets.iter().any(|net| net.family() != family) {
        return Err(invalid(filter, "the list mixes IPv4 and IPv6"));
    }
    Ok((family, nets.iter().map(Net::range).collect()))
}

/// `value | nth_host(n)`: the address at index `n` of a block, range or list of pieces,
/// counting from 0 at the first address (the network address of a CIDR); a negative `n`
/// counts back from the last address (`-1`).
fn nth_host(state: &State, value: &Value, n: i128) -> Result<String, Error> {
    defined(state, value)?;
    const NAME: &str = "nth_host";
    let (family, pieces) = pieces(NAME, value)?;
    let from_end = n < 0;
    // Offset from the start (or, for negative n, from the end), exact in u128.
    let mut offset = if from_end {
        n.unsigned_abs() - 1
    } else {
        n.unsigned_abs()
    };
    let ordered: Box<dyn Iterator<Item = &AddrRange>> = if from_end {
        Box::new(pieces.iter().rev())
    } else {
        Box::new(pieces.iter())
    };
    for piece in ordered {
        let span = piece.last() - piece.first();
        if offset <= span {
            let address = if from_end {
                piece.last() - offset
            } else {
                piece.first() + offset
            };
            return Ok(family.display(address).to_string());
        }
        // `span + 1` overflows only for the whole IPv6 space, which every offset fits in.
        offset -= span + 1;
    }
    let total = pieces
        .iter()
        .fold(AddressCount::ZERO, |sum, p| sum.saturating_add(p.size()));
    Err(invalid(
        NAME,
        format!(
            "index {n} is outside the {total} addresses of {}",
            describe(value)
        ),
    ))
}

/// `value | prefix_len`: the prefix length of a CIDR (32 or 128 for a single address, the
/// block's length for a range that is exactly one aligned block).
fn prefix_len(state: &State, value: &Value) -> Result<u8, Error> {
    defined(state, value)?;
    const NAME: &str = "prefix_len";
    let text = text(NAME, value, ANY)?;
    parse(NAME, text, ANY)?
        .as_block()
        .map(|cidr| cidr.prefix_len())
        .ok_or_else(|| invalid(NAME, format!("{text:?} is not one CIDR block")))
}

/// `value | netmask`: the netmask of a CIDR (`255.255.255.192`, `ffff:ffff::`).
fn netmask(state: &State, value: &Value) -> Result<String, Error> {
    defined(state, value)?;
    let cidr = block("netmask", value)?;
    Ok(cidr.family().display(cidr.netmask()).to_string())
}

/// `value | network`: the first address of a CIDR (`192.168.1.5/26` → `192.168.1.0`).
fn network(state: &State, value: &Value) -> Result<String, Error> {
    defined(state, value)?;
    let cidr = block("network", value)?;
    Ok(cidr.family().display(cidr.first()).to_string())
}

/// `value | broadcast`: the last address of a CIDR (for IPv6, which has no broadcast, the
/// last address of the block all the same).
fn broadcast(state: &State, value: &Value) -> Result<String, Error> {
    defined(state, value)?;
    let cidr = block("broadcast", value)?;
    Ok(cidr.family().display(cidr.last()).to_string())
}

/// `value | ip_family`: `IPv4` or `IPv6`, the spelling of Kubernetes' `ipFamilies`.
fn ip_family(state: &State, value: &Value) -> Result<String, Error> {
    defined(state, value)?;
    let (family, _) = pieces("ip_family", value)?;
    Ok(family.to_string())
}

/// `value | address_count`: how many addresses a block, range or list of pieces holds.
fn address_count(state: &State, value: &Value) -> Result<Value, Error> {
    defined(state, value)?;
    const NAME: &str = "address_count";
    let (_, pieces) = pieces(NAME, value)?;
    let total = pieces
        .iter()
        .fold(AddressCount::ZERO, |sum, p| sum.saturating_add(p.size()));
    total.to_u128().map(Value::from).ok_or_else(|| {
        invalid(
            NAME,
            format!("{total} addresses do not fit in a template integer"),
        )
    })
}

/// `value | to_yaml`: the value as YAML, without a trailing newline, ready for `indent`.
fn to_yaml(state: &State, value: &Value) -> Result<Value, Error> {
    defined(state, value)?;
    if value.is_undefined() {
        return Err(Error::from(ErrorKind::UndefinedError));
    }
    let yaml = serde_saphyr::to_string(value)
        .map_err(|err| invalid("to_yaml", format!("cannot write YAML: {err}")))?;
    Ok(Value::from_safe_string(
        yaml.trim_end_matches('\n').to_string(),
    ))
}

/// `value | as_bool`: a flag variable as a boolean. Accepts `true`/`false`, their string
/// forms in any case (operators often quote them), and none; anything else is an error
/// rather than a guess, so `"no"` cannot silently mean "yes".
fn as_bool(state: &State, value: &Value) -> Result<bool, Error> {
    defined(state, value)?;
    const NAME: &str = "as_bool";
    match value.kind() {
        ValueKind::Bool => Ok(value.is_true()),
        ValueKind::None => Ok(false),
        ValueKind::Undefined => Err(Error::from(ErrorKind::UndefinedError)),
        ValueKind::String => match value.as_str().unwrap_or_default().trim() {
            s if s.eq_ignore_ascii_case("true") => Ok(true),
            s if s.eq_ignore_ascii_case("false") => Ok(false),
            s => Err(invalid(NAME, format!("expects true or false, got {s:?}"))),
        },
        kind => Err(invalid(
            NAME,
            format!("expects true or false, got a {kind}"),
        )),
    }
}

/// `fail(message)`: stops rendering with the template's own message, for input a template
/// cannot handle (`{{ fail("unknown allocation type " ~ allocation.Type) }}`).
fn fail(message: &str) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.to_string()))
}

/// `value is ipv4`: an IPv4 address, CIDR or range.
fn is_ipv4(value: &Value) -> bool {
    family_of(value) == Some(Family::V4)
}

/// `value is ipv6`: an IPv6 address, CIDR or range.
fn is_ipv6(value: &Value) -> bool {
    family_of(value) == Some(Family::V6)
}

fn family_of(value: &Value) -> Option<Family> {
    value.as_str().and_then(Net::parse).map(|net| net.family())
}

/// A short description of a filter's input for messages.
fn describe(value: &Value) -> String {
    match value.as_str() {
        Some(text) => format!("{text:?}"),
        None => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` with an engine state, as filters get when a template calls them.
    fn with_state<T>(f: impl FnOnce(&State) -> T) -> T {
        let env = Environment::new();
        f(&env.empty_state())
    }

    fn s(text: &str) -> Value {
        Value::from(text)
    }

    #[test]
    fn blocks_with_host_bits_are_masked() {
        with_state(|st| {
            assert_eq!(
                network(st, &s("192.168.1.77/26")).ok(),
                Some("192.168.1.64".into())
            );
            assert_eq!(
                broadcast(st, &s("192.168.1.77/26")).ok(),
                Some("192.168.1.127".into())
            );
            assert_eq!(network(st, &s("::1/0")).ok(), Some("::".into()));
        });
    }

    #[test]
    fn ranges_that_are_blocks_have_a_prefix_length() {
        with_state(|st| {
            assert_eq!(prefix_len(st, &s("10.0.0.0-10.0.0.255")).ok(), Some(24));
            assert_eq!(prefix_len(st, &s("0.0.0.0-255.255.255.255")).ok(), Some(0));
            let all = s("::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff");
            assert_eq!(prefix_len(st, &all).ok(), Some(0));
            assert!(prefix_len(st, &s("10.0.0.1-10.0.0.2")).is_err());
            assert!(prefix_len(st, &s("10.0.0.2-10.0.0.5")).is_err());
            assert_eq!(prefix_len(st, &s("2001:db8::1")).ok(), Some(128));
        });
    }

    #[test]
    fn nth_host_spans_the_whole_ipv6_space() {
        with_state(|st| {
            let all = s("::/0");
            let max = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
            assert_eq!(nth_host(st, &all, -1).ok(), Some(max.into()));
            assert_eq!(
                nth_host(st, &all, i128::MAX).ok(),
                Some("7fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".into())
            );
            assert_eq!(nth_host(st, &all, i128::MIN).ok(), Some("8000::".into()));
        });
    }

    #[test]
    fn counts_beyond_u64_are_exact() {
        with_state(|st| {
            let count = address_count(st, &s("2001:db8::/64")).ok();
            assert_eq!(count, Some(Value::from(1u128 << 64)));
            let pieces = Value::from(vec!["::/1", "8000::/1"]);
            assert!(address_count(st, &pieces).is_err(), "2^128 does not fit");
        });
    }
}
