//! Where each `[[job]]` table of a jobs.toml lies, so that the jobs can be
//! parsed one at a time.
//!
//! toml 0.9 holds a whole document's tokens, events and tree at once:
//! about 30 bytes for every byte of the file, 27 MB for 10,000 jobs. Cut at
//! its `[[job]]` headers, the file is parsed as one small document per job
//! plus the rest (the other tables, the jobs cut out: [`without`]), and the
//! peak is the text, the jobs kept and one job's tree (issue 30, item 4).
//!
//! The cut is made only where it cannot change what the file means. A
//! header is a `[` at the start of a line outside any value (the lexer
//! knows strings, comments and brackets), and a job's table runs from its
//! `[[job]]` header to the next header that is neither `[[job]]` nor under
//! `job.` (`[job.env]`, `[[job.hooks]]`). Anything else about `job` (a
//! `[job]` table, a quoted `["job"]` header, a `[job.x]` table after another
//! table) returns `None`, and the whole file is parsed as one document.

use std::ops::Range;

use toml_parser::lexer::TokenKind;
use toml_parser::Source;

/// The byte ranges of the file's `[[job]]` tables, each with its sub-tables,
/// in file order; `None` when the file has a shape this cut does not handle
/// (see the module's documentation), which the caller parses whole.
pub(super) fn job_tables(text: &str) -> Option<Vec<Range<usize>>> {
    let source = Source::new(text);
    let mut tokens = source.lex().filter(|t| t.kind() != TokenKind::Whitespace);
    let mut tables = Vec::new();
    // The start of the `[[job]]` table being read, if the last header was
    // one of its own.
    let mut open: Option<usize> = None;
    // Brackets and braces open in a value.
    let mut depth = 0usize;
    let mut line_start = true;
    while let Some(token) = tokens.next() {
        let kind = token.kind();
        match kind {
            TokenKind::Eof => break,
            TokenKind::Newline => {
                line_start = true;
                continue;
            }
            TokenKind::Comment => continue,
            TokenKind::LeftSquareBracket if depth == 0 && line_start => {
                let start = token.span().start();
                let header = header(&source, start, &mut tokens)?;
                match header {
                    Header::Job => {
                        if let Some(from) = open.replace(start) {
                            tables.push(from..start);
                        }
                    }
                    Header::UnderJob if open.is_some() => {}
                    Header::UnderJob | Header::Unsure => return None,
                    Header::Other => {
                        if let Some(from) = open.take() {
                            tables.push(from..start);
                        }
                    }
                }
            }
            TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket => depth += 1,
            TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => {
                depth = depth.checked_sub(1)?;
            }
            _ => {}
        }
        line_start = false;
    }
    if let Some(from) = open {
        tables.push(from..text.len());
    }
    Some(tables)
}

/// The rest of a file: its text without its `[[job]]` tables, and where
/// each piece of it was in the file.
pub(super) struct Rest {
    pub text: String,
    /// Each piece's start in `text` and in the file, in order.
    pieces: Vec<(usize, usize)>,
}

impl Rest {
    /// Where offset `at` of the rest is in the file.
    pub fn file_offset(&self, at: usize) -> usize {
        match self.pieces.partition_point(|&(start, _)| start <= at) {
            0 => at,
            i => {
                let (start, in_file) = self.pieces[i - 1];
                in_file + (at - start)
            }
        }
    }
}

/// `text` without `tables`: the rest of the file, to be parsed as a
/// document of its own. A cut table leaves nothing behind (blanks would
/// cost as much as the text they replace: the parser reserves its tokens
/// by the length of what it reads, 7 bytes a byte), and the rest still
/// parses as the file does around it, since each table starts at a
/// header's `[` after nothing but blanks on its line and ends at the next
/// header's `[`, or the end.
pub(super) fn without(text: &str, tables: &[Range<usize>]) -> Rest {
    let mut rest = Rest {
        text: String::new(),
        pieces: Vec::new(),
    };
    let mut from = 0;
    let ends = tables.iter().map(|t| (t.start, t.end));
    for (to, next) in ends.chain(std::iter::once((text.len(), text.len()))) {
        if to > from {
            rest.pieces.push((rest.text.len(), from));
            rest.text.push_str(&text[from..to]);
        }
        from = next;
    }
    rest
}

/// What a table header names.
#[derive(Debug, PartialEq)]
enum Header {
    /// `[[job]]`: the next job.
    Job,
    /// `[job.KEY…]` or `[[job.KEY…]]`: a sub-table of the last job.
    UnderJob,
    /// A table that is not about `job`.
    Other,
    /// A header whose meaning is left to the whole parse: `[job]`, a quoted
    /// first key, a header broken across lines.
    Unsure,
}

