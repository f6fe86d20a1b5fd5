//! IP addresses as plain integers.
//!
//! Every address, IPv4 or IPv6, is held as a `u128` together with its [`Family`]; IPv4 addresses
//! occupy `0..2^32`. Ranges are inclusive on both ends so that the last address of the IPv6
//! space needs no special case. Parsing is strict: a CIDR with host bits set is refused rather
//! than silently masked, because a typo in a pool definition should never move the pool.

mod cidr;
mod count;
mod range;
pub mod summary;

pub use cidr::Cidr;
pub use count::{AddressCount, ParseCountError};
pub use range::AddrRange;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The address family of a pool, range or CIDR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// Width of an address in bits.
    pub const fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// The highest address of the family.
    pub const fn max_address(self) -> u128 {
        match self {
            Family::V4 => u32::MAX as u128,
            Family::V6 => u128::MAX,
        }
    }

    /// Renders an address of this family in its usual text form.
    pub fn display(self, value: u128) -> AddressDisplay {
        AddressDisplay {
            family: self,
            value,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// Text form of one address (see [`Family::display`]).
#[derive(Clone, Copy)]
pub struct AddressDisplay {
    family: Family,
    value: u128,
}

impl AddressDisplay {
    /// Appends the text to `out` without a string of its own (the offline report writes
    /// millions of map cell bounds).
    pub fn push_to(&self, out: &mut String) {
        use std::fmt::Write;
        // Writing into a `String` cannot fail.
        let _ = write!(out, "{self}");
    }
}

impl fmt::Display for AddressDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.family {
            Family::V4 => Ipv4Addr::from(self.value as u32).fmt(f),
            Family::V6 => Ipv6Addr::from(self.value).fmt(f),
        }
    }
}

/// Why a piece of text is not an address, range or CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("{value:?} is not an IP address")]
    InvalidAddress { value: String },
    #[error("{value:?} is not a CIDR: {reason}")]
    InvalidCidr { value: String, reason: String },
    #[error("{value:?} has host bits set: the network is {network}")]
    HostBitsSet { value: String, network: String },
    #[error("{value:?} is not a range: the first address is after the last")]
    ReversedRange { value: String },
    #[error("{value:?} mixes IPv4 and IPv6 addresses")]
    MixedFamilies { value: String },
}

/// Parses one IPv4 or IPv6 address.
pub fn parse_address(text: &str) -> Result<(Family, u128), AddressError> {
    match text.trim().parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => Ok((Family::V4, u32::from(v4) as u128)),
        Ok(IpAddr::V6(v6)) => Ok((Family::V6, u128::from(v6))),
        Err(_) => Err(AddressError::InvalidAddress {
            value: text.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_families() {
        assert_eq!(parse_address("192.168.1.1"), Ok((Family::V4, 0xc0a8_0101)));
        assert_eq!(parse_address("::1"), Ok((Family::V6, 1)));
        assert_eq!(
            parse_address("192.168.1.256"),
            Err(AddressError::InvalidAddress {
                value: "192.168.1.256".into()
            })
        );
    }

    #[test]
    fn displays_both_families() {
        assert_eq!(Family::V4.display(0xc0a8_0101).to_string(), "192.168.1.1");
        assert_eq!(Family::V6.display(1).to_string(), "::1");
    }
}
