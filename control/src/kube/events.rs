//! Posting [`Notice`]s as Kubernetes Events (`events.k8s.io/v1`).
//!
//! A notice that repeats one posted in the last [`SERIES_TTL`] (same object, type, reason,
//! action and message) extends that Event's series (`series.count`, `lastObservedTime`), as
//! kube-rs' `Recorder` does; unlike the `Recorder`, whose series are keyed without the
//! message, a notice with another message is an Event of its own. The gateway gives one
//! Service several notices of one reason (two bad ports, two source ranges, an address held
//! first by one Service and then by another), and each says something the operator needs:
//! merged, `kubectl describe` would show the first message with a count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
use kube::Client;

use crate::kubemodel::events::{Notice, NoticeType};

/// How long a posted Event can take repeats into its series: kube-rs' `Recorder`'s cache
/// time, so the series look as they do from other controllers.
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);

/// What makes two notices one Event series.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    warning: bool,
    reason: String,
    action: &'static str,
    note: String,
}

/// An Event posted, as the series needs it.
#[derive(Clone, Debug)]
struct Posted {
    name: String,
    namespace: String,
    count: i32,
    last: Timestamp,
}

/// Publishes notices as Events.
#[derive(Clone)]
pub struct Emitter {
    client: Client,
    reporter: Reporter,
    posted: Arc<Mutex<HashMap<SeriesKey, Posted>>>,
}

impl std::fmt::Debug for Emitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emitter").finish_non_exhaustive()
    }
}

impl Emitter {
    /// An emitter reporting as `controller` (`reportingController`; the instance is the
    /// host name).
    pub fn new(client: Client, controller: &str) -> Self {
        Self {
            client,
            reporter: Reporter::from(controller),
            posted: Arc::default(),
        }
    }

    /// Publishes one notice: a new Event, or the next of a series.
    ///
    /// # Errors
    /// When the API server refuses or cannot be reached.
    pub async fn emit(&self, n: &Notice) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let note = note_of(&n.message);
        let key = SeriesKey {
            namespace: n.regarding.namespace.clone(),
            name: n.regarding.name.clone(),
            uid: n.regarding.uid.clone(),
            warning: n.type_ == NoticeType::Warning,
            reason: n.reason.clone(),
            action: n.action(),
            note: note.clone(),
        };
        let repeat = {
            let mut posted = self.posted.lock().unwrap_or_else(|e| e.into_inner());
            posted.retain(|_, p| p.last + SERIES_TTL > now);
            posted.get(&key).cloned()
        };
        let mut posted = None;
        if let Some(p) = repeat {
            let count = p.count + 1;
            let patch = serde_json::json!({
                "series": EventSeries { count, last_observed_time: MicroTime(now) },
            });
            let patched = Api::<Event>::namespaced(self.client.clone(), &p.namespace)
                .patch(&p.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            match patched {
                Ok(_) => {
                    posted = Some(Posted {
                        count,
                        last: now,
                        ..p
                    })
                }
                // Gone meanwhile (deleted, or expired by the API server's event TTL): the
                // repeat starts a new Event.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let posted = match posted {
            Some(p) => p,
            None => {
                let ev = self.event(n, note, now);
                let namespace = ev.metadata.namespace.clone().unwrap_or_default();
                let name = ev.metadata.name.clone().unwrap_or_default();
                Api::<Event>::namespaced(self.client.clone(), &namespace)
                    .create(&PostParams::default(), &ev)
                    .await?;
                Posted {
                    name,
                    namespace,
                    count: 1,
                    last: now,
                }
            }
        };
        self.posted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, posted);
        Ok(())
    }

    /// The Event for notice `n` with note `note`, first of its series, at `now`.
    fn event(&self, n: &Notice, note: String, now: Timestamp) -> Event {
        let r: &ObjectReference = &n.regarding;
        let namespace = r.namespace.clone().unwrap_or_else(|| "default".to_owned());
        Event {
            action: Some(n.action().to_owned()),
            reason: Some(n.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(r.clone()),
            note: Some(note),
            metadata: ObjectMeta {
                namespace: Some(namespace),
                // As kube-rs names them: the object's name and the time, unique per post.
                name: Some(format!(
                    "{}.{:x}",
                    r.name.as_deref().unwrap_or(&self.reporter.controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(
                match n.type_ {
                    NoticeType::Normal => "Normal",
                    NoticeType::Warning => "Warning",
                }
                .to_owned(),
            ),
            ..Event::default()
        }
    }
}

/// The longest note the API takes (1 kB, counted in bytes).
const NOTE_MAX: usize = 1024;

/// `message` cut to [`NOTE_MAX`] bytes at a character boundary.
fn note_of(message: &str) -> String {
    let mut end = message.len().min(NOTE_MAX);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_cut_to_the_apis_bytes_at_a_character_boundary() {
        assert_eq!(note_of("short"), "short");
        let ascii = "a".repeat(2000);
        assert_eq!(note_of(&ascii).len(), NOTE_MAX);
        // Three bytes a character: 1024 is not a boundary, 1023 is.
        let wide = "\u{20ac}".repeat(500);
        let cut = note_of(&wide);
        assert_eq!(cut.len(), 1023);
        assert!(cut.chars().all(|c| c == '\u{20ac}'));
    }
}
