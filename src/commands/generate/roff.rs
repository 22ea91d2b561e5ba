//! Markdown text to roff: the little the documentation uses (code spans,
//! links, emphasis, paragraphs, lists, code blocks, tables, subheadings),
//! escaped so that no text can be read as a request or an escape.

/// Escapes text for a roff text line: a backslash is printed as one
/// (`\e`), and a line starting with `.` or `'` is not a request (`\&`).
pub fn text(s: &str) -> String {
    let escaped = s.replace('\\', "\\e");
    if escaped.starts_with(['.', '\'']) {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

/// Text as code (bold; `-` as the minus sign a shell needs).
fn code(s: &str) -> String {
    format!("\\fB{}\\fR", s.replace('\\', "\\e").replace('-', "\\-"))
}

/// A request line with one argument, quoted for roff.
pub fn request(name: &str, arg: &str) -> String {
    format!(
        ".{name} \"{}\"\n",
        arg.replace('\\', "\\e").replace('"', "\\(dq")
    )
}

/// Markdown inline text to roff: `code` bold, [text](url) as its text,
/// **strong** bold, *emphasis* italic. A backslash escapes the character
/// after it (`\|` in a table, `` \` `` inside a code span).
pub fn inline(md: &str) -> String {
    let chars: Vec<char> = md.chars().collect();
    let mut out = String::new();
    let mut plain = String::new();
    let mut i = 0;
    let flush = |plain: &mut String, out: &mut String| {
        out.push_str(&plain.replace('\\', "\\e"));
        plain.clear();
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\\' if i + 1 < chars.len() && "`|*_[]\\".contains(chars[i + 1]) => {
                plain.push(chars[i + 1]);
                i += 2;
            }
            '`' => {
                let mut j = i + 1;
                let mut span = String::new();
                while j < chars.len() && chars[j] != '`' {
                    if chars[j] == '\\' && matches!(chars.get(j + 1), Some('`' | '|')) {
                        span.push(chars[j + 1]);
                        j += 2;
                    } else {
                        span.push(chars[j]);
                        j += 1;
                    }
                }
                flush(&mut plain, &mut out);
                out.push_str(&code(&span));
                i = j + 1;
            }
            '[' => {
                let close = chars[i..].iter().position(|&c| c == ']').map(|p| i + p);
                match close {
                    Some(close) if chars.get(close + 1) == Some(&'(') => {
                        let end = chars[close..]
                            .iter()
                            .position(|&c| c == ')')
                            .map(|p| close + p);
                        let label: String = chars[i + 1..close].iter().collect();
                        flush(&mut plain, &mut out);
                        out.push_str(&inline(&label));
                        i = end.map_or(chars.len(), |e| e + 1);
                    }
                    _ => {
                        plain.push(c);
                        i += 1;
                    }
                }
            }
            '*' => {
                let strong = chars.get(i + 1) == Some(&'*');
                let mark = if strong { 2 } else { 1 };
                let starts = chars.get(i + mark).is_some_and(|c| !c.is_whitespace());
                let close = (i + mark..chars.len()).find(|&j| {
                    chars[j] == '*'
                        && (!strong || chars.get(j + 1) == Some(&'*'))
                        && !chars[j - 1].is_whitespace()
                });
                match close {
                    Some(close) if starts && close > i + mark => {
                        let inner: String = chars[i + mark..close].iter().collect();
                        flush(&mut plain, &mut out);
                        let font = if strong { "B" } else { "I" };
                        out.push_str(&format!("\\f{font}{}\\fR", inline(&inner)));
                        i = close + mark;
                    }
                    _ => {
                        plain.push(c);
                        i += 1;
                    }
                }
            }
            _ => {
                plain.push(c);
                i += 1;
            }
        }
    }
    flush(&mut plain, &mut out);
    if out.starts_with(['.', '\'']) {
        out.insert_str(0, "\\&");
    }
    out
}

