//! What a job's environment gains and loses because of the store it runs
//! against (docs/principles.md, principle 11: credentials never reach a job's
//! environment or argv).
//!
//! A job inherits the environment of the daemon (or of `fencecron exec`),
//! and `fencecron put/get` inside it must reach the same store with no
//! flags. The policy, in one place:
//!
//! - **Removed** from the inherited environment: `FENCECRON_STORE` and
//!   `FENCECRON_STORE_FILE` (replaced below), the variable named by
//!   `store.url_env`, the driver's password variable (`PGPASSWORD` for a
//!   PostgreSQL store, `MYSQL_PWD` for a MySQL one), and every other variable
//!   whose value contains the store's password.
//! - **Set**: `FENCECRON_BIN`, `FENCECRON_CONFIG` (absolute) when a config
//!   was loaded, and the store itself: `FENCECRON_STORE` with the exact URL
//!   when it carries no credential (an absolute `sqlite://` path, or a
//!   server URL without a password), else `FENCECRON_STORE_FILE`, the path
//!   of a private file (directory 0700, file 0600) holding the full URL,
//!   which lives as long as the [`ChildEnv`] does.
//!
//! Why the exact URL rather than "read the config again" for a server URL
//! without a password: the daemon keeps the store it started with when
//! `jobs.toml` is edited (a store change needs a restart), so a job that
//! re-read the file could fence against a different store than the one its
//! lease is in (principle 10). The URL without a password is no secret.
//!
//! Why PostgreSQL's `PGPASSWORD` goes into the file when the URL has no
//! password: the driver (sqlx) authenticates with it, and the job no longer
//! inherits it.

use std::ffi::{OsStr, OsString};
use std::fs::{DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::store::{Backend, StoreUrl};

/// The variable a job finds its store URL in, when it carries no credential.
pub const STORE_VAR: &str = "FENCECRON_STORE";
/// The variable naming the private file a job reads its store URL from.
pub const STORE_FILE_VAR: &str = "FENCECRON_STORE_FILE";

/// The daemon's own variables from systemd (its notification socket and
/// watchdog): a job or hook must not report readiness or pings for it.
pub const DAEMON_ONLY: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// The environment changes applied to every job, on top of what it
/// inherits: first `remove`, then the job's own `env`, then `set`.
#[derive(Clone, Default)]
pub struct ChildEnv {
    /// Variables set on the job.
    pub set: Vec<(String, String)>,
    /// Inherited variables the job must not see.
    pub remove: Vec<OsString>,
    /// Of `remove`, the inherited variables removed only because their
    /// value contains the store's password (not one of the names above),
    /// for the log: names only, never values.
    pub scrubbed: Vec<String>,
    /// Keeps the private URL file alive; removed when the last clone goes.
    _url_file: Option<Arc<PrivateUrlFile>>,
}

/// The store as this process resolved it, and how it was configured.
pub struct JobStore<'a> {
    /// The store URL (SQLite paths already absolute).
    pub url: &'a StoreUrl,
    /// The config file that was loaded, if any.
    pub config_path: Option<&'a Path>,
    /// The config's `store.url_env`, if set.
    pub url_env: Option<&'a str>,
}

impl ChildEnv {
    /// The environment changes for jobs started against `store` by this
    /// process. Creates the private URL file when one is needed; an error
    /// here means it could not be created.
    pub fn new(store: &JobStore<'_>) -> std::io::Result<ChildEnv> {
        let private_dir = std::env::var_os("RUNTIME_DIRECTORY")
            .and_then(|d| {
                // systemd may pass several directories separated by colons.
                d.as_bytes()
                    .split(|b| *b == b':')
                    .next()
                    .map(|first| PathBuf::from(OsStr::from_bytes(first)))
            })
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or_else(std::env::temp_dir);
        Self::build(store, std::env::vars_os(), &private_dir)
    }

    /// [`ChildEnv::new`] with the inherited environment and the directory
    /// for the private file given (for tests).
    fn build(
        store: &JobStore<'_>,
        inherited: impl IntoIterator<Item = (OsString, OsString)>,
        private_dir: &Path,
    ) -> std::io::Result<ChildEnv> {
        let inherited: Vec<(OsString, OsString)> = inherited.into_iter().collect();
        let lookup = |name: &str| {
            inherited
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.to_str())
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let credentials = Credentials::of(store.url, lookup("PGPASSWORD").as_deref());

        let mut remove: Vec<OsString> = vec![STORE_VAR.into(), STORE_FILE_VAR.into()];
        if let Some(var) = store.url_env {
            remove.push(var.into());
        }
        match store.url.backend() {
            Backend::Postgres => remove.push("PGPASSWORD".into()),
            Backend::MySql => remove.push("MYSQL_PWD".into()),
            Backend::Sqlite => {}
        }
        let mut scrubbed = Vec::new();
        for (name, value) in &inherited {
            if !remove.contains(name) && credentials.appear_in(value) {
                remove.push(name.clone());
                scrubbed.push(name.to_string_lossy().into_owned());
            }
        }

        let mut set = Vec::new();
        if let Ok(exe) = std::env::current_exe() {
            set.push(("FENCECRON_BIN".to_string(), exe.display().to_string()));
        }
        if let Some(path) = store.config_path {
            let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            set.push(("FENCECRON_CONFIG".to_string(), path.display().to_string()));
        }
        let url_file = if credentials.secrets.is_empty() {
            set.push((STORE_VAR.to_string(), credentials.url));
            None
        } else {
            let file = PrivateUrlFile::create(private_dir, &credentials.url)?;
            set.push((STORE_FILE_VAR.to_string(), file.path.display().to_string()));
            Some(Arc::new(file))
        };
        Ok(ChildEnv {
            set,
            remove,
            scrubbed,
            _url_file: url_file,
        })
    }

