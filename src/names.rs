//! Validated names: resources, keys, job names.
//!
//! A [`Name`] can only be built through [`Name::parse`], so every resource or
//! key that reaches the store is already known to be 1..=200 characters
//! without control characters. The check happens before the store is touched.

use std::fmt;

/// Longest name, in characters.
pub(crate) const MAX_NAME_CHARS: usize = 200;

/// A resource, key or job name that passed validation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    /// Validates `s` as a name of the given kind ("resource", "key", …); the
    /// error is one sentence that names the kind and what to change.
    pub fn parse(kind: &str, s: &str) -> Result<Name, String> {
        if s.is_empty() {
            return Err(format!("the {kind} name is empty; give a non-empty name"));
        }
        let chars = s.chars().count();
        if chars > MAX_NAME_CHARS {
            return Err(format!(
                "the {kind} name is {chars} characters long; use at most {MAX_NAME_CHARS}"
            ));
        }
        if let Some(c) = s.chars().find(|c| c.is_control()) {
            return Err(format!(
                "the {kind} name {:?} contains the control character {:?}; use printable characters only",
                s, c
            ));
        }
        Ok(Name(s.to_string()))
    }

    /// The name as text.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert!(Name::parse("resource", "a").is_ok());
        assert!(Name::parse("resource", &"é".repeat(200)).is_ok());
        assert!(Name::parse("resource", &"a".repeat(201))
            .unwrap_err()
            .contains("at most 200"));
        assert!(Name::parse("resource", "").is_err());
        assert!(Name::parse("resource", "a\nb")
            .unwrap_err()
            .contains("control"));
        assert!(Name::parse("resource", "a\u{7f}").is_err());
    }
}
