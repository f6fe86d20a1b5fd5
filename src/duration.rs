//! The one reader of every duration kipam's resources hold (`reuseAfter`,
//! `growth.shrinkAfter`): the same forms, the same bounds check and the same error text for
//! each, in whole seconds. Pure: it knows nothing of kipam's domain; each field passes its
//! own [`Bounds`].
//!
//! Two forms are read, and every text either of them reads is accepted, so a value stored
//! under an older kipam stays readable:
//!
//! - kipam's short form: whole numbers with the units `d`, `h`, `m` and `s`, largest first,
//!   each at most once (`90s`, `10m`, `1h30m`, `2d`), read exactly whatever the number's
//!   size, so that a value too large is told as such;
//! - anything else jiff reads as a span (`1w`, `1h 30m`, `2 days`, ISO 8601 `PT10M`),
//!   with days and weeks of 24 hours; months and years, which have no fixed length, are
//!   refused. A bare `0` is zero.

use k8s_openapi::jiff::{Span, SpanTotal, Unit};

/// The shortest and longest duration a field takes, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub min: u64,
    pub max: u64,
}

const UNITS: [(char, u64); 4] = [('d', 86_400), ('h', 3_600), ('m', 60), ('s', 1)];

/// Reads `text` as a duration within `bounds`, in whole seconds. The error says what is
/// wrong with the value (the caller names the field and the value).
pub fn parse(text: &str, bounds: Bounds) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err(format!("is empty; {}", advice(bounds)));
    }
    let not_a_duration = || format!("is not a duration: {}", advice(bounds));
    let seconds = if t == "0" {
        0
    } else if short_form(t) {
        // Exact; where it refuses, jiff may still read it (`1000ms`).
        match short(t) {
            Ok(seconds) => seconds,
            Err(why) => match spelled(t) {
                Ok(seconds) => seconds,
                Err(Some(why)) => return Err(why),
                Err(None) => return Err(format!("{why}; {}", advice(bounds))),
            },
        }
    } else {
        spelled(t).map_err(|why| why.unwrap_or_else(not_a_duration))?
    };
    if seconds > u128::from(bounds.max) {
        return Err(format!("is too large: {}", range(bounds)));
    }
    if seconds < u128::from(bounds.min) {
        return Err(format!("is too small: {}", range(bounds)));
    }
    Ok(seconds as u64)
}

/// A duration as kipam writes it: `90d`, `1h30m`, `0s`.
pub fn text(seconds: u64) -> String {
    if seconds == 0 {
        return "0s".into();
    }
    let mut rest = seconds;
    let mut out = String::new();
    for (unit, size) in UNITS {
        if rest >= size {
            out.push_str(&format!("{}{unit}", rest / size));
            rest %= size;
        }
    }
    out
}

fn range(bounds: Bounds) -> String {
    if bounds.min == 0 {
        format!("it must be at most {}", text(bounds.max))
    } else {
        format!(
            "it must be between {} and {}",
            text(bounds.min),
            text(bounds.max)
        )
    }
}

fn advice(bounds: Bounds) -> String {
    format!(
        "write a duration such as 30s, 10m, 1h30m or 7d ({})",
        range(bounds)
    )
}

/// Only digits and the short form's units: read (and judged) as the short form.
fn short_form(t: &str) -> bool {
    t.chars()
        .all(|c| c.is_ascii_digit() || UNITS.iter().any(|(u, _)| *u == c))
}

/// The short form, exact (a number of any length is read; the bounds judge it).
fn short(t: &str) -> Result<u128, String> {
    let mut total: u128 = 0;
    let mut number = String::new();
    let mut last_unit: Option<usize> = None;
    for ch in t.chars() {
        if ch.is_ascii_digit() {
            number.push(ch);
            continue;
        }
        let rank = UNITS.iter().position(|(u, _)| *u == ch).unwrap_or(0);
        if number.is_empty() {
            return Err(format!("has a unit `{ch}` without a number before it"));
        }
        if last_unit.is_some_and(|l| l >= rank) {
            return Err("gives a unit twice or out of order (1h30m, not 30m1h)".into());
        }
        // Past 2^100 seconds nothing is in bounds: saturate rather than overflow.
        let value = number
            .trim_start_matches('0')
            .parse::<u128>()
            .unwrap_or(if number.trim_start_matches('0').is_empty() {
                0
            } else {
                1 << 100
            })
            .min(1 << 100);
        total = total.saturating_add(value.saturating_mul(u128::from(UNITS[rank].1)));
        number.clear();
        last_unit = Some(rank);
    }
    if !number.is_empty() {
        return Err(format!("ends with `{number}` without a unit"));
    }
    Ok(total)
}

