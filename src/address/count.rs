//! Exact address counts.
//!
//! A pool may be as large as the whole IPv6 space (2^128 addresses), one more than `u128` can
//! hold, and sums and percentages of such counts must never wrap. `AddressCount` is an unsigned
//! 192-bit integer with just the arithmetic the allocator and the status reports need. No
//! floating point is involved anywhere, so figures are exact for every pool size.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// A number of addresses, exact up to 2^192 − 1 (far beyond the 2^128 of the IPv6 space).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AddressCount {
    /// Little-endian 64-bit limbs.
    limbs: [u64; 3],
}

impl AddressCount {
    pub const ZERO: AddressCount = AddressCount { limbs: [0; 3] };

    pub const fn from_u128(value: u128) -> Self {
        AddressCount {
            limbs: [value as u64, (value >> 64) as u64, 0],
        }
    }

    /// The number of addresses in the inclusive interval `first..=last` (`first <= last`).
    pub const fn span(first: u128, last: u128) -> Self {
        let diff = last.wrapping_sub(first);
        match diff.checked_add(1) {
            Some(n) => Self::from_u128(n),
            None => Self::pow2(128),
        }
    }

    /// 2^`exp`; `exp` above 191 saturates at the maximum.
    pub const fn pow2(exp: u32) -> Self {
        if exp >= 192 {
            return AddressCount {
                limbs: [u64::MAX; 3],
            };
        }
        let mut limbs = [0u64; 3];
        limbs[(exp / 64) as usize] = 1u64 << (exp % 64);
        AddressCount { limbs }
    }

    pub const fn is_zero(&self) -> bool {
        self.limbs[0] == 0 && self.limbs[1] == 0 && self.limbs[2] == 0
    }

    /// The count as `u128`, when it fits (every count but that of a whole `::/0`).
    pub const fn to_u128(self) -> Option<u128> {
        if self.limbs[2] != 0 {
            return None;
        }
        Some(((self.limbs[1] as u128) << 64) | self.limbs[0] as u128)
    }

    /// The count as `u64`, when it fits.
    pub const fn to_u64(self) -> Option<u64> {
        if self.limbs[1] != 0 || self.limbs[2] != 0 {
            return None;
        }
        Some(self.limbs[0])
    }

    /// Sum, saturating at the maximum (unreachable for sums of address counts).
    pub fn saturating_add(self, other: Self) -> Self {
        let mut out = [0u64; 3];
        let mut carry = false;
        for (i, slot) in out.iter_mut().enumerate() {
            let (a, c1) = self.limbs[i].overflowing_add(other.limbs[i]);
            let (b, c2) = a.overflowing_add(carry as u64);
            *slot = b;
            carry = c1 || c2;
        }
        if carry {
            return Self::pow2(192);
        }
        AddressCount { limbs: out }
    }

    /// Difference, or `None` when `other` is larger.
    pub fn checked_sub(self, other: Self) -> Option<Self> {
        if other > self {
            return None;
        }
        let mut out = [0u64; 3];
        let mut borrow = false;
        for (i, slot) in out.iter_mut().enumerate() {
            let (a, b1) = self.limbs[i].overflowing_sub(other.limbs[i]);
            let (b, b2) = a.overflowing_sub(borrow as u64);
            *slot = b;
            borrow = b1 || b2;
        }
        Some(AddressCount { limbs: out })
    }

    /// Difference, clamped at zero.
    pub fn saturating_sub(self, other: Self) -> Self {
        self.checked_sub(other).unwrap_or(Self::ZERO)
    }

    /// Product with a small factor, saturating at the maximum.
    pub fn saturating_mul_u64(self, factor: u64) -> Self {
        let mut out = [0u64; 3];
        let mut carry: u128 = 0;
        for (i, slot) in out.iter_mut().enumerate() {
            let wide = self.limbs[i] as u128 * factor as u128 + carry;
            *slot = wide as u64;
            carry = wide >> 64;
        }
        if carry != 0 {
            return Self::pow2(192);
        }
        AddressCount { limbs: out }
    }

