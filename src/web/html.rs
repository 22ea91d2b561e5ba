//! The one way the web view writes HTML: markup is `&'static str` (written
//! in this crate, never data), and every value goes through [`escape`], so
//! a job name, a note or a job's output cannot become markup.

use std::fmt::Write as _;

/// A page being written.
#[derive(Default)]
pub struct Html(String);

impl Html {
    /// Markup of the crate's own (a literal: no value can reach it).
    pub fn raw(&mut self, markup: &'static str) -> &mut Self {
        self.0.push_str(markup);
        self
    }

    /// A value, escaped (text or attribute value).
    pub fn text(&mut self, value: &str) -> &mut Self {
        escape_into(&mut self.0, value);
        self
    }

    /// A displayable value, escaped.
    pub fn show(&mut self, value: impl std::fmt::Display) -> &mut Self {
        let mut s = String::new();
        let _ = write!(s, "{value}");
        self.text(&s)
    }

    /// `<td>value</td>`.
    pub fn cell(&mut self, value: &str) -> &mut Self {
        self.raw("<td>").text(value).raw("</td>")
    }

    /// `<a href="/prefix/SEGMENT">label</a>`: the segment percent-encoded,
    /// the whole escaped.
    pub fn link(&mut self, prefix: &'static str, segment: &str, label: &str) -> &mut Self {
        self.raw("<a href=\"")
            .raw(prefix)
            .text(&path_segment(segment))
            .raw("\">")
            .text(label)
            .raw("</a>")
    }

    pub fn finish(self) -> String {
        self.0
    }
}

/// Escapes `&`, `<`, `>`, `"` and `'`: safe in text and in a quoted
/// attribute value.
fn escape_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

/// `s` as one path segment: every byte but `A-Z a-z 0-9 - . _ ~` as `%XX`.
pub fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A percent-encoded path segment decoded; `None` if it is not UTF-8 or
/// holds a bad escape.
pub fn decode_segment(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_escaped_and_a_segment_round_trips() {
        let hostile = "<script>alert('x')</script> \"q\" & é ☃";
        let mut h = Html::default();
        h.raw("<p>").text(hostile).raw("</p>");
        h.link("/jobs/", hostile, hostile);
        let page = h.finish();
        assert!(!page.contains("<script>"), "{page}");
        assert!(!page.contains("'x'"), "{page}");
        assert!(page.contains("&lt;script&gt;alert(&#39;x&#39;)"), "{page}");
        assert!(page.contains("&quot;q&quot; &amp; é ☃"), "{page}");
        let seg = path_segment(hostile);
        assert!(seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
        assert_eq!(decode_segment(&seg).as_deref(), Some(hostile));
        assert_eq!(decode_segment("%zz"), None);
        assert_eq!(decode_segment("%ff"), None);
    }
}
