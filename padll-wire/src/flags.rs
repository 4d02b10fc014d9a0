//! Value parsers the binaries' command-line flags share (`cheferd`, `cheferd-lab`,
//! `policies`): plain functions, so the daemon's flags need none of the tools' crates.

use std::ops::RangeInclusive;

/// The value parser of integer flags: a whole number in `range`, its refusal naming the
/// range (clap, or the binaries' one-line refusal, adds the flag and the value). The flags that
/// use it set `allow_negative_numbers`, so that `-1` reaches it instead of reading as a flag.
pub fn whole<T>(
    range: RangeInclusive<T>,
) -> impl Fn(&str) -> Result<T, NotWhole> + Clone + Send + Sync + 'static
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Clone + Send + Sync + 'static,
{
    move |text| {
        text.parse()
            .ok()
            .filter(|n| range.contains(n))
            .ok_or_else(|| NotWhole {
                low: range.start().to_string(),
                high: range.end().to_string(),
            })
    }
}

/// A flag's value that is not a whole number in its range.
#[derive(Debug, thiserror::Error)]
#[error("must be a whole number from {low} to {high}")]
pub struct NotWhole {
    low: String,
    high: String,
}

#[cfg(test)]
mod tests {
    use super::whole;

    #[test]
    fn a_whole_number_in_range_is_taken_and_anything_else_names_the_range() {
        let seconds = whole(1..=10u64);
        assert_eq!(seconds("10").unwrap(), 10);
        for refused in ["0", "11", "-1", "1.5", "", "ten"] {
            let error = seconds(refused).unwrap_err();
            assert_eq!(error.to_string(), "must be a whole number from 1 to 10");
        }
    }
}
