//! The pages' escaper: askama's HTML escaping, plus bidirectional-text controls shown as
//! visible marks. A span or service name holding U+202E (RIGHT-TO-LEFT OVERRIDE) would
//! otherwise reverse the text after it on the page, so a name could pass for another, or
//! a number read backwards.
//!
//! Architecture invariant: every value a template prints goes through here (askama.toml);
//! only markup the server builds itself (charts, the guide) is printed `|safe`.

use std::fmt::{self, Write};

#[derive(Clone, Copy, Debug, Default)]
pub struct Html;

/// The embedding, override and isolate controls (U+202A–U+202E, U+2066–U+2069), which
/// change the order text is shown in; the plain marks (U+200E, U+200F) only nudge it.
fn reorders(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

impl askama::filters::Escaper for Html {
    fn write_escaped_str<W: Write>(&self, mut dest: W, string: &str) -> fmt::Result {
        let mut rest = string;
        while let Some(at) = rest.find(reorders) {
            askama::filters::Html.write_escaped_str(&mut dest, &rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            write!(dest, "[U+{:04X}]", u32::from(c))?;
            rest = &rest[at + c.len_utf8()..];
        }
        askama::filters::Html.write_escaped_str(dest, rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use askama::filters::Escaper as _;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        Html.write_escaped_str(&mut out, text).unwrap();
        out
    }

    #[test]
    fn reordering_controls_become_visible_and_html_is_escaped() {
        assert_eq!(
            escaped("GET /a\u{202E}kcehc<b>"),
            "GET /a[U+202E]kcehc&#60;b&#62;"
        );
        assert_eq!(escaped("\u{2066}x\u{2069}"), "[U+2066]x[U+2069]");
        assert_eq!(
            escaped("שלום \u{200F}ok"),
            "שלום \u{200F}ok",
            "RTL text itself stays"
        );
        assert_eq!(escaped(""), "");
    }
}
