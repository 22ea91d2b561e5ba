//! `[http] token_file`: who may act from the web view. One `NAME TOKEN`
//! pair a line (blank lines and `#` comments ignored); NAME is what the
//! fleet records as having asked (`web:NAME`), TOKEN the secret a request
//! carries (`Authorization: Bearer TOKEN`, or the form's `token` field).
//! The file must be readable by its owner only (the service user).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The shortest token accepted: 16 characters (e.g. `openssl rand -hex 16`
/// gives 32).
pub const MIN_TOKEN_LEN: usize = 16;

/// The tokens of a token file. Its `Debug` shows the names only.
#[derive(Clone, PartialEq, Eq)]
pub struct Tokens {
    pairs: Vec<(String, String)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.pairs.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Tokens").field("names", &names).finish()
    }
}

impl Tokens {
    /// The name of the token `given`, compared in constant time with every
    /// token of the file.
    pub fn name_of(&self, given: &str) -> Option<&str> {
        let mut found = None;
        for (name, token) in &self.pairs {
            if constant_time_eq(token.as_bytes(), given.as_bytes()) {
                found = Some(name.as_str());
            }
        }
        found
    }

    /// How many tokens there are.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pairs.len()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads and checks a token file; the error is one sentence naming the
/// cause and the fix.
pub fn load(path: &Path) -> Result<Tokens, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "{shown} does not exist; write `NAME TOKEN` lines into it (mode 0600, owned by the service user) or remove http.token_file"
        ),
        _ => format!("cannot read {shown} ({e}); run this as the user the daemon runs as"),
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{shown} is readable by other users than its owner (mode {mode:04o}); run `chmod 600 {shown}` so that only the service user reads the tokens"
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!("cannot read {shown} ({e}); run this as the user the daemon runs as")
    })?;
    parse(&text).map_err(|(line, m)| format!("{shown} line {line}: {m}"))
}

/// Parses the text of a token file; the error names the line.
pub fn parse(text: &str) -> Result<Tokens, (usize, String)> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(name), Some(token), None) = (words.next(), words.next(), words.next()) else {
            return Err((
                n,
                "expected `NAME TOKEN` (two words); write one name and its token per line".into(),
            ));
        };
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c))
            || name.len() > 64
        {
            return Err((
                n,
                format!("the name {name:?} is not 1-64 letters, digits, `.`, `_`, `@` or `-`; rename it"),
            ));
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err((
                n,
                format!("the token of {name} is shorter than {MIN_TOKEN_LEN} characters; use a random one such as `openssl rand -hex 16` prints"),
            ));
        }
        if pairs.iter().any(|(other, _)| other == name) {
            return Err((
                n,
                format!("{name} is named twice; give each token its own name"),
            ));
        }
        if pairs.iter().any(|(_, t)| t == token) {
            return Err((
                n,
                format!("the token of {name} is another name's too; give each name its own token"),
            ));
        }
        pairs.push((name.to_string(), token.to_string()));
    }
    if pairs.is_empty() {
        return Err((
            1,
            "the file names no token; write `NAME TOKEN` lines or remove http.token_file".into(),
        ));
    }
    Ok(Tokens { pairs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_names_its_tokens_and_refuses_what_it_cannot_use() {
        let t = parse("# ops\nalice 0123456789abcdef0123\n\nbob   fedcba9876543210fedc\n").unwrap();
        assert_eq!(t.name_of("0123456789abcdef0123"), Some("alice"));
        assert_eq!(t.name_of("fedcba9876543210fedc"), Some("bob"));
        assert_eq!(t.name_of("0123456789abcdef012"), None);
        assert_eq!(t.name_of(""), None);
        assert!(!format!("{t:?}").contains("0123"), "{t:?}");
        assert_eq!(parse("alice short").unwrap_err().0, 1);
        assert_eq!(parse("# x\nalice").unwrap_err().0, 2);
        assert!(parse("a<b 0123456789abcdef0123").is_err());
        assert!(parse("a 0123456789abcdef0123\na 0123456789abcdef0124").is_err());
        assert!(parse("a 0123456789abcdef0123\nb 0123456789abcdef0123").is_err());
        assert!(parse("# nothing\n").is_err());
    }

    #[test]
    fn a_token_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "alice 0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = load(&path).unwrap_err();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load(&path).unwrap().len(), 1);
    }
}
