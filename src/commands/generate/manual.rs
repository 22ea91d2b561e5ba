//! What the man pages say beyond `--help`: per command its exit codes, the
//! environment variables that apply and a few examples. One table
//! ([`COMMANDS`]); a test keeps it in agreement with the commands table of docs/commands.md
//! and parses every example with the real command line parser.

use crate::error::{
    EXIT_CANNOT_START, EXIT_HELD, EXIT_INTERRUPTED, EXIT_MISSING, EXIT_OK, EXIT_OVERDUE,
    EXIT_RUNTIME, EXIT_STALE, EXIT_USAGE,
};

/// One row of the commands table of docs/commands.md.
pub struct CommandDoc {
    /// The row's command as docs/commands.md starts it, without `fencecron`: the
    /// subcommand words and, for a row of its own, a flag (`check --connect`).
    /// Read by the test that matches the rows.
    #[cfg_attr(not(test), allow(dead_code))]
    pub usage: &'static str,
    /// The man pages (subcommand paths) this row belongs on.
    pub pages: &'static [&'static str],
    /// The exit codes docs/commands.md names for it, each with when.
    pub exits: &'static [(u8, &'static str)],
    /// Codes passed through from a job, when there are: what they are.
    pub passthrough: Option<&'static str>,
    /// Whether it reads the config and the store (and so the variables and
    /// files that name them).
    pub store: bool,
    /// Variables that apply besides the common ones.
    pub env: &'static [&'static str],
    /// Command lines (shell), each with what it does.
    pub examples: &'static [(&'static str, &'static str)],
}

/// Every exit code fencecron has, with its general meaning (fencecron(1)).
pub const EXIT_CODES: &[(u8, &str)] = &[
    (EXIT_OK, "success"),
    (
        EXIT_RUNTIME,
        "runtime failure: the store is unreachable, an I/O error",
    ),
    (EXIT_USAGE, "usage or configuration error"),
    (
        EXIT_STALE,
        "a stale write was rejected, or not the lease's owner; for status, a job is overdue",
    ),
    (
        EXIT_MISSING,
        "what was asked for does not exist (get of a key never written)",
    ),
    (EXIT_HELD, "the lease is held by another owner"),
    (
        EXIT_CANNOT_START,
        "the job's program could not be started (exec, trigger --wait)",
    ),
    (
        EXIT_INTERRUPTED,
        "interrupted by SIGINT or SIGTERM before the work was done",
    ),
];

/// Every variable a page may name, with what it does.
pub const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "FENCECRON_CONFIG",
        "The jobs file, when --config is not given (default /etc/fencecron/jobs.toml).",
    ),
    (
        "FENCECRON_STORE",
        "The store URL (sqlite://PATH, postgres://..., mysql://...), when --store is not given; overrides the config's [store]. Set in a job's environment when the URL holds no password.",
    ),
    (
        "FENCECRON_STORE_FILE",
        "A file holding the store URL, read when neither --store nor FENCECRON_STORE is set. Set in a job's environment when the URL holds a password; it exists only while the fencecron that started the job runs.",
    ),
    (
        "FENCECRON_LOG_FORMAT",
        "The log format, text or json, when --log-format is not given (default: native journal entries when stderr is the journal, else text).",
    ),
    (
        "FENCECRON_LOG",
        "A tracing filter for the log (e.g. debug, or warn); default info for fencecron's own events.",
    ),
    (
        "STATE_DIRECTORY",
        "Set by systemd (StateDirectory=): where the default SQLite store fencecron.db lives; without it, the working directory.",
    ),
    (
        "RUNTIME_DIRECTORY",
        "Set by systemd (RuntimeDirectory=): where the private file that gives jobs the store URL (FENCECRON_STORE_FILE) is created; without it, the temporary directory.",
    ),
    (
        "FENCECRON_RESOURCE",
        "The resource, when --resource is not given; set in every job's environment.",
    ),
    (
        "FENCECRON_TOKEN",
        "The fencing token, when --token is not given; set in every job's environment.",
    ),
    (
        "FENCECRON_OWNER_ID",
        "The owner id the token was issued to, when --owner-id is not given; set in every job's environment.",
    ),
    (
        "FENCECRON_GUARD_DB",
        "The job's own database URL, when --db is not given.",
    ),
];

