//! `jobs.toml(5)`, generated at build time from the configuration reference
//! (a markdown document compiled into the binary), so the page cannot say
//! other than the documentation: the keys table becomes one tagged
//! paragraph per key, grouped by section; the prose after it follows.

use super::roff;

/// The path, in the repository, of the document holding the configuration
/// reference. The one place to change when the reference moves.
macro_rules! config_reference_path {
    () => {
        "docs/configuration.md"
    };
}

/// [`config_reference_path!`] as a value, for messages and tests.
pub const CONFIG_REFERENCE_PATH: &str = config_reference_path!();

/// The heading of the configuration reference in that document.
pub const CONFIG_HEADING: &str = "## Configuration";

/// The document, as it was when the binary was built.
const CONFIG_REFERENCE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/",
    config_reference_path!()
));

/// The example config the package installs as /etc/fencecron/jobs.toml.
const EXAMPLE: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/jobs.example.toml"));

/// The configuration section of the reference: from its heading to the
/// next heading of the same level (or the end).
fn section() -> &'static str {
    let start = CONFIG_REFERENCE
        .find(&format!("\n{CONFIG_HEADING}\n"))
        .map(|i| i + CONFIG_HEADING.len() + 2)
        .or_else(|| CONFIG_REFERENCE.starts_with(CONFIG_HEADING).then_some(CONFIG_HEADING.len()))
        .unwrap_or_else(|| {
            panic!("{CONFIG_REFERENCE_PATH} has no `{CONFIG_HEADING}` section (jobs.toml(5) is made from it)")
        });
    let rest = &CONFIG_REFERENCE[start..];
    let end = rest.find("\n## ").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

/// One key of the keys table.
#[derive(Debug)]
pub struct Key {
    pub key: String,
    pub section: String,
    pub default: String,
    pub meaning: String,
}

/// The section split around its keys table (the first table whose header
/// names `key`, `default` and `meaning`): the markdown before it, the
/// keys, the markdown after it.
pub fn parts() -> (&'static str, Vec<Key>, &'static str) {
    let text = section();
    let mut offset = 0;
    let mut table: Option<(usize, usize)> = None;
    let mut lines = text.split_inclusive('\n').peekable();
    while let Some(line) = lines.next() {
        if line.starts_with('|') && table.is_none() {
            let header = roff::cells(line);
            if ["key", "default", "meaning"]
                .iter()
                .all(|h| header.iter().any(|c| c == h))
            {
                let start = offset;
                offset += line.len();
                while let Some(l) = lines.next_if(|l| l.starts_with('|')) {
                    offset += l.len();
                }
                table = Some((start, offset));
                continue;
            }
        }
        offset += line.len();
    }
    let (start, end) = table.unwrap_or_else(|| {
        panic!("the `{CONFIG_HEADING}` section of {CONFIG_REFERENCE_PATH} has no keys table (key | … | default | meaning)")
    });
    let rows: Vec<&str> = text[start..end].lines().collect();
    let header = roff::cells(rows[0]);
    let col = |name: &str| header.iter().position(|c| c == name);
    let (k, d, m) = (
        col("key").unwrap(),
        col("default").unwrap(),
        col("meaning").unwrap(),
    );
    let w = col("where");
    let keys = rows[2..]
        .iter()
        .map(|row| {
            let cells = roff::cells(row);
            Key {
                key: roff::plain(&cells[k]),
                section: w.map(|w| cells[w].clone()).unwrap_or_default(),
                default: cells[d].clone(),
                meaning: cells[m].clone(),
            }
        })
        .collect();
    (&text[..start], keys, &text[end..])
}

