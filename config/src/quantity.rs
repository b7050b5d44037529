//! Memory quantities as Kubernetes writes them (`512Mi`, `1Gi`, `268435456`, `1G`).

const MIB: u128 = 1024 * 1024;

/// Parses a memory quantity into whole MiB. Plain numbers are bytes. Binary (`Ki`, `Mi`,
/// `Gi`, `Ti`) and decimal (`k`, `M`, `G`, `T`) suffixes are accepted. The result must be a
/// positive whole number of MiB; anything else is an error that says why.
pub fn parse_memory_mib(value: &str) -> Result<u64, String> {
    let value = value.trim();
    if value.is_empty() {
        return Err("empty".into());
    }
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (digits, suffix) = value.split_at(split);
    if digits.is_empty() {
        return Err("expected a number of bytes or a quantity such as 512Mi".into());
    }
    let number: u128 = digits.parse().map_err(|_| "number too large".to_string())?;
    let factor: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} (use Ki, Mi, Gi, Ti, k, M, G or T)"
            ))
        }
    };
    let bytes = number
        .checked_mul(factor)
        .ok_or_else(|| "number too large".to_string())?;
    if bytes == 0 {
        return Err("must be greater than zero".into());
    }
    if bytes % MIB != 0 {
        return Err("must be a whole number of MiB".into());
    }
    u64::try_from(bytes / MIB).map_err(|_| "number too large".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn binary_and_decimal_units() {
        assert_eq!(parse_memory_mib("512Mi"), Ok(512));
        assert_eq!(parse_memory_mib("1Gi"), Ok(1024));
        assert_eq!(parse_memory_mib("268435456"), Ok(256));
        assert_eq!(parse_memory_mib("2048Ki"), Ok(2));
        assert_eq!(parse_memory_mib("1048576000"), Ok(1000));
    }

    #[test]
    fn rejects_words_units_and_fractions() {
        assert!(parse_memory_mib("lots").is_err());
        assert!(parse_memory_mib("").is_err());
        assert!(parse_memory_mib("-1Gi").is_err());
        assert!(parse_memory_mib("12Xi").is_err());
        assert!(parse_memory_mib("1.5Gi").is_err());
        assert!(parse_memory_mib("0").is_err());
        assert!(parse_memory_mib("1000").is_err());
        assert!(parse_memory_mib("99999999999999999999999999999999999999999Ti").is_err());
    }

    proptest! {
        #[test]
        fn mebibytes_round_trip(mib in 1u64..1 << 40) {
            prop_assert_eq!(parse_memory_mib(&format!("{mib}Mi")), Ok(mib));
            prop_assert_eq!(parse_memory_mib(&format!("{}", mib as u128 * MIB)), Ok(mib));
        }

        #[test]
        fn never_panics(s in ".*") {
            let _ = parse_memory_mib(&s);
        }
    }
}
