//! Inclusive address ranges (`192.168.1.5-192.168.1.7`).

use std::fmt;
use std::str::FromStr;

use super::{AddressCount, AddressError, Cidr, Family, parse_address};

/// The addresses `first..=last` of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
// Aligned to 8 bytes, not the 16 a `u128` asks for: the padding made every allocation a seed
// holds 16 bytes larger, at 100,000 allocations held several times over (see
// `allocator::allocation`'s size test). Nothing borrows the bounds in place.
#[repr(Rust, packed(8))]
pub struct AddrRange {
    family: Family,
    first: u128,
    last: u128,
}

impl AddrRange {
    /// A range from its bounds; `None` when `first > last` or a bound is outside the family.
    pub fn new(family: Family, first: u128, last: u128) -> Option<Self> {
        (first <= last && last <= family.max_address()).then_some(AddrRange {
            family,
            first,
            last,
        })
    }

    /// Internal constructor for bounds already known to be ordered and in the family.
    pub(crate) fn from_bounds(family: Family, first: u128, last: u128) -> Self {
        debug_assert!(first <= last && last <= family.max_address());
        AddrRange {
            family,
            first,
            last,
        }
    }

    pub const fn family(&self) -> Family {
        self.family
    }

    pub const fn first(&self) -> u128 {
        self.first
    }

    pub const fn last(&self) -> u128 {
        self.last
    }

    /// Number of addresses in the range.
    pub const fn size(&self) -> AddressCount {
        AddressCount::span(self.first, self.last)
    }

    pub fn overlaps(&self, other: &AddrRange) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }

    /// Parses `a.b.c.d`, `first-last` or a CIDR, the forms an exclusion may take.
    pub fn parse_lenient(text: &str) -> Result<Self, AddressError> {
        if text.contains('/') {
            return text.parse::<Cidr>().map(|c| c.range());
        }
        text.parse()
    }
}

impl FromStr for AddrRange {
    type Err = AddressError;

    /// Parses `first-last` or a single address.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let Some((a, b)) = text.split_once('-') else {
            let (family, value) = parse_address(text)?;
            return Ok(AddrRange::from_bounds(family, value, value));
        };
        let (fa, first) = parse_address(a).map_err(|_| AddressError::InvalidAddress {
            value: text.to_string(),
        })?;
        let (fb, last) = parse_address(b).map_err(|_| AddressError::InvalidAddress {
            value: text.to_string(),
        })?;
        if fa != fb {
            return Err(AddressError::MixedFamilies {
                value: text.to_string(),
            });
        }
        AddrRange::new(fa, first, last).ok_or_else(|| AddressError::ReversedRange {
            value: text.to_string(),
        })
    }
}

/// Always `first-last`, even for one address, as KKP writes allocated ranges.
impl fmt::Display for AddrRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}",
            self.family.display(self.first),
            self.family.display(self.last)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_form() {
        let one: AddrRange = "192.168.1.1".parse().unwrap();
        assert_eq!(one.size(), AddressCount::from(1u64));
        assert_eq!(one.to_string(), "192.168.1.1-192.168.1.1");
        let span: AddrRange = "192.168.1.5 - 192.168.1.7".parse().unwrap();
        assert_eq!(span.size(), AddressCount::from(3u64));
        let cidr = AddrRange::parse_lenient("192.168.1.0/30").unwrap();
        assert_eq!(cidr.to_string(), "192.168.1.0-192.168.1.3");
        let v6: AddrRange = "2001:db8::1-2001:db8::ff".parse().unwrap();
        assert_eq!(v6.family(), Family::V6);
    }

    #[test]
    fn refuses_bad_ranges() {
        assert!(matches!(
            "192.168.1.7-192.168.1.5".parse::<AddrRange>(),
            Err(AddressError::ReversedRange { .. })
        ));
        assert!(matches!(
            "192.168.1.1-::1".parse::<AddrRange>(),
            Err(AddressError::MixedFamilies { .. })
        ));
        assert!(matches!(
            "192.168.1.1-x".parse::<AddrRange>(),
            Err(AddressError::InvalidAddress { .. })
        ));
    }
}