    /// The private file holding the store URL, when there is one.
    #[cfg(test)]
    pub fn url_file(&self) -> Option<&Path> {
        self._url_file.as_deref().map(|f| f.path.as_path())
    }
}

/// The URL a job is to use, and the secrets in it.
struct Credentials {
    /// The URL, with `PGPASSWORD` filled in when the driver would have used
    /// it.
    url: String,
    /// Every non-empty password, in each form it can appear in (as written
    /// in the URL, percent-decoded).
    secrets: Vec<Vec<u8>>,
}

impl Credentials {
    fn of(store: &StoreUrl, pgpassword: Option<&str>) -> Credentials {
        let raw = store.expose().to_string();
        let mut secrets: Vec<Vec<u8>> = Vec::new();
        let mut add = |s: &str| {
            for form in [s.as_bytes().to_vec(), percent_decode(s)] {
                if !form.is_empty() && !secrets.contains(&form) {
                    secrets.push(form);
                }
            }
        };
        if store.backend() == Backend::Sqlite {
            return Credentials {
                url: raw,
                secrets: Vec::new(),
            };
        }
        // A multi-host PostgreSQL URL is read with its host list set aside.
        let Ok((mut url, hosts)) = crate::store::parse_lenient(&raw) else {
            // StoreUrl::parse accepted it as a URL; nothing else to find.
            return Credentials {
                url: raw,
                secrets: Vec::new(),
            };
        };
        let mut has_password = false;
        if let Some(p) = url.password().filter(|p| !p.is_empty()) {
            add(p);
            has_password = true;
        }
        // `?password=…` and every other spelling of a secret parameter
        // (`PASSWORD`, `pwd`, `sslpassword`, …), as written and decoded.
        for pair in url.query().unwrap_or("").split('&') {
            if let Some((k, v)) = pair.split_once('=') {
                let name = String::from_utf8_lossy(&percent_decode(k)).into_owned();
                if crate::store::is_secret_param(&name) && !v.is_empty() {
                    add(v);
                    add(&v.replace('+', " "));
                    has_password |= name.eq_ignore_ascii_case("password");
                }
            }
        }
        if store.backend() == Backend::Postgres && !has_password {
            if let Some(pw) = pgpassword {
                add(pw);
                if url.set_password(Some(pw)).is_err() {
                    url.query_pairs_mut().append_pair("password", pw);
                }
                return Credentials {
                    url: crate::store::unparse(&url, hosts.as_deref()),
                    secrets,
                };
            }
        }
        Credentials { url: raw, secrets }
    }

    /// Whether any secret occurs in `value`.
    fn appear_in(&self, value: &OsStr) -> bool {
        let value = value.as_bytes();
        self.secrets
            .iter()
            .any(|s| value.windows(s.len()).any(|w| w == s.as_slice()))
    }
}

/// `%XX` sequences decoded; anything else kept as it is.
fn percent_decode(s: &str) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(hi), Some(lo)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// A file only this user can read, holding the store URL, in a directory
/// of its own; both are removed on drop.
struct PrivateUrlFile {
    dir: PathBuf,
    path: PathBuf,
}

impl PrivateUrlFile {
    fn create(parent: &Path, url: &str) -> std::io::Result<PrivateUrlFile> {
        let dir = parent.join(format!("fencecron-{}", uuid::Uuid::new_v4().simple()));
        // Not recursive, and failing if it exists: a directory someone else
        // prepared in a shared /tmp is never used.
        DirBuilder::new().mode(0o700).create(&dir)?;
        let path = dir.join("store-url");
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(url.as_bytes()));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_dir(&dir);
            return Err(e);
        }
        Ok(PrivateUrlFile { dir, path })
    }
}