/// Any form jiff reads; `Err(None)` when jiff does not read it.
fn spelled(t: &str) -> Result<u128, Option<String>> {
    let span: Span = t.parse().map_err(|_| None)?;
    if span.is_negative() {
        return Err(Some("must not be negative".into()));
    }
    let total = span
        .total(SpanTotal::from(Unit::Second).days_are_24_hours())
        .map_err(|_| None)?;
    if total.fract() != 0.0 {
        return Err(Some("must be whole seconds".into()));
    }
    // Exact below 2^53, far above any bound; anything larger is too large either way.
    Ok(if total >= 9.0e15 {
        u128::MAX
    } else {
        total as u128
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const REUSE: Bounds = Bounds {
        min: 0,
        max: 90 * 86_400,
    };
    const SHRINK: Bounds = Bounds {
        min: 60,
        max: 30 * 86_400,
    };

    #[test]
    fn both_forms_read_in_whole_seconds() {
        assert_eq!(parse("90s", REUSE), Ok(90));
        assert_eq!(parse("1h30m", REUSE), Ok(5_400));
        assert_eq!(parse("2d", REUSE), Ok(172_800));
        assert_eq!(parse("0", REUSE), Ok(0));
        assert_eq!(parse("1w", REUSE), Ok(604_800));
        assert_eq!(parse("PT10M", REUSE), Ok(600));
        assert_eq!(parse("1h 30m", REUSE), Ok(5_400));
        assert_eq!(parse(" 10m ", SHRINK), Ok(600));
        // Only units of the short form, yet not the short form: jiff reads it.
        assert_eq!(parse("1000ms", REUSE), Ok(1));
    }

    #[test]
    fn every_refusal_says_why_with_the_same_words_for_every_field() {
        let advice = "write a duration such as 30s, 10m, 1h30m or 7d (it must be at most 90d)";
        assert_eq!(parse("", REUSE), Err(format!("is empty; {advice}")));
        assert_eq!(
            parse("soon", REUSE),
            Err(format!("is not a duration: {advice}"))
        );
        assert_eq!(
            parse("10", REUSE),
            Err(format!("ends with `10` without a unit; {advice}"))
        );
        assert_eq!(
            parse("30m1h", REUSE),
            Err(format!(
                "gives a unit twice or out of order (1h30m, not 30m1h); {advice}"
            ))
        );
        assert_eq!(
            parse("m", REUSE),
            Err(format!(
                "has a unit `m` without a number before it; {advice}"
            ))
        );
        assert_eq!(parse("-5m", REUSE), Err("must not be negative".into()));
        assert_eq!(parse("1.5s", REUSE), Err("must be whole seconds".into()));
        assert_eq!(
            parse("1 month", SHRINK),
            Err("is not a duration: write a duration such as 30s, 10m, 1h30m or 7d (it must be between 1m and 30d)".into())
        );
    }

    #[test]
    fn too_large_is_told_as_too_large_however_large() {
        for big in [
            "91d",
            "99999999999999999999d",
            "999999999999999999999999999999s",
            "100000000h",
            "20000w",
        ] {
            assert_eq!(
                parse(big, REUSE),
                Err("is too large: it must be at most 90d".into()),
                "{big}"
            );
        }
        assert_eq!(
            parse("31d", SHRINK),
            Err("is too large: it must be between 1m and 30d".into())
        );
        assert_eq!(
            parse("30s", SHRINK),
            Err("is too small: it must be between 1m and 30d".into())
        );
    }

    #[test]
    fn durations_are_written_back_in_the_short_form() {
        assert_eq!(text(0), "0s");
        assert_eq!(text(60), "1m");
        assert_eq!(text(5_400), "1h30m");
        assert_eq!(text(90 * 86_400 + 1), "90d1s");
        for s in [1, 59, 3_601, 86_399, 7_776_000] {
            assert_eq!(parse(&text(s), REUSE), Ok(s));
        }
    }
}
