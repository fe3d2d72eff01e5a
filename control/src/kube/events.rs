//! Posting [`Notice`]s as Kubernetes Events (`events.k8s.io/v1`, through kube-rs'
//! [`Recorder`], which also turns repeats into an event series).

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;

use crate::kubemodel::events::{Notice, NoticeType};

/// Publishes notices as Events.
#[derive(Clone)]
pub struct Emitter {
    recorder: Recorder,
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
            recorder: Recorder::new(client, Reporter::from(controller)),
        }
    }

    /// Publishes one notice.
    ///
    /// # Errors
    /// When the API server refuses or cannot be reached.
    pub async fn emit(&self, n: &Notice) -> Result<(), kube::Error> {
        let ev = Event {
            type_: match n.type_ {
                NoticeType::Normal => EventType::Normal,
                NoticeType::Warning => EventType::Warning,
            },
            reason: n.reason.clone(),
            // The API refuses notes above 1 kB.
            note: Some(n.message.chars().take(1000).collect()),
            action: n.action().to_owned(),
            secondary: None,
        };
        self.recorder.publish(&ev, &n.regarding).await
    }
}
