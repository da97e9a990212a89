//! psktool's key file format, read by both ends of logcache's TLS: one `USERNAME:HEXKEY` line
//! per identity (what `psktool -u USER -p FILE` writes, and nbdkit, qemu and libnbd read).

use thiserror::Error;

/// Longest key accepted (psktool makes 32 bytes by default; OpenSSL's own limit is 256).
pub const MAX_PSK_BYTES: usize = 256;

/// Why a line of a PSK file is unusable (`line` counts from 1).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("line {line}: {what}; each line must be USERNAME:HEXKEY as psktool writes it")]
pub struct PskLineError {
    pub line: usize,
    pub what: &'static str,
}

/// Parses the whole file: (user name, key) in file order; blank lines are skipped.
pub fn parse_psk_file(text: &str) -> Result<Vec<(String, Vec<u8>)>, PskLineError> {
    let mut keys = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |what| PskLineError {
            line: index + 1,
            what,
        };
        let (name, hex) = line
            .split_once(':')
            .ok_or_else(|| bad("no ':' between the user name and the key"))?;
        if name.is_empty() {
            return Err(bad("the user name is empty"));
        }
        let key =
            decode_hex(hex).ok_or_else(|| bad("the key is not an even number of hex digits"))?;
        if key.is_empty() || key.len() > MAX_PSK_BYTES {
            return Err(bad("the key must be 1 to 256 bytes"));
        }
        keys.push((name.to_owned(), key));
    }
    Ok(keys)
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_psktool_lines_and_names_the_bad_line() {
        let keys = parse_psk_file("alice:00ff10\n\nbob:0a0B\n").unwrap();
        assert_eq!(
            keys,
            vec![
                ("alice".to_owned(), vec![0x00, 0xff, 0x10]),
                ("bob".to_owned(), vec![0x0a, 0x0b])
            ]
        );
        let error = parse_psk_file("alice:00ff\nbob:0g\n").unwrap_err();
        assert_eq!(error.line, 2);
        assert!(error.to_string().contains("hex"), "{error}");
        assert!(parse_psk_file("alice\n")
            .unwrap_err()
            .to_string()
            .contains("':'"));
        assert!(parse_psk_file(":00\n").is_err());
        assert!(parse_psk_file("a:\n").is_err());
        assert!(parse_psk_file(&format!("a:{}\n", "00".repeat(257))).is_err());
        assert!(parse_psk_file("\n").unwrap().is_empty());
    }

    #[test]
    fn hex_decoding_rejects_odd_lengths_and_non_hex() {
        assert_eq!(decode_hex("a1B2").unwrap(), vec![0xa1, 0xb2]);
        assert!(decode_hex("abc").is_none());
        assert!(decode_hex("zz").is_none());
        assert!(decode_hex("é1").is_none());
    }
}
