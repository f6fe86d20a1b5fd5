//! A short, readable line for a set of address ranges, as `kubectl get ipa` shows it.
//!
//! - one address is written alone (`10.0.0.5`), a range as `first-last`;
//! - pieces are sorted and separated by `, `;
//! - an IPv4 address after the first is written from the first octet in which it differs from
//!   the address written just before it: `192.168.1.0, .2-.4, .8-.11`, `10.0.0.250-.1.5`.
//!   IPv6 addresses are always written in full (a shortened `::1f` would read as an address
//!   of its own);
//! - a line longer than [`MAX_SUMMARY`] keeps the pieces that fit and ends with the count:
//!   `10.0.0.0-.3, .8-.11, … (40 addresses in 10 pieces)`.

use std::fmt::Write;

use super::{AddrRange, AddressCount, Family};

/// The longest summary written in full.
pub const MAX_SUMMARY: usize = 64;
/// When the full line is too long: room for the pieces written before the count.
const SHOWN_BEFORE_COUNT: usize = 36;

/// The summary of `ranges` (in any order); empty when there are none.
pub fn summary(ranges: &[AddrRange]) -> String {
    let mut sorted = ranges.to_vec();
    sorted.sort();
    let parts = written(&sorted);
    let full = parts.join(", ");
    if full.chars().count() <= MAX_SUMMARY {
        return full;
    }
    let total = sorted
        .iter()
        .fold(AddressCount::ZERO, |sum, r| sum.saturating_add(r.size()));
    let mut out = String::new();
    for part in &parts {
        if !out.is_empty() && out.chars().count() + part.chars().count() + 2 > SHOWN_BEFORE_COUNT {
            break;
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push_str(part);
    }
    let _ = write!(out, ", … ({total} addresses in {} pieces)", sorted.len());
    out
}

/// The summary of pieces that are text: parsed ones as [`summary`] writes them; when one
/// does not parse as an address or range, or families are mixed, every piece as written
/// (shortened to a count of pieces when long).
pub fn summary_of_text<'a>(pieces: impl IntoIterator<Item = &'a str>) -> String {
    let texts: Vec<&str> = pieces.into_iter().collect();
    let parsed: Option<Vec<AddrRange>> = texts.iter().map(|t| t.parse().ok()).collect();
    if let Some(ranges) = parsed
        && ranges.windows(2).all(|w| w[0].family() == w[1].family())
    {
        return summary(&ranges);
    }
    let full = texts.join(", ");
    if full.chars().count() <= MAX_SUMMARY {
        return full;
    }
    let first: String = texts
        .first()
        .map(|t| t.chars().take(SHOWN_BEFORE_COUNT).collect())
        .unwrap_or_default();
    format!("{first}, … ({} pieces)", texts.len())
}

/// Each piece's text, each address shortened against the one written before it.
fn written(sorted: &[AddrRange]) -> Vec<String> {
    let mut previous: Option<(Family, u128)> = None;
    let mut parts = Vec::with_capacity(sorted.len());
    for r in sorted {
        let mut part = short(r.family(), r.first(), previous);
        previous = Some((r.family(), r.first()));
        if r.last() != r.first() {
            part.push('-');
            part.push_str(&short(r.family(), r.last(), previous));
            previous = Some((r.family(), r.last()));
        }
        parts.push(part);
    }
    parts
}

/// `value` written in full, or (IPv4 after an IPv4 address) from its first octet that
/// differs from `previous`'s, with a leading dot.
fn short(family: Family, value: u128, previous: Option<(Family, u128)>) -> String {
    let full = family.display(value).to_string();
    let Some((Family::V4, before)) = previous else {
        return full;
    };
    if family != Family::V4 {
        return full;
    }
    let octets = |v: u128| (v as u32).to_be_bytes();
    let (a, b) = (octets(value), octets(before));
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count().min(3);
    if shared == 0 {
        return full;
    }
    let rest: Vec<String> = a[shared..].iter().map(u8::to_string).collect();
    format!(".{}", rest.join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(texts: &[&str]) -> Vec<AddrRange> {
        texts.iter().map(|t| t.parse().expect("a range")).collect()
    }

    #[test]
    fn ipv4_pieces_are_shortened_against_the_address_before() {
        assert_eq!(
            summary(&ranges(&[
                "192.168.1.0-192.168.1.0",
                "192.168.1.2-192.168.1.4",
                "192.168.1.8-192.168.1.11",
            ])),
            "192.168.1.0, .2-.4, .8-.11"
        );
        // Across an octet, and into another network entirely.
        assert_eq!(
            summary(&ranges(&[
                "10.0.0.250-10.0.1.5",
                "10.0.1.9",
                "172.16.0.0-172.16.0.3"
            ])),
            "10.0.0.250-.1.5, .9, 172.16.0.0-.3"
        );
    }

    #[test]
    fn single_addresses_and_one_range_are_written_plainly() {
        assert_eq!(summary(&ranges(&["10.0.0.5-10.0.0.5"])), "10.0.0.5");
        assert_eq!(summary(&ranges(&["10.0.0.0-10.0.0.3"])), "10.0.0.0-.3");
        assert_eq!(summary(&[]), "");
    }

    #[test]
    fn pieces_are_sorted() {
        assert_eq!(
            summary(&ranges(&["10.0.0.8-10.0.0.11", "10.0.0.0-10.0.0.3"])),
            "10.0.0.0-.3, .8-.11"
        );
    }

    #[test]
    fn ipv6_addresses_are_written_in_full() {
        assert_eq!(
            summary(&ranges(&["2001:db8::10-2001:db8::1f"])),
            "2001:db8::10-2001:db8::1f"
        );
        assert_eq!(
            summary(&ranges(&["2001:db8::1", "2001:db8::3-2001:db8::4"])),
            "2001:db8::1, 2001:db8::3-2001:db8::4"
        );
    }

    #[test]
    fn a_long_list_ends_with_the_count() {
        let pieces: Vec<String> = (0..10)
            .map(|i| format!("10.0.0.{}-10.0.0.{}", i * 8, i * 8 + 3))
            .collect();
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let line = summary(&ranges(&refs));
        assert_eq!(
            line,
            "10.0.0.0-.3, .8-.11, .16-.19, … (40 addresses in 10 pieces)"
        );
        let v6: Vec<String> = (0..5)
            .map(|i| format!("2001:db8::{:x}0-2001:db8::{:x}f", i * 2, i * 2))
            .collect();
        let refs: Vec<&str> = v6.iter().map(String::as_str).collect();
        assert_eq!(
            summary(&ranges(&refs)),
            "2001:db8::-2001:db8::f, … (80 addresses in 5 pieces)"
        );
        // A huge IPv6 range stays short and its count exact.
        assert_eq!(
            summary(&ranges(&["2001:db8::-2001:db8::ffff:ffff:ffff:ffff"])),
            "2001:db8::-2001:db8::ffff:ffff:ffff:ffff"
        );
    }

    #[test]
    fn text_that_does_not_parse_is_shown_as_written() {
        assert_eq!(
            summary_of_text(["10.0.0.0-10.0.0.3", "10.0.0.9"]),
            "10.0.0.0-.3, .9"
        );
        assert_eq!(
            summary_of_text(["10.0.0.0-10.0.0.3", "ten"]),
            "10.0.0.0-10.0.0.3, ten"
        );
        let many: Vec<String> = (0..20).map(|i| format!("bad-{i}")).collect();
        assert_eq!(
            summary_of_text(many.iter().map(String::as_str)),
            "bad-0, … (20 pieces)"
        );
    }
}
