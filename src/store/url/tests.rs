use super::*;

#[test]
fn redacts_passwords() {
    assert_eq!(redact("postgres://u:secret@db/x"), "postgres://u:***@db/x");
    assert_eq!(
        redact("mysql://root@127.0.0.1:3306/test"),
        "mysql://root@127.0.0.1:3306/test"
    );
    assert!(!redact("postgres://db/x?password=hunter2&sslmode=require").contains("hunter2"));
    assert!(!redact("postgres://u:p@ss@db/x").contains("p@ss"));
}

#[test]
fn redacts_every_spelling_of_a_password_parameter() {
    for key in [
        "password",
        "PASSWORD",
        "Password",
        "pass",
        "PASS",
        "passwd",
        "pwd",
        "PWD",
        "sslpassword",
        "ssl-password",
        "PASS%57ORD",
        "secret",
        "auth_token",
    ] {
        for url in [
            format!("postgres://u@db/x?sslmode=require&{key}=hunter2&a=b"),
            format!("mysql://u@db/x?{key}=hunter2"),
            // Not a URL the url crate accepts: the fallback redacts too.
            format!("postgres://u:hunter2@[db/x?{key}=hunter2"),
        ] {
            let r = redact(&url);
            assert!(!r.contains("hunter2"), "{url} -> {r}");
            assert!(r.contains("***"), "{url} -> {r}");
        }
    }
    let r = redact("postgres://u@db/x?sslkey=/etc/k.pem&sslmode=require");
    assert!(r.contains("/etc/k.pem") && r.contains("require"), "{r}");
}

#[test]
fn postgres_password_parameters_the_driver_ignores_are_refused() {
    let e = StoreUrl::parse("postgres://u@db/x?PASSWORD=hunter2").unwrap_err();
    assert!(e.contains("`PASSWORD`") && !e.contains("hunter2"), "{e}");
    assert!(StoreUrl::parse("postgres://u@db/x?pwd=hunter2").is_err());
    assert!(StoreUrl::parse("postgres://u@db/x?password=hunter2").is_ok());
    assert!(StoreUrl::parse("postgres://u@db/x?sslmode=require").is_ok());
}