impl Drop for PrivateUrlFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Reads the store URL from the file `$FENCECRON_STORE_FILE` names.
pub fn read_url_file(path: &Path) -> std::io::Result<String> {
    std::fs::read_to_string(path).map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn build(url: &str, url_env: Option<&str>, inherited: &[(&str, &str)]) -> ChildEnv {
        let url = StoreUrl::parse(url).unwrap();
        let dir = std::env::temp_dir();
        ChildEnv::build(
            &JobStore {
                url: &url,
                config_path: None,
                url_env,
            },
            env(inherited),
            &dir,
        )
        .unwrap()
    }

    fn get<'a>(c: &'a ChildEnv, k: &str) -> Option<&'a str> {
        c.set.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    fn removes(c: &ChildEnv, k: &str) -> bool {
        c.remove.iter().any(|n| n == k)
    }

    #[test]
    fn url_without_password_is_passed_as_is() {
        let c = build(
            "postgres://fencecron@db/fencecron",
            None,
            &[("PATH", "/bin"), ("FENCECRON_STORE", "postgres://x")],
        );
        assert_eq!(
            get(&c, "FENCECRON_STORE"),
            Some("postgres://fencecron@db/fencecron")
        );
        assert!(get(&c, "FENCECRON_STORE_FILE").is_none() && c.url_file().is_none());
        assert!(removes(&c, "FENCECRON_STORE") && removes(&c, "PGPASSWORD"));
        assert!(!removes(&c, "PATH"));
        assert!(c.scrubbed.is_empty());
    }

    #[test]
    fn password_goes_to_a_private_file_and_out_of_the_environment() {
        let c = build(
            "postgres://fencecron:p%40ss-w0rd@db/fencecron",
            Some("DB_URL"),
            &[
                ("PATH", "/bin"),
                ("DB_URL", "postgres://fencecron:p%40ss-w0rd@db/fencecron"),
                ("OTHER_COPY", "x=postgres://fencecron:p%40ss-w0rd@db/f"),
                ("DECODED", "p@ss-w0rd"),
                ("MYSQL_PWD", "unrelated"),
            ],
        );
        assert!(get(&c, "FENCECRON_STORE").is_none());
        let file = c.url_file().expect("a private file").to_path_buf();
        assert_eq!(
            get(&c, "FENCECRON_STORE_FILE"),
            Some(file.to_str().unwrap())
        );
        assert_eq!(
            read_url_file(&file).unwrap(),
            "postgres://fencecron:p%40ss-w0rd@db/fencecron"
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(file.parent().unwrap()), 0o700);
        for var in ["DB_URL", "OTHER_COPY", "DECODED", "FENCECRON_STORE"] {
            assert!(removes(&c, var), "{var} is removed");
        }
        assert_eq!(c.scrubbed, ["OTHER_COPY", "DECODED"]);
        assert!(!removes(&c, "PATH") && !removes(&c, "MYSQL_PWD"));
        // The file lives as long as the last clone.
        let clone = c.clone();
        drop(c);
        assert!(file.exists());
        drop(clone);
        assert!(!file.exists() && !file.parent().unwrap().exists());
    }

    #[test]
    fn pgpassword_is_moved_into_the_file() {
        let c = build(
            "postgres://fencecron@db/fencecron",
            None,
            &[("PGPASSWORD", "s3cr3t/@x"), ("COPY", "s3cr3t/@x")],
        );
        let file = c.url_file().expect("PGPASSWORD needs the file");
        let url = read_url_file(file).unwrap();
        assert_eq!(url, "postgres://fencecron:s3cr3t%2F%40x@db/fencecron");
        assert!(removes(&c, "PGPASSWORD") && removes(&c, "COPY"));
        // MySQL's driver does not read MYSQL_PWD; it is only removed.
        let c = build("mysql://root@db/f", None, &[("MYSQL_PWD", "pw")]);
        assert_eq!(get(&c, "FENCECRON_STORE"), Some("mysql://root@db/f"));
        assert!(removes(&c, "MYSQL_PWD") && !removes(&c, "PGPASSWORD"));
    }

    #[test]
    fn a_multi_host_urls_password_is_a_secret_and_pgpassword_fills_it() {
        let c = build(
            "postgres://fencecron:hunter2@h1:5432,h2:5433/f?target_session_attrs=read-write",
            None,
            &[("COPY", "hunter2")],
        );
        assert!(
            removes(&c, "COPY"),
            "the password is found in a multi-host URL"
        );
        let c = build(
            "postgres://fencecron@h1:5432,h2:5433/f",
            None,
            &[("PGPASSWORD", "s3cr3t")],
        );
        let url = read_url_file(c.url_file().expect("PGPASSWORD needs the file")).unwrap();
        assert_eq!(url, "postgres://fencecron:s3cr3t@h1:5432,h2:5433/f");
    }

    #[test]
    fn query_password_counts() {
        let c = build(
            "mysql://root@db/f?password=hunter%2B2",
            None,
            &[("X", "hunter+2")],
        );
        assert!(c.url_file().is_some() && removes(&c, "X"));
    }

    #[test]
    fn sqlite_is_passed_and_unrelated_password_variables_stay() {
        let c = build(
            "sqlite:///var/lib/fencecron/fencecron.db",
            None,
            &[("PGPASSWORD", "theirs"), ("MYSQL_PWD", "theirs")],
        );
        assert_eq!(
            get(&c, "FENCECRON_STORE"),
            Some("sqlite:///var/lib/fencecron/fencecron.db")
        );
        assert!(!removes(&c, "PGPASSWORD") && !removes(&c, "MYSQL_PWD"));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%40b%2"), b"a@b%2".to_vec());
        assert_eq!(percent_decode("%zz%41"), b"%zzA".to_vec());
    }
}