/// The variables every command that reads the config and the store uses.
pub const STORE_ENV: &[&str] = &[
    "FENCECRON_CONFIG",
    "FENCECRON_STORE",
    "FENCECRON_STORE_FILE",
    "FENCECRON_LOG_FORMAT",
    "FENCECRON_LOG",
    "STATE_DIRECTORY",
];

/// The files a page may name, with what they are.
pub const FILES: &[(&str, &str)] = &[
    (
        "/etc/fencecron/jobs.toml",
        "The jobs and the store (see jobs.toml(5)); the default of --config.",
    ),
    (
        "/etc/fencecron/env",
        "The unit's environment file (EnvironmentFile=): secrets such as the store URL named by store.url_env; mode 0640, root:fencecron.",
    ),
    (
        "/var/lib/fencecron/fencecron.db",
        "The default SQLite store under systemd ($STATE_DIRECTORY), for a config without [store].",
    ),
    (
        "/run/fencecron/",
        "The unit's runtime directory ($RUNTIME_DIRECTORY): the private files that give jobs the store URL, removed when the daemon exits.",
    ),
];

/// Per command: the rows of docs/commands.md, in its order.
pub const COMMANDS: &[CommandDoc] = &[
    CommandDoc {
        usage: "run",
        pages: &["run"],
        exits: &[(EXIT_OK, "after SIGTERM or SIGINT, once the running jobs ended")],
        passthrough: None,
        store: true,
        env: &["RUNTIME_DIRECTORY"],
        examples: &[
            ("fencecron run", "Run the daemon with /etc/fencecron/jobs.toml (as the unit does)."),
            (
                "fencecron run --config ./jobs.toml --node-id web-1",
                "Run it with another config, naming this node web-1 in leases and events.",
            ),
        ],
    },
    CommandDoc {
        usage: "check",
        pages: &["check"],
        exits: &[
            (EXIT_OK, "the config is valid (warnings on stderr)"),
            (EXIT_USAGE, "the config is invalid"),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[
            (
                "fencecron check --config /etc/fencecron/jobs.toml",
                "Validate the config and print each job's next 3 fire times.",
            ),
            (
                "sudo -u fencecron sh -c 'set -a; . /etc/fencecron/env; exec fencecron check --connect --config /etc/fencecron/jobs.toml'",
                "As the unit runs it, with its user and environment file: also check that the daemon can use the store.",
            ),
        ],
    },
    CommandDoc {
        usage: "check --connect",
        pages: &["check"],
        exits: &[
            (EXIT_OK, "with --connect: the store is usable (warnings on stderr)"),
            (
                EXIT_RUNTIME,
                "with --connect: the store is unusable: unreachable or silent for 5 s, login refused, no such database, migrations it cannot apply or that a newer fencecron made, missing privileges",
            ),
            (EXIT_USAGE, "the config is invalid"),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[],
    },
    CommandDoc {
        usage: "exec",
        pages: &["exec"],
        exits: &[
            (EXIT_HELD, "the lease is held by another owner; the command did not run"),
            (EXIT_CANNOT_START, "the program could not be started (not found, not executable)"),
        ],
        passthrough: Some("the command's own exit code, or 128 + the signal that ended it"),
        store: true,
        env: &["RUNTIME_DIRECTORY"],
        examples: &[
            (
                "fencecron exec nightly-report -- /usr/local/bin/report --daily",
                "Run the report under the lease of nightly-report, killed when the lease is lost.",
            ),
            (
                "fencecron exec backup --lease 60s --quiet -- /usr/local/bin/backup",
                "From cron: a 60 s lease, and only warnings and errors on stderr.",
            ),
        ],
    },
    CommandDoc {
        usage: "lease acquire",
        pages: &["lease acquire"],
        exits: &[
            (EXIT_OK, "acquired: prints resource, owner_id, token and expires_at"),
            (EXIT_HELD, "the lease is held by another owner"),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[
            (
                "eval \"$(fencecron lease acquire \"$RESOURCE\")\"",
                "Take the lease and set $resource, $owner_id, $token and $expires_at.",
            ),
            (
                "fencecron lease acquire reports --lease 2m --json",
                "Take a 2-minute lease on reports and print it as JSON.",
            ),
        ],
    },
    CommandDoc {
        usage: "lease renew",
        pages: &["lease renew"],
        exits: &[
            (EXIT_OK, "renewed: prints expires_at"),
            (EXIT_STALE, "not the owner, or the lease expired"),
            (EXIT_USAGE, "the owner id is not a UUID"),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[(
            "fencecron lease renew reports --owner-id 0d1f3c2a-6b9e-4f4b-8a57-2e4c1b9d7f60 --token 12",
            "Extend the lease lease acquire printed (its owner_id and token), keeping the token.",
        )],
    },
    CommandDoc {
        usage: "lease release",
        pages: &["lease release"],
        exits: &[
            (EXIT_OK, "released"),
            (EXIT_STALE, "not the owner"),
            (EXIT_USAGE, "the owner id is not a UUID"),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[(
            "fencecron lease release reports --owner-id 0d1f3c2a-6b9e-4f4b-8a57-2e4c1b9d7f60 --token 12",
            "Give that lease back.",
        )],
    },
    CommandDoc {
        usage: "lease forget",
        pages: &["lease forget"],
        exits: &[
            (EXIT_OK, "forgotten"),
            (EXIT_HELD, "the lease is held"),
            (EXIT_MISSING, "no lease of that resource"),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[(
            "fencecron lease forget old-report",
            "Hide a removed job's lease from lease list; its next token still grows.",
        )],
    },
    CommandDoc {
        usage: "lease list",
        pages: &["lease list"],
        exits: &[(EXIT_OK, "listed")],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[("fencecron lease list --json", "Every lease, held or not, as JSON.")],
    },
    CommandDoc {
        usage: "put",
        pages: &["put"],
        exits: &[
            (EXIT_OK, "accepted (with --once, also already applied)"),
            (
                EXIT_STALE,
                "rejected as stale, forged or of the wrong owner; recorded (fencecron stale)",
            ),
        ],
        passthrough: None,
        store: true,
        env: &["FENCECRON_RESOURCE", "FENCECRON_TOKEN", "FENCECRON_OWNER_ID"],
        examples: &[
            (
                "fencecron put result --file out.json",
                "Inside a job: write out.json under the key result, fenced by the job's token.",
            ),
            (
                "fencecron put offset --value 42 --once",
                "Write once per token: a retry with the same token is already applied.",
            ),
        ],
    },
    CommandDoc {
        usage: "get",
        pages: &["get"],
        exits: &[
            (EXIT_OK, "found: the value on stdout"),
            (EXIT_MISSING, "nothing was written under that key for that resource"),
            (EXIT_RUNTIME, "the store could not be read"),
        ],
        passthrough: None,
        store: true,
        env: &["FENCECRON_RESOURCE"],
        examples: &[
            ("fencecron get result --resource nightly", "Print the value of result, as written."),
            (
                "fencecron get result --resource nightly --json",
                "The value with the token that wrote it, as JSON.",
            ),
        ],
    },
    CommandDoc {
        usage: "stale",
        pages: &["stale"],
        exits: &[(EXIT_OK, "listed")],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[
            ("fencecron stale --since 1h", "Rejected writes and lost leases of the last hour, from every host."),
            ("fencecron stale --limit 10", "The ten newest records (100 unless told; 0 lists all)."),
            (
                "fencecron stale --json --guard postgres://app@db.internal/app",
                "Also the SQL guard's rejections kept in the job's own database.",
            ),
        ],
    },
    CommandDoc {
        usage: "guard install",
        pages: &["guard install"],
        exits: &[
            (EXIT_OK, "installed or updated"),
            (EXIT_RUNTIME, "the database is unreachable or refused"),
            (EXIT_USAGE, "a bad URL, or a SQLite file that does not exist"),
        ],
        passthrough: None,
        store: false,
        env: &["FENCECRON_GUARD_DB"],
        examples: &[(
            "fencecron guard install --db postgres://app@db.internal/app",
            "Create or update the guard in the job's own PostgreSQL database.",
        )],
    },
    CommandDoc {
        usage: "guard ddl",
        pages: &["guard ddl"],
        exits: &[(EXIT_OK, "printed")],
        passthrough: None,
        store: false,
        env: &[],
        examples: &[(
            "fencecron guard ddl --backend postgres > guard.sql",
            "The statements guard install runs, for a DBA to review and run.",
        )],
    },
    CommandDoc {
        usage: "guard trigger",
        pages: &["guard trigger"],
        exits: &[
            (EXIT_OK, "printed"),
            (EXIT_USAGE, "MySQL, or a table or column that is not a plain identifier"),
        ],
        passthrough: None,
        store: false,
        env: &[],
        examples: &[(
            "fencecron guard trigger --backend postgres --table ledger --column fence_token --resource ledger-sync | psql \"$APP_DB\"",
            "Check every row written to ledger by its fence_token column.",
        )],
    },
    CommandDoc {
        usage: "guard record",
        pages: &["guard record"],
        exits: &[
            (EXIT_OK, "recorded (or already on record)"),
            (EXIT_RUNTIME, "the guard did not refuse this token; nothing recorded"),
            (EXIT_USAGE, "usage error"),
        ],
        passthrough: None,
        store: false,
        env: &["FENCECRON_GUARD_DB", "FENCECRON_RESOURCE", "FENCECRON_TOKEN"],
        examples: &[(
            "psql \"$APP_DB\" -f load.sql || { fencecron guard record --db \"$APP_DB\"; exit 1; }",
            "In a job: record that the guard refused the job's transaction.",
        )],
    },
    CommandDoc {
        usage: "bench",
        pages: &["bench"],
        exits: &[
            (EXIT_OK, "measured"),
            (EXIT_USAGE, "--resources is less than --clients"),
            (EXIT_INTERRUPTED, "interrupted (the bench rows are removed)"),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[(
            "fencecron bench --store postgres://postgres@127.0.0.1/test --clients 4 --duration 3s",
            "Measure a PostgreSQL store with 4 clients, 3 s per operation.",
        )],
    },
    CommandDoc {
        usage: "runs",
        pages: &["runs"],
        exits: &[
            (EXIT_OK, "listed"),
            (
                EXIT_USAGE,
                "--limit is not within 1..=1000, or a JOB without runs that neither the config nor a daemon knows",
            ),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[
            ("fencecron runs", "Every host's runs, newest first."),
            ("fencecron runs nightly --since 1h --json", "The runs of nightly in the last hour, as JSON."),
            (
                "fencecron runs --outcome failed --since 1d --node host-a",
                "The runs host-a ended as failed in the last day.",
            ),
        ],
    },
    CommandDoc {
        usage: "runs show",
        pages: &["runs show"],
        exits: &[
            (EXIT_OK, "shown"),
            (EXIT_MISSING, "no such run in the history (never, or pruned)"),
            (EXIT_USAGE, "RUN is not an owner id (a UUID)"),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[(
            "fencecron runs show 0b6f4a52-5c1e-4d55-9a63-2f0e7d1c9a10",
            "One run, with the tail of its output the history kept.",
        )],
    },
    CommandDoc {
        usage: "nodes",
        pages: &["nodes"],
        exits: &[(EXIT_OK, "shown")],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[
            (
                "fencecron nodes",
                "Every daemon of the store: live, draining or gone; version, config digest, runs held.",
            ),
            ("fencecron nodes --json", "The same as a JSON array."),
        ],
    },
    CommandDoc {
        usage: "status",
        pages: &["status"],
        exits: &[
            (EXIT_OK, "shown, and no job is overdue"),
            (
                EXIT_OVERDUE,
                "a job is overdue: an instant older than 60 s has no run, or no live node has the job",
            ),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[
            (
                "fencecron status",
                "Per job: schedule, next instant, paused, running, last run, last success, live nodes, drift, overdue.",
            ),
            (
                "fencecron status --store postgres://fencecron@db.internal/fencecron",
                "The same from a host without the config, from the definitions the daemons published.",
            ),
        ],
    },
    CommandDoc {
        usage: "trigger",
        pages: &["trigger"],
        exits: &[
            (EXIT_OK, "a daemon took the request"),
            (EXIT_CANNOT_START, "with --wait: the job's program could not be started"),
            (EXIT_HELD, "the job is running, or the request was refused"),
            (EXIT_RUNTIME, "no daemon took the request within --timeout (15s)"),
        ],
        passthrough: Some(
            "with --wait: the exit code of the run's last attempt (after the job's retries), or 128 + the signal that ended it",
        ),
        store: true,
        env: &[],
        examples: &[
            ("fencecron trigger nightly", "Run nightly once, now, on one live daemon."),
            (
                "fencecron trigger nightly --wait",
                "Run it (retried as its retries say), print the last attempt's output and exit with its code.",
            ),
        ],
    },
    CommandDoc {
        usage: "pause",
        pages: &["pause"],
        exits: &[
            (EXIT_OK, "paused"),
            (EXIT_HELD, "already paused (the error names the pause in force); --replace replaces it"),
            (EXIT_USAGE, "no such job in the config"),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[(
            "fencecron pause nightly --note \"db migration\" --for 2h",
            "No daemon runs nightly's instants for 2 hours; status shows why.",
        )],
    },
    CommandDoc {
        usage: "resume",
        pages: &["resume"],
        exits: &[(EXIT_OK, "resumed"), (EXIT_USAGE, "no such job in the config")],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[("fencecron resume nightly", "Run nightly's instants again, fleet-wide.")],
    },
    CommandDoc {
        usage: "epoch",
        pages: &["epoch", "epoch show"],
        exits: &[(EXIT_OK, "shown")],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[("fencecron epoch --json", "The stored and the effective epoch, as JSON.")],
    },
    CommandDoc {
        usage: "proxy",
        pages: &["proxy"],
        exits: &[
            (EXIT_OK, "after SIGTERM or SIGINT"),
            (EXIT_RUNTIME, "the address is taken or the store is unreachable"),
            (EXIT_USAGE, "a bad --upstream"),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[(
            "fencecron proxy --listen 127.0.0.1:8480 --upstream http://127.0.0.1:8080",
            "Forward to the service on port 8080 only requests that carry a current fencing token.",
        )],
    },
    CommandDoc {
        usage: "epoch advance",
        pages: &["epoch", "epoch advance"],
        exits: &[
            (EXIT_OK, "advance: the epoch was raised"),
            (EXIT_RUNTIME, "advance: the store is unreachable or read-only"),
        ],
        passthrough: None,
        store: true,
        env: &[],
        examples: &[(
            "fencecron epoch advance --store \"$FENCECRON_DATABASE_URL\"",
            "In the store's promotion hook: every later token is greater than every earlier one.",
        )],
    },
    CommandDoc {
        usage: "--version",
        pages: &[],
        exits: &[(EXIT_OK, "printed")],
        passthrough: None,
        store: false,
        env: &[],
        examples: &[],
    },
    CommandDoc {
        usage: "completions",
        pages: &["completions"],
        exits: &[(EXIT_OK, "printed")],
        passthrough: None,
        store: false,
        env: &[],
        examples: &[(
            "fencecron completions bash > /etc/bash_completion.d/fencecron",
            "Install bash completions (they offer the config's job names).",
        )],
    },
    CommandDoc {
        usage: "man",
        pages: &["man"],
        exits: &[(EXIT_OK, "written"), (EXIT_USAGE, "DIR is not a directory")],
        passthrough: None,
        store: false,
        env: &[],
        examples: &[(
            "fencecron man /usr/local/share/man/man1",
            "Write fencecron.1, a page per subcommand and jobs.toml.5.",
        )],
    },
];

/// The rows whose man page is `page` (`lease acquire`; `""` for none).
pub fn rows_of(page: &str) -> impl Iterator<Item = &'static CommandDoc> + '_ {
    COMMANDS.iter().filter(move |c| c.pages.contains(&page))
}

/// The `fencecron …` command in a shell line: from `fencecron` up to the
/// end of that command (a pipe, `;`, `)`, `>` or `&&`), split into words
/// with their double quotes removed. For the example tests.
#[cfg(test)]
pub fn example_argv(line: &str) -> Vec<String> {
    use clap::CommandFactory;
    let cli = crate::cli::Cli::command();
    // `sudo -u fencecron sh -c '… fencecron check …'`: the fencecron that
    // a subcommand or an option follows.
    let start = line
        .match_indices("fencecron ")
        .map(|(i, _)| i)
        .find(|&i| {
            let next = line[i + "fencecron ".len()..]
                .split(' ')
                .next()
                .unwrap_or("");
            next.starts_with('-') || cli.find_subcommand(next).is_some()
        })
        .expect("an example runs fencecron");
    let rest = &line[start..];
    let end = rest.find(['|', ';', ')', '>', '\'']).unwrap_or(rest.len());
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in rest[..end].chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::{CommandFactory, Parser};
    use std::collections::BTreeSet;

    /// the commands table of docs/commands.md: per row, the commands its first cell names
    /// (`lease acquire`, `check --connect`) and the exit codes (whole
    /// numbers that are exit codes of `src/error.rs`) its second names.
    fn readme_rows() -> Vec<(Vec<String>, BTreeSet<u8>)> {
        let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md"));
        let section = readme
            .split("\n## Commands\n")
            .nth(1)
            .expect("docs/commands.md has a ## Commands section");
        let known: BTreeSet<u8> = EXIT_CODES.iter().map(|(c, _)| *c).collect();
        let mut rows = Vec::new();
        for line in section
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
        {
            let cells: Vec<&str> = line.split(" | ").collect();
            let (command, exits) = (cells[0], cells[cells.len() - 1]);
            let commands = command
                .split('`')
                .filter_map(|s| s.strip_prefix("fencecron "))
                .map(str::to_string)
                .collect();
            let chars: Vec<char> = exits.chars().collect();
            let mut codes = BTreeSet::new();
            let mut i = 0;
            while i < chars.len() {
                if chars[i].is_ascii_digit() {
                    let start = i;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                    let glued = |c: Option<&char>| {
                        c.is_some_and(|c| c.is_alphanumeric() || ".=+_".contains(*c))
                    };
                    let before = start.checked_sub(1).and_then(|j| chars.get(j));
                    let n: String = chars[start..i].iter().collect();
                    if !glued(before) && !glued(chars.get(i)) {
                        if let Ok(n) = n.parse::<u8>() {
                            if known.contains(&n) {
                                codes.insert(n);
                            }
                        }
                    }
                } else {
                    i += 1;
                }
            }
            rows.push((commands, codes));
        }
        assert!(
            rows.len() > 20,
            "the commands table of docs/commands.md not found"
        );
        rows
    }

    /// The row of [`COMMANDS`] a command of docs/commands.md belongs to: the longest
    /// `usage` it starts with.
    fn doc_of(command: &str) -> Option<&'static CommandDoc> {
        COMMANDS
            .iter()
            .filter(|c| {
                command == c.usage
                    || command
                        .strip_prefix(c.usage)
                        .is_some_and(|r| r.starts_with(' '))
            })
            .max_by_key(|c| c.usage.len())
    }

    /// Every row of the commands table of docs/commands.md has its entry here with the
    /// same exit codes, and every entry a row.
    #[test]
    fn exit_codes_agree_with_readme_commands_table() {
        let mut seen = BTreeSet::new();
        for (commands, codes) in readme_rows() {
            for command in commands {
                let doc = doc_of(&command).unwrap_or_else(|| {
                    panic!(
                        "docs/commands.md's command `fencecron {command}` has no entry in COMMANDS"
                    )
                });
                let ours: BTreeSet<u8> = doc.exits.iter().map(|(c, _)| *c).collect();
                assert_eq!(
                    ours, codes,
                    "exit codes of `fencecron {command}`: COMMANDS vs the commands table of docs/commands.md"
                );
                seen.insert(doc.usage);
            }
        }
        for doc in COMMANDS {
            assert!(
                seen.contains(doc.usage),
                "COMMANDS has `{}`, the commands table of docs/commands.md does not",
                doc.usage
            );
        }
    }

    /// Every example parses with the real parser, as the command of the
    /// page it is on.
    #[test]
    fn examples_parse_as_their_command() {
        for doc in COMMANDS {
            for (line, _) in doc.examples {
                let argv = example_argv(line);
                Cli::try_parse_from(&argv)
                    .unwrap_or_else(|e| panic!("example `{line}` does not parse: {e}"));
                let matches = Cli::command().try_get_matches_from(&argv).unwrap();
                let mut path = Vec::new();
                let mut m = &matches;
                while let Some((name, sub)) = m.subcommand() {
                    path.push(name);
                    m = sub;
                }
                let path = path.join(" ");
                assert!(
                    doc.pages.contains(&path.as_str()),
                    "example `{line}` runs `fencecron {path}`, not a command of {:?}",
                    doc.pages
                );
            }
        }
    }

    /// Every page and every variable named exists: the pages are commands
    /// of the parser (not hidden), the variables are documented here.
    #[test]
    fn pages_and_variables_exist() {
        let cli = Cli::command();
        for doc in COMMANDS {
            for page in doc.pages {
                let mut cmd = &cli;
                for word in page.split(' ') {
                    cmd = cmd
                        .find_subcommand(word)
                        .unwrap_or_else(|| panic!("no command `fencecron {page}`"));
                }
                assert!(!cmd.is_hide_set());
            }
            for var in doc.env.iter().chain(STORE_ENV) {
                assert!(
                    ENVIRONMENT.iter().any(|(v, _)| v == var),
                    "{var} is not described in ENVIRONMENT"
                );
            }
            assert!(!doc.exits.is_empty());
            assert!(doc.examples.len() <= 3);
        }
    }
}
