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
use std::net::IpAddr;

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
    /// Appends the text to `out`: what `to_string` gives, without the formatting machinery
    /// or a string of its own (the offline report writes millions of map cell bounds).
    pub fn push_to(&self, out: &mut String) {
        out.push_str(self.text().as_str());
    }

    /// The text as the standard library writes `Ipv4Addr` and `Ipv6Addr` (RFC 5952: lower
    /// case, no leading zeros, the longest run of two or more zero groups, the first of
    /// equals, as `::`; an IPv4-mapped address as `::ffff:a.b.c.d`), written here because
    /// the standard one goes through `fmt` for every group and costs several times more.
    /// `displays_as_the_standard_library_does` holds the two side by side.
    fn text(&self) -> Text {
        let mut t = Text {
            bytes: [0; 40],
            len: 0,
        };
        match self.family {
            Family::V4 => t.v4(self.value as u32),
            Family::V6 => {
                let groups: [u16; 8] =
                    std::array::from_fn(|i| (self.value >> (112 - 16 * i)) as u16);
                if groups[..5] == [0; 5] && groups[5] == 0xffff {
                    t.push_str(b"::ffff:");
                    t.v4(self.value as u32);
                    return t;
                }
                // The longest run of zero groups (the first of equals), if two or more long.
                let (mut best_at, mut best_len, mut run_at, mut run_len) = (0, 0, 0, 0);
                for (i, &g) in groups.iter().enumerate() {
                    if g == 0 {
                        if run_len == 0 {
                            run_at = i;
                        }
                        run_len += 1;
                        if run_len > best_len {
                            (best_at, best_len) = (run_at, run_len);
                        }
                    } else {
                        run_len = 0;
                    }
                }
                if best_len > 1 {
                    t.groups(&groups[..best_at]);
                    t.push_str(b"::");
                    t.groups(&groups[best_at + best_len..]);
                } else {
                    t.groups(&groups);
                }
            }
        }
        t
    }
}

/// An address's text on the stack: the longest, `ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff`,
/// is 39 bytes.
struct Text {
    bytes: [u8; 40],
    len: usize,
}

impl Text {
    fn push_str(&mut self, s: &[u8]) {
        self.bytes[self.len..self.len + s.len()].copy_from_slice(s);
        self.len += s.len();
    }

    fn v4(&mut self, v: u32) {
        for (i, octet) in v.to_be_bytes().into_iter().enumerate() {
            if i > 0 {
                self.push_str(b".");
            }
            let digits = [octet / 100, octet / 10 % 10, octet % 10];
            let skip = if octet >= 100 {
                0
            } else if octet >= 10 {
                1
            } else {
                2
            };
            for d in &digits[skip..] {
                self.push_str(&[b'0' + d]);
            }
        }
    }

    /// Groups in lower-case hex without leading zeros, `:` between them.
    fn groups(&mut self, groups: &[u16]) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for (i, &g) in groups.iter().enumerate() {
            if i > 0 {
                self.push_str(b":");
            }
            // Hex digits without the leading zeros (one for zero).
            let digits = (19 - g.leading_zeros().min(15)) / 4;
            for k in (0..digits).rev() {
                self.push_str(&[HEX[usize::from((g >> (4 * k)) & 0xf)]]);
            }
        }
    }

    fn as_str(&self) -> &str {
        // Only ASCII digits, letters, `:` and `.` are ever written.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl fmt::Display for AddressDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, like the standard library's address types: widths and precisions apply.
        f.pad(self.text().as_str())
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
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn displays_as_the_standard_library_does() {
        // Every placement of zero groups (each group zero or not), with varied non-zero
        // groups, the IPv4-mapped and -compatible forms, and IPv4 corners.
        let fill: [u16; 8] = [0x1, 0xdb8, 0xffff, 0x10, 0xabc, 0x7, 0x100, 0xf00d];
        let mut checked = 0;
        for mask in 0u32..256 {
            for rot in 0..8 {
                let mut v: u128 = 0;
                for i in 0..8 {
                    let g = if mask >> i & 1 == 1 {
                        fill[(i + rot) % 8]
                    } else {
                        0
                    };
                    v = v << 16 | u128::from(g);
                }
                let ours = Family::V6.display(v).to_string();
                assert_eq!(ours, Ipv6Addr::from(v).to_string(), "{v:#x}");
                checked += 1;
            }
        }
        for v4 in [
            0u32,
            1,
            0x0a00_0001,
            0x7f00_0001,
            0xc0a8_0a64,
            0xffff_ffff,
            0x0102_0304,
        ] {
            for v in [u128::from(v4), 0xffff_0000_0000 | u128::from(v4)] {
                assert_eq!(
                    Family::V6.display(v).to_string(),
                    Ipv6Addr::from(v).to_string()
                );
            }
            assert_eq!(
                Family::V4.display(u128::from(v4)).to_string(),
                Ipv4Addr::from(v4).to_string()
            );
        }
        // A simple generator over the whole space (no dependency): many more values.
        let mut x: u128 = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Zero some groups, as real pools have many.
            let mut v = x;
            for i in 0..8 {
                if (x >> (64 + i)) & 3 == 0 {
                    v &= !(0xffff << (16 * i));
                }
            }
            assert_eq!(
                Family::V6.display(v).to_string(),
                Ipv6Addr::from(v).to_string()
            );
            let v4 = (x >> 64) as u32;
            assert_eq!(
                Family::V4.display(u128::from(v4)).to_string(),
                Ipv4Addr::from(v4).to_string()
            );
        }
        // Widths and precisions as the standard library applies them.
        assert_eq!(
            format!("{:>12}|", Family::V6.display(1)),
            format!("{:>12}|", Ipv6Addr::from(1u128))
        );
        assert_eq!(
            format!("{:<16}|", Family::V4.display(0x0a00_0001)),
            "10.0.0.1        |"
        );
        let mut out = String::from("x ");
        Family::V6.display(0x2001_0db8 << 96).push_to(&mut out);
        assert_eq!(out, "x 2001:db8::");
        assert_eq!(checked, 2048);
    }

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
