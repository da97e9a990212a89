//! Sizes on the command line: a number of bytes with an optional K, M, G or T suffix (powers
//! of 1024; "KiB" and "k" are accepted too).

/// Parses "64M", "1G", "4096", "512KiB".
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err(format!(
            "{text:?} is negative; a size is 0 or more bytes, with an optional K, M, G or T suffix"
        ));
    }
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(digits_end);
    let bad = || {
        format!(
            "{text:?} is not a size; write a number with an optional K, M, G or T suffix, e.g. 1G"
        )
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// A size for humans: "4.0 KiB", "502.9 MiB", "1.5 GiB" (powers of 1024, one decimal), or
/// "512 bytes" below 1 KiB.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    assert!(unit < UNITS.len());
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::{human, parse_size};

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 bytes");
        assert_eq!(human(1023), "1023 bytes");
        assert_eq!(human(4096), "4.0 KiB");
        assert_eq!(human(527_319_040), "502.9 MiB");
        assert_eq!(human(8 << 30), "8.0 GiB");
        assert_eq!(human((8 << 30) - 4096), "8.0 GiB");
        assert_eq!(human(3 << 40), "3.0 TiB");
    }

    #[test]
    fn suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