/// The cells of a markdown table row (`| a | b |`), trimmed.
pub fn cells(row: &str) -> Vec<String> {
    let row = row.trim().trim_start_matches('|');
    let row = row.strip_suffix('|').unwrap_or(row);
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut chars = row.chars().peekable();
    let mut in_code = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push_str("\\|");
                chars.next();
            }
            '`' => {
                in_code = !in_code;
                cell.push(c);
            }
            '|' if !in_code => cells.push(std::mem::take(&mut cell).trim().to_string()),
            c => cell.push(c),
        }
    }
    cells.push(cell.trim().to_string());
    cells
}

/// A block of markdown (no level-2 headings) to roff: paragraphs, `-`
/// lists, fenced code, tables (each row a tagged paragraph), `###`
/// headings.
pub fn blocks(md: &str) -> String {
    let mut out = String::new();
    let mut lines = md.lines().peekable();
    let mut para = false;
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() {
            para = false;
        } else if let Some(fence) = trimmed.strip_prefix("```") {
            let _ = fence;
            out.push_str(".PP\n.nf\n.RS 4\n");
            for code in lines.by_ref() {
                if code.trim_start().starts_with("```") {
                    break;
                }
                out.push_str(&text(code));
                out.push('\n');
            }
            out.push_str(".RE\n.fi\n");
            para = false;
        } else if let Some(h) = trimmed.strip_prefix("### ") {
            out.push_str(&request("SS", &plain(h)));
            para = false;
        } else if trimmed.starts_with('|') {
            let header = cells(trimmed);
            let mut rows = Vec::new();
            while lines
                .peek()
                .is_some_and(|l| l.trim_start().starts_with('|'))
            {
                rows.push(cells(lines.next().unwrap()));
            }
            for row in rows.iter().skip(1) {
                out.push_str(".TP\n");
                out.push_str(&inline(&row[0]));
                out.push('\n');
                let rest: Vec<String> = header
                    .iter()
                    .zip(row)
                    .skip(1)
                    .map(|(h, c)| format!("{}: {}", plain(h), c))
                    .collect();
                out.push_str(&inline(&rest.join("; ")));
                out.push('\n');
            }
            para = false;
        } else if let Some(item) = trimmed.strip_prefix("- ") {
            out.push_str(".IP \\(bu 2\n");
            out.push_str(&inline(item));
            out.push('\n');
            para = true;
        } else {
            if !para {
                out.push_str(".PP\n");
                para = true;
            }
            out.push_str(&inline(trimmed));
            out.push('\n');
        }
    }
    out
}

/// Markdown inline text as plain text (for headings and table headers).
pub fn plain(md: &str) -> String {
    md.replace('`', "").replace("**", "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_cannot_become_a_request_or_an_escape() {
        assert_eq!(text(".SH oops"), "\\&.SH oops");
        assert_eq!(text("'x"), "\\&'x");
        assert_eq!(text("a\\fBb"), "a\\efBb");
        assert_eq!(inline(".TH x"), "\\&.TH x");
        assert_eq!(inline("`\\u0000`"), "\\fB\\eu0000\\fR");
        assert_eq!(request("SS", "a \"b\""), ".SS \"a \\(dqb\\(dq\"\n");
    }

    #[test]
    fn markdown_inline_becomes_fonts_and_text() {
        assert_eq!(
            inline("see [Metrics](#metrics-and-health-http) and `--lease D`"),
            "see Metrics and \\fB\\-\\-lease D\\fR"
        );
        assert_eq!(
            inline("*Capacity* and **no**"),
            "\\fICapacity\\fR and \\fBno\\fR"
        );
        assert_eq!(inline("`61 * * * *`, 2 * 3"), "\\fB61 * * * *\\fR, 2 * 3");
        assert_eq!(inline("`job \\`x\\`.y`"), "\\fBjob `x`.y\\fR");
        assert_eq!(cells("| `a \\| b` | c |"), vec!["`a \\| b`", "c"]);
        assert_eq!(inline("a \\| b"), "a | b");
    }
}
