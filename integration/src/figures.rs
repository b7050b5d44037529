//! One line per benchmark figure, which `scripts/bench` (`make bench`) gathers from every
//! benchmark into one table: `figure:` then, tab-separated, the figure, its value, its
//! baseline (measured in the same run), their ratio and the target.

use std::fmt::Display;

/// The `figure:` line of one figure (tabs inside a field become spaces).
pub fn figure_line(
    name: &str,
    value: impl Display,
    baseline: impl Display,
    ratio: Option<f64>,
    target: &str,
) -> String {
    let field = |s: String| s.replace('\t', " ");
    let ratio = ratio.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}"));
    format!(
        "figure:\t{}\t{}\t{}\t{ratio}\t{}",
        field(name.to_owned()),
        field(value.to_string()),
        field(baseline.to_string()),
        field(target.to_owned())
    )
}

/// Prints [`figure_line`].
pub fn figure(
    name: &str,
    value: impl Display,
    baseline: impl Display,
    ratio: Option<f64>,
    target: &str,
) {
    println!("{}", figure_line(name, value, baseline, ratio, target));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_is_five_tab_separated_fields_after_its_tag() {
        let line = figure_line("exec p50", "81 ms", "runc 60 ms", Some(1.35), "<= 1.5");
        assert_eq!(line, "figure:\texec p50\t81 ms\trunc 60 ms\t1.35\t<= 1.5");
        let line = figure_line("a\tb", 3, "-", None, "");
        assert_eq!(line.split('\t').count(), 6, "{line}");
        assert!(line.contains("\ta b\t3\t-\t-\t"), "{line}");
    }
}