    /// `floor(100 * self / whole)`, clamped to 100; 0 when `whole` is zero.
    pub fn percent_of(self, whole: Self) -> u8 {
        if whole.is_zero() || self.is_zero() {
            return 0;
        }
        if self >= whole {
            return 100;
        }
        let scaled = self.saturating_mul_u64(100);
        // The answer lies in 0..=100: a binary search over `whole * q <= scaled` is exact.
        let (mut lo, mut hi) = (0u64, 100u64);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if whole.saturating_mul_u64(mid) <= scaled {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo as u8
    }

    /// `self * 100 >= whole * percent`: the exact threshold test behind capacity conditions.
    pub fn reaches_percent(self, whole: Self, percent: u8) -> bool {
        self.saturating_mul_u64(100) >= whole.saturating_mul_u64(percent as u64)
    }

    /// Divides in place by a small divisor and returns the remainder.
    fn div_rem_u64(&mut self, divisor: u64) -> u64 {
        let mut rem: u128 = 0;
        for limb in self.limbs.iter_mut().rev() {
            let cur = (rem << 64) | *limb as u128;
            *limb = (cur / divisor as u128) as u64;
            rem = cur % divisor as u128;
        }
        rem as u64
    }
}

impl From<u128> for AddressCount {
    fn from(value: u128) -> Self {
        Self::from_u128(value)
    }
}

impl From<u64> for AddressCount {
    fn from(value: u64) -> Self {
        Self::from_u128(value as u128)
    }
}

impl Ord for AddressCount {
    fn cmp(&self, other: &Self) -> Ordering {
        self.limbs.iter().rev().cmp(other.limbs.iter().rev())
    }
}

impl PartialOrd for AddressCount {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for AddressCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const CHUNK: u64 = 10_000_000_000_000_000_000; // 10^19, the largest power of ten in u64
        let mut rest = *self;
        let mut chunks = Vec::new();
        loop {
            chunks.push(rest.div_rem_u64(CHUNK));
            if rest.is_zero() {
                break;
            }
        }
        let mut text = String::new();
        for (i, chunk) in chunks.iter().rev().enumerate() {
            if i == 0 {
                text.push_str(&chunk.to_string());
            } else {
                text.push_str(&format!("{chunk:019}"));
            }
        }
        f.pad(&text)
    }
}

impl fmt::Debug for AddressCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A count that is not a decimal number or does not fit in 192 bits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not an address count (a non-negative decimal integer)")]
pub struct ParseCountError {
    pub value: String,
}

impl FromStr for AddressCount {
    type Err = ParseCountError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseCountError {
            value: s.to_string(),
        };
        if s.is_empty() {
            return Err(err());
        }
        let mut acc = AddressCount::ZERO;
        let max = AddressCount::pow2(192);
        for c in s.chars() {
            let digit = c.to_digit(10).ok_or_else(err)?;
            let next = acc
                .saturating_mul_u64(10)
                .saturating_add(AddressCount::from(digit as u64));
            if next == max {
                return Err(err());
            }
            acc = next;
        }
        Ok(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_ipv6_space_is_exact() {
        let all = AddressCount::span(0, u128::MAX);
        assert_eq!(all, AddressCount::pow2(128));
        assert_eq!(all.to_string(), "340282366920938463463374607431768211456");
        assert_eq!(all.to_u128(), None);
        assert_eq!(
            all.checked_sub(AddressCount::from(1u64))
                .and_then(|c| c.to_u128()),
            Some(u128::MAX)
        );
    }

    #[test]
    fn slash_48_has_two_to_the_eighty() {
        assert_eq!(
            AddressCount::pow2(80).to_string(),
            "1208925819614629174706176"
        );
    }

    #[test]
    fn arithmetic_and_order() {
        let a = AddressCount::from(u128::MAX);
        let b = AddressCount::from(1u64);
        let sum = a.saturating_add(b);
        assert_eq!(sum, AddressCount::pow2(128));
        assert!(sum > a);
        assert_eq!(sum.checked_sub(a), Some(b));
        assert_eq!(b.checked_sub(a), None);
        assert_eq!(b.saturating_sub(a), AddressCount::ZERO);
    }

    #[test]
    fn percentages_are_floored_and_exact() {
        let total = AddressCount::pow2(128);
        let part = AddressCount::pow2(127);
        assert_eq!(part.percent_of(total), 50);
        assert_eq!(AddressCount::from(2u64).percent_of(3u64.into()), 66);
        assert_eq!(AddressCount::from(7u64).percent_of(10u64.into()), 70);
        assert_eq!(total.percent_of(total), 100);
        assert_eq!(AddressCount::ZERO.percent_of(AddressCount::ZERO), 0);
        assert!(AddressCount::from(7u64).reaches_percent(10u64.into(), 70));
        assert!(!AddressCount::from(69u64).reaches_percent(100u64.into(), 70));
    }

    #[test]
    fn parses_and_rejects() {
        assert_eq!(
            "340282366920938463463374607431768211456".parse::<AddressCount>(),
            Ok(AddressCount::pow2(128))
        );
        assert!("".parse::<AddressCount>().is_err());
        assert!("-1".parse::<AddressCount>().is_err());
        assert!("12a".parse::<AddressCount>().is_err());
        assert!("9".repeat(80).parse::<AddressCount>().is_err());
    }
}
