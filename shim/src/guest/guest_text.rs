//! Text the guest chose (agent error messages, the console) before it reaches containerd,
//! the shim's log or a user's terminal: bounded in length and without control characters,
//! so a guest can neither flood an error nor send escape sequences to whoever reads it.

/// The most bytes of one agent message passed on.
pub const MAX_MESSAGE: usize = 4096;

/// `text` with carriage returns dropped and other control characters but newline and tab
/// shown as `?`, cut to at most `max` bytes (on a character boundary) with a note that it
/// was cut.
pub fn clean(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.chars() {
        let c = match c {
            '\r' => continue,
            '\n' | '\t' => c,
            c if c.is_control() => '?',
            c => c,
        };
        if out.len() + c.len_utf8() > max {
            out.push_str(" [cut]");
            return out;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_replaced_and_lines_kept() {
        assert_eq!(clean("a\x1b[2Jb\r\nc\td\x07", 100), "a?[2Jb\nc\td?");
        assert_eq!(clean("caf\u{e9} \u{9b}x", 100), "caf\u{e9} ?x");
    }

    #[test]
    fn long_text_is_cut_on_a_character_boundary() {
        let cut = clean(&"\u{e9}".repeat(100), 11);
        assert_eq!(cut, format!("{} [cut]", "\u{e9}".repeat(5)));
        assert_eq!(clean(&"x".repeat(10), 10), "x".repeat(10));
        let flood = clean(&"y".repeat(10 * MAX_MESSAGE), MAX_MESSAGE);
        assert!(flood.len() <= MAX_MESSAGE + 6);
    }
}