/// Reads a header whose first `[` started at `start`, up to and including
/// its closing bracket(s); `None` if the header does not close on its line.
fn header<'i>(
    source: &Source<'i>,
    start: usize,
    tokens: &mut impl Iterator<Item = toml_parser::lexer::Token>,
) -> Option<Header> {
    let mut next = tokens.next()?;
    // `[[` only when the two brackets touch.
    let array = next.kind() == TokenKind::LeftSquareBracket && next.span().start() == start + 1;
    if array {
        next = tokens.next()?;
    }
    let first = match next.kind() {
        TokenKind::Atom => source.get(next.span())?.as_str() == "job",
        TokenKind::BasicString | TokenKind::LiteralString => {
            return skip(tokens, array, Header::Unsure)
        }
        _ => return None,
    };
    let after = tokens.next()?;
    let kind = match (first, after.kind()) {
        (false, TokenKind::Dot | TokenKind::RightSquareBracket) => Header::Other,
        (true, TokenKind::Dot) => Header::UnderJob,
        (true, TokenKind::RightSquareBracket) if array => Header::Job,
        (true, TokenKind::RightSquareBracket) => Header::Unsure,
        _ => return None,
    };
    if after.kind() == TokenKind::RightSquareBracket {
        if array {
            return (tokens.next()?.kind() == TokenKind::RightSquareBracket).then_some(kind);
        }
        return Some(kind);
    }
    skip(tokens, array, kind)
}

/// Skips the rest of a header's key up to its closing bracket(s).
fn skip(
    tokens: &mut impl Iterator<Item = toml_parser::lexer::Token>,
    array: bool,
    kind: Header,
) -> Option<Header> {
    loop {
        match tokens.next()?.kind() {
            TokenKind::RightSquareBracket => break,
            TokenKind::Newline | TokenKind::Eof | TokenKind::Comment => return None,
            _ => {}
        }
    }
    if array && tokens.next()?.kind() != TokenKind::RightSquareBracket {
        return None;
    }
    Some(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(text: &str) -> Option<Vec<&str>> {
        job_tables(text).map(|t| t.into_iter().map(|r| &text[r]).collect())
    }

    #[test]
    fn each_job_with_its_sub_tables() {
        let text = "a = 1\n[store]\nurl = \"x\"\n\n[[job]]\nname = \"a\"\n[job.env]\nK = \"[[job]]\"\n  [[job]] # two\nname = \"b\"\nc = [\n[1],\n]\n[defaults]\nlease = \"1m\"\n[[ job ]]\nname = \"c\"";
        assert_eq!(
            cut(text).unwrap(),
            [
                "[[job]]\nname = \"a\"\n[job.env]\nK = \"[[job]]\"\n  ",
                "[[job]] # two\nname = \"b\"\nc = [\n[1],\n]\n",
                "[[ job ]]\nname = \"c\"",
            ]
        );
        let rest = without(text, &job_tables(text).unwrap());
        assert_eq!(
            rest.text,
            "a = 1\n[store]\nurl = \"x\"\n\n[defaults]\nlease = \"1m\"\n"
        );
        for key in ["[store]", "url", "[defaults]", "lease"] {
            let at = rest.text.find(key).unwrap();
            assert_eq!(rest.file_offset(at), text.find(key).unwrap(), "{key}");
        }
    }

    #[test]
    fn strings_and_comments_hold_no_headers() {
        let text = "[[job]]\nname = \"a\"\ns = \"\"\"\n[[job]]\n[store]\n\"\"\"\nt = '''\n[x]\n'''\n# [store]\n";
        assert_eq!(cut(text).unwrap(), [text]);
    }

    #[test]
    fn what_the_whole_parse_decides() {
        for text in [
            "[job]\nname = \"a\"\n",
            "[\"job\"]\n",
            "[\"store\"]\nurl = \"x\"\n",
            "[[\"job\"]]\nname = \"a\"\n",
            "[job.env]\nA = \"1\"\n",
            "[[job]]\nname = \"a\"\n[defaults]\n[job.env]\nA = \"1\"\n",
            "[[job]\n",
            "[[job]]]\n",
            "a = ]\n",
            "[ [job]]\n",
        ] {
            assert_eq!(cut(text), None, "{text:?}");
        }
        // A file without jobs has none.
        assert_eq!(cut("[store]\nurl = \"x\"\n").unwrap(), Vec::<&str>::new());
    }
}
