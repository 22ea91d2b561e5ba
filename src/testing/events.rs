//! The events a test logged: a `tracing` layer installed as this thread's
//! default subscriber ([`Captured::start`]). `#[tokio::test]` runs every
//! task on the test's thread, so everything the daemon logs in-process is
//! seen, and nothing of the tests running beside it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// One logged event: its level and its fields (`event` names it), as text.
#[derive(Debug, Clone)]
pub(crate) struct Logged {
    pub level: tracing::Level,
    pub fields: BTreeMap<String, String>,
}

impl Logged {
    /// The field `name`, as text (`""` when absent).
    pub(crate) fn get(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", String::as_str)
    }
}

/// Every event logged on this thread since [`Captured::start`].
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<Logged>>>);

impl Captured {
    /// Captures from now until the guard is dropped.
    pub(crate) fn start() -> (Captured, DefaultGuard) {
        two_dispatchers_at_least();
        let captured = Captured::default();
        let subscriber = tracing_subscriber::registry().with(Capture(captured.clone()));
        (captured, tracing::subscriber::set_default(subscriber))
    }

    /// The events named `event`, in order.
    pub(crate) fn named(&self, event: &str) -> Vec<Logged> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|e| e.get("event") == event)
            .cloned()
            .collect()
    }
}

/// Keeps one more dispatcher registered for the life of the test process.
///
/// tracing caches each callsite's interest process-wide, computed when the
/// callsite is first hit. While at most one dispatcher is registered,
/// tracing-core (0.1.36, `Rebuilder::JustOne`) computes it from the default
/// of the thread that hits it first: a test thread without a subscriber
/// then caches `never` for a callsite while another test's capture is the
/// one dispatcher, and that capture silently misses the event (seen once:
/// a DEBUG `store_unavailable` missing from
/// `an_outage_warns_once_per_job_and_logs_when_it_ends` in a full run).
/// With two registered, the interest is the union over all of them, so a
/// live capture is always asked.
fn two_dispatchers_at_least() {
    static KEPT: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    KEPT.get_or_init(|| tracing::Dispatch::new(tracing_subscriber::registry()));
}

struct Capture(Captured);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0
             .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Logged {
                level: *event.metadata().level(),
                fields,
            });
    }
}
