//! Memory quantities as Kubernetes writes them (`512Mi`, `1.5Gi`, `268435456`, `1G`, `1e9`).

const MIB: u128 = 1024 * 1024;

/// The largest power of ten a quantity may carry (`1e30` bytes is far beyond any machine).
const MAX_EXPONENT: u32 = 30;

/// Parses a memory quantity into whole MiB, with Kubernetes' grammar: a number with an
/// optional sign and decimal point (`1.5`, `.5`), then a binary suffix (`Ki`, `Mi`, `Gi`, `Ti`,
/// `Pi`, `Ei`), a decimal one (`n`, `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`) or an exponent
/// (`e3`, `E-2`). Plain numbers are bytes; a fraction of a byte is rounded up, as Kubernetes
/// does. The result must be a positive whole number of MiB; anything else is an error that
/// says why.
pub fn parse_memory_mib(value: &str) -> Result<u64, String> {
    let value = value.trim();
    if value.is_empty() {
        return Err("empty".into());
    }
    let (negative, unsigned) = match value.as_bytes()[0] {
        b'-' => (true, &value[1..]),
        b'+' => (false, &value[1..]),
        _ => (false, value),
    };
    let split = unsigned
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err("expected a number of bytes or a quantity such as 512Mi or 1.5Gi".into());
    }
    // The number is mantissa / 10^decimals, times the suffix's numerator / denominator.
    let too_large = || "number too large".to_string();
    let decimals = u32::try_from(fraction.len()).map_err(|_| too_large())?;
    let mantissa: u128 = format!("{whole}{fraction}")
        .parse()
        .map_err(|_| too_large())?;
    let (numerator, denominator) = scale(suffix)?;
    let denominator = 10u128
        .checked_pow(decimals)
        .and_then(|d| d.checked_mul(denominator))
        .ok_or_else(too_large)?;
    let scaled = mantissa.checked_mul(numerator).ok_or_else(too_large)?;
    let bytes = scaled.div_ceil(denominator);
    if negative || bytes == 0 {
        return Err("must be greater than zero".into());
    }
    if bytes % MIB != 0 {
        return Err("must be a whole number of MiB".into());
    }
    u64::try_from(bytes / MIB).map_err(|_| too_large())
}

/// A suffix's factor as numerator / denominator.
fn scale(suffix: &str) -> Result<(u128, u128), String> {
    let power = |exp: u32| {
        10u128
            .checked_pow(exp)
            .ok_or_else(|| "number too large".to_string())
    };
    Ok(match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "n" => (1, power(9)?),
        "u" => (1, power(6)?),
        "m" => (1, power(3)?),
        "k" => (power(3)?, 1),
        "M" => (power(6)?, 1),
        "G" => (power(9)?, 1),
        "T" => (power(12)?, 1),
        "P" => (power(15)?, 1),
        "E" => (power(18)?, 1),
        _ => {
            let exponent = suffix
                .strip_prefix(['e', 'E'])
                .and_then(|e| e.parse::<i32>().ok())
                .ok_or_else(|| {
                    format!(
                        "unknown unit {suffix:?} (use Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E or an exponent such as e6)"
                    )
                })?;
            if exponent.unsigned_abs() > MAX_EXPONENT {
                return Err(format!("exponent {exponent} is out of range"));
            }
            if exponent >= 0 {
                (power(exponent.unsigned_abs())?, 1)
            } else {
                (1, power(exponent.unsigned_abs())?)
            }
        }
    })
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
    fn fractions_exponents_and_signs_as_kubernetes_writes_them() {
        assert_eq!(parse_memory_mib("1.5Gi"), Ok(1536));
        assert_eq!(parse_memory_mib(".5Gi"), Ok(512));
        assert_eq!(
            parse_memory_mib("0.25Mi"),
            Err("must be a whole number of MiB".into())
        );
        assert_eq!(parse_memory_mib("+2Mi"), Ok(2));
        assert_eq!(parse_memory_mib("1048576e0"), Ok(1));
        assert_eq!(parse_memory_mib("1.048576e6"), Ok(1));
        assert_eq!(parse_memory_mib("1048576000m"), Ok(1));
        assert_eq!(parse_memory_mib("1Pi"), Ok(1 << 30));
        assert_eq!(parse_memory_mib("1Ei"), Ok(1 << 40));
        // A fraction of a byte is rounded up, as Kubernetes does.
        assert_eq!(parse_memory_mib("1048575.5"), Ok(1));
    }

    #[test]
    fn rejects_words_units_and_fractions() {
        assert!(parse_memory_mib("lots").is_err());
        assert!(parse_memory_mib("").is_err());
        assert!(parse_memory_mib("-1Gi").is_err());
        assert!(parse_memory_mib("12Xi").is_err());
        assert!(parse_memory_mib("1.5.1Gi").is_err());
        assert!(parse_memory_mib(".Gi").is_err());
        assert!(parse_memory_mib("1e31").is_err());
        assert!(parse_memory_mib("1e-31").is_err());
        assert!(parse_memory_mib("1e").is_err());
        assert!(parse_memory_mib("1Gib").is_err());
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
        fn fractions_of_a_gibibyte(tenths in 1u64..10_000) {
            // x.5Gi is a whole number of MiB for every x.
            prop_assert_eq!(parse_memory_mib(&format!("{}.{}Gi", tenths / 2, if tenths % 2 == 1 { "5" } else { "0" })), Ok(tenths * 512));
        }

        #[test]
        fn never_panics(s in "[-+]?[0-9.]{0,40}([eE][-+]?[0-9]{0,4}|[KMGTPE]i?|[numk])?|.*") {
            let _ = parse_memory_mib(&s);
        }
    }
}