#[test]
fn url_schemes() {
    assert_eq!(
        StoreUrl::parse("sqlite://x.db").unwrap().backend(),
        Backend::Sqlite
    );
    assert_eq!(
        StoreUrl::parse("mariadb://root@h/db").unwrap().expose(),
        "mysql://root@h/db"
    );
    assert!(StoreUrl::parse("redis://h")
        .unwrap_err()
        .contains("unsupported"));
    let u = StoreUrl::parse("postgres://u:pw@h/db").unwrap();
    assert!(!format!("{u} {u:?}").contains("pw"));
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn pg(raw: &str) -> PgTargets {
    StoreUrl::parse_with_env(raw, &no_env)
        .unwrap_or_else(|e| panic!("{raw}: {e}"))
        .pg_targets()
        .cloned()
        .unwrap()
}

#[test]
fn multi_host_urls_list_their_hosts_in_order() {
    let t = pg(
        "postgres://u:pw@h1:5432,h2:5433,h3/db?target_session_attrs=read-write&connect_timeout=3",
    );
    assert_eq!(t.hosts, ["h1:5432", "h2:5433", "h3"]);
    assert_eq!(t.attrs, TargetSessionAttrs::ReadWrite);
    assert_eq!(t.attrs_from, "the URL");
    assert_eq!(t.connect_timeout, Some(std::time::Duration::from_secs(3)));
    assert!(!t.is_plain());
    let t = pg("postgresql://[::1]:5432,127.0.0.1:5433/db");
    assert_eq!(t.hosts, ["[::1]:5432", "127.0.0.1:5433"]);
    assert_eq!(
        (t.attrs, t.attrs_from, t.connect_timeout),
        (TargetSessionAttrs::Any, "the default", None)
    );
    let t = pg("postgres://u@db.internal/x");
    assert_eq!(t.hosts, ["db.internal"]);
    assert!(t.is_plain());
    assert!(!pg("postgres://u@db/x?target_session_attrs=primary").is_plain());
}

#[test]
fn each_host_alone_goes_to_the_driver_without_fencecrons_own_parameters() {
    let u = StoreUrl::parse_with_env(
        "postgres://u:p%40ss@h1:5432,[::1]:5433,h3/db?sslmode=require&target_session_attrs=primary&connect_timeout=2",
        &no_env,
    )
    .unwrap();
    assert_eq!(
        u.driver_url(0),
        "postgres://u:p%40ss@h1:5432/db?sslmode=require"
    );
    assert_eq!(
        u.driver_url(1),
        "postgres://u:p%40ss@[::1]:5433/db?sslmode=require"
    );
    assert_eq!(u.driver_url(2), "postgres://u:p%40ss@h3/db?sslmode=require");
    assert_eq!(u.host_url(2), "postgres://u:***@h3/db?sslmode=require");
    let one = StoreUrl::parse_with_env("postgres://u@h/db?connect_timeout=5", &no_env).unwrap();
    assert_eq!(one.driver_url(0), "postgres://u@h/db");
    let plain = StoreUrl::parse_with_env("postgres://u@h/db?sslmode=disable", &no_env).unwrap();
    assert_eq!(plain.driver_url(0), "postgres://u@h/db?sslmode=disable");
}

#[test]
fn every_target_session_attrs_value_and_a_wrong_one() {
    for a in TargetSessionAttrs::ALL {
        let t = pg(&format!("postgres://h1,h2/db?target_session_attrs={a}"));
        assert_eq!(t.attrs, a);
        assert_eq!(TargetSessionAttrs::parse(a.as_str()), Ok(a));
    }
    let e = StoreUrl::parse_with_env(
        "postgres://u:hunter2@h1,h2/db?target_session_attrs=master",
        &no_env,
    )
    .unwrap_err();
    assert!(
        e.contains("`master`")
            && e.contains("any, read-write, read-only, primary, standby, prefer-standby"),
        "{e}"
    );
    assert!(!e.contains("hunter2") && e.contains("u:***@h1,h2"), "{e}");
    // What each accepts: (standby, read_only).
    use TargetSessionAttrs::*;
    assert!(ReadWrite.accepts(false, false) && !ReadWrite.accepts(true, true));
    assert!(
        !ReadWrite.accepts(false, true),
        "a read-only primary is not read-write"
    );
    assert!(ReadOnly.accepts(true, true) && ReadOnly.accepts(false, true));
    assert!(Primary.accepts(false, true) && !Primary.accepts(true, true));
    assert!(Standby.accepts(true, true) && !Standby.accepts(false, false));
    assert!(Any.accepts(true, true) && PreferStandby.accepts(false, false));
}

#[test]
fn the_environment_gives_what_the_url_does_not_say() {
    let env = |name: &str| match name {
        "PGTARGETSESSIONATTRS" => Some("primary".to_string()),
        "PGCONNECT_TIMEOUT" => Some("1".to_string()),
        _ => None,
    };
    let t = StoreUrl::parse_with_env("postgres://h1,h2/db", &env).unwrap();
    let t = t.pg_targets().unwrap();
    assert_eq!(
        (t.attrs, t.attrs_from),
        (TargetSessionAttrs::Primary, "PGTARGETSESSIONATTRS")
    );
    // libpq: a timeout of 1 second means 2.
    assert_eq!(t.connect_timeout, Some(std::time::Duration::from_secs(2)));
    let t = StoreUrl::parse_with_env(
        "postgres://h1,h2/db?target_session_attrs=any&connect_timeout=0",
        &env,
    )
    .unwrap();
    let t = t.pg_targets().unwrap();
    assert_eq!(
        (t.attrs, t.attrs_from),
        (TargetSessionAttrs::Any, "the URL")
    );
    assert_eq!(t.connect_timeout, None);
    let bad = |name: &str| (name == "PGTARGETSESSIONATTRS").then(|| "rw".to_string());
    let e = StoreUrl::parse_with_env("postgres://h1,h2/db", &bad).unwrap_err();
    assert!(
        e.contains("PGTARGETSESSIONATTRS") && e.contains("read-write"),
        "{e}"
    );
    // Not read for other backends.
    assert!(StoreUrl::parse_with_env("mysql://root@h/db", &bad).is_ok());
    // Nor are several hosts.
    let e = StoreUrl::parse_with_env("mysql://root@h1:3306,h2:3306/db", &no_env).unwrap_err();
    assert!(e.contains("not a valid URL"), "{e}");
}

#[test]
fn a_wrong_host_in_the_list_is_named() {
    let e = StoreUrl::parse_with_env("postgres://u:pw@h1:5432,h2:54x3/db", &no_env).unwrap_err();
    assert!(
        e.contains("`h2:54x3`") && e.contains("number 2") && !e.contains("pw@"),
        "{e}"
    );
    let e = StoreUrl::parse_with_env("postgres://h1,,h3/db", &no_env).unwrap_err();
    assert!(e.contains("empty host"), "{e}");
    let e = StoreUrl::parse_with_env("postgres:///db?host=h1,h2", &no_env).unwrap_err();
    assert!(e.contains("host part"), "{e}");
    let e =
        StoreUrl::parse_with_env("postgres://h1,h2/db?connect_timeout=soon", &no_env).unwrap_err();
    assert!(e.contains("connect_timeout `soon`"), "{e}");
}

#[test]
fn multi_host_urls_print_without_their_passwords() {
    for raw in [
        "postgres://u:hunter2@h1:5432,h2:5433/db",
        "postgres://u@h1,h2/db?password=hunter2&target_session_attrs=read-write",
        "postgresql://u:hunter2@[::1]:5432,h2/db?sslmode=disable",
    ] {
        let u = StoreUrl::parse_with_env(raw, &no_env).unwrap();
        for shown in [u.to_string(), format!("{u:?}"), redact(raw), u.host_url(1)] {
            assert!(!shown.contains("hunter2"), "{raw} -> {shown}");
            assert!(shown.contains("***"), "{raw} -> {shown}");
        }
        assert!(u.to_string().contains("h2"), "{u}");
    }
    assert_eq!(
        redact("postgres://u:pw@h1:5432,h2:5433/db?target_session_attrs=primary"),
        "postgres://u:***@h1:5432,h2:5433/db?target_session_attrs=primary"
    );
}