/// The page, in roff.
pub fn page() -> String {
    let (before, keys, after) = parts();
    let mut out = String::new();
    out.push_str(&format!(
        ".TH JOBS.TOML 5 \"\" \"fencecron {}\" \"File Formats\"\n",
        env!("CARGO_PKG_VERSION")
    ));
    out.push_str(".nh\n.SH NAME\njobs.toml \\- fencecron's jobs, store and daemon settings\n");
    out.push_str(".SH SYNOPSIS\n/etc/fencecron/jobs.toml\n");
    out.push_str(".SH DESCRIPTION\n");
    out.push_str(
        "The TOML file \\fBfencecron\\fR(1) reads its jobs from (\\fB\\-\\-config\\fR, \
         \\fB$FENCECRON_CONFIG\\fR, else /etc/fencecron/jobs.toml): the tables\n",
    );
    let mut sections: Vec<&str> = Vec::new();
    for key in &keys {
        if !sections.contains(&key.section.as_str()) {
            sections.push(&key.section);
        }
    }
    let tables: Vec<String> = sections
        .iter()
        .flat_map(|s| s.split('`').skip(1).step_by(2))
        .map(str::to_string)
        .fold(Vec::new(), |mut acc, t| {
            if !acc.contains(&t) {
                acc.push(t);
            }
            acc
        });
    out.push_str(&roff::text(&tables.join(", ")));
    out.push_str(
        "\n(any of them may be left out), each key with its default below. \
         Unknown keys are errors.\n",
    );
    out.push_str(&roff::blocks(before));
    out.push_str(".SH KEYS\n");
    for section in &sections {
        out.push_str(&roff::request("SS", &roff::plain(section)));
        for key in keys.iter().filter(|k| &k.section == section) {
            out.push_str(".TP\n");
            out.push_str(&format!(
                "\\fB{}\\fR\n",
                roff::text(&key.key).replace('-', "\\-")
            ));
            out.push_str(&roff::inline(&key.meaning));
            out.push_str("\n.br\nDefault: ");
            out.push_str(&roff::inline(&key.default));
            out.push_str(".\n");
        }
    }
    out.push_str(".SH SEMANTICS\n");
    out.push_str(&roff::blocks(after));
    out.push_str(".SH EXAMPLE\nThe example the package installs as /etc/fencecron/jobs.toml:\n");
    out.push_str(".PP\n.nf\n.RS 4\n");
    for line in EXAMPLE.lines() {
        out.push_str(&roff::text(line));
        out.push('\n');
    }
    out.push_str(".RE\n.fi\n");
    out.push_str(".SH FILES\n.TP\n/etc/fencecron/jobs.toml\nThe default config file.\n");
    out.push_str(".TP\n/etc/fencecron/env\nThe unit's environment file: the variable named by \\fBstore.url_env\\fR goes here.\n");
    out.push_str(&format!(
        ".SH NOTES\nThis page is made from the {} section of {} (installed under /usr/share/doc/fencecron).\n",
        roff::plain(CONFIG_HEADING.trim_start_matches('#').trim()),
        roff::text(CONFIG_REFERENCE_PATH)
    ));
    out.push_str(
        ".SH SEE ALSO\n\\fBfencecron\\fR(1), \\fBfencecron\\-check\\fR(1), \\fBfencecron\\-run\\fR(1)\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of the reference's table is on the page, with its default
    /// and meaning, and no markdown is left over.
    #[test]
    fn jobs_toml_page_holds_every_key_of_the_reference() {
        let (_, keys, _) = parts();
        for key in [
            "store.url",
            "node.id",
            "name",
            "schedule",
            "overlap",
            "stale_exit_code",
        ] {
            assert!(
                keys.iter().any(|k| k.key == key),
                "{key} not in the keys table"
            );
        }
        let table_rows = section().lines().filter(|l| l.starts_with("| `")).count();
        assert_eq!(keys.len(), table_rows);
        let page = page();
        for key in &keys {
            let tag = format!(".TP\n\\fB{}\\fR\n", key.key.replace('-', "\\-"));
            assert!(page.contains(&tag), "no entry for {}", key.key);
            assert!(
                !key.default.is_empty() && !key.meaning.is_empty(),
                "{key:?}"
            );
        }
        assert!(page.contains(".SS \"[[job]]\""), "{page}");
        assert!(page.contains("Default: 30s."), "the lease default");
        let keys_section =
            &page[page.find(".SH KEYS").unwrap()..page.find(".SH SEMANTICS").unwrap()];
        assert!(
            !keys_section.contains('`'),
            "a markdown backtick is left: {keys_section}"
        );
        assert!(!page.contains("]("), "a markdown link is left");
    }
}
