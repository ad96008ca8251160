//! Byte sizes on the command line (`4K`, `1M`, `64MiB`, `4096`) and in output.

use morris_proto::{MAX_STRIPE_UNIT, MIN_STRIPE_UNIT};

/// Parses a byte count: plain bytes, or a number with a binary suffix
/// (`K`/`KB`/`KiB`, `M`, `G`, `T`; case-insensitive; all multiples of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a size (examples: 4096, 4K, 1M, 64MiB)"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: number too large"))?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?} (use K, M, G or T, e.g. 64MiB)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?}: size too large"))
}

/// Parses a stripe unit: a size that is a power of two from 4 KiB to 64 MiB.
pub fn parse_stripe_unit(s: &str) -> Result<u32, String> {
    let n = parse_size(s)?;
    if !n.is_power_of_two() || n < u64::from(MIN_STRIPE_UNIT) || n > u64::from(MAX_STRIPE_UNIT) {
        return Err(format!(
            "stripe unit {s} ({n} bytes) must be a power of two from 4K to 64M"
        ));
    }
    u32::try_from(n).map_err(|_| format!("stripe unit {s} is too large"))
}

/// Formats bytes for people: `512 B`, `4 KiB`, `1.5 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 0;
    let mut v = bytes as f64;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if (v - v.round()).abs() < 0.05 {
        format!("{:.0} {}", v, UNITS[unit])
    } else {
        format!("{:.1} {}", v, UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2GB"), Ok(2 << 30));
        assert_eq!(parse_size(" 8 KiB "), Ok(8192));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("-4K").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("20000000T").is_err());
    }

    #[test]
    fn stripe_units_are_checked() {
        assert_eq!(parse_stripe_unit("4K"), Ok(4096));
        assert_eq!(parse_stripe_unit("64MiB"), Ok(64 << 20));
        assert_eq!(parse_stripe_unit("1048576"), Ok(1 << 20));
        assert!(parse_stripe_unit("2K").is_err());
        assert!(parse_stripe_unit("128M").is_err());
        assert!(parse_stripe_unit("12K").is_err());
        assert!(parse_stripe_unit("4G").is_err());
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(1 << 20), "1 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
