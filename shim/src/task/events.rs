//! Where the task service's events go: an unbounded channel, in order, to one forwarder
//! that publishes them to containerd (as containerd's runc shim does). The service never
//! waits on containerd to publish; unit tests read the channel instead.

use std::time::Duration;

use containerd_shim::publisher::RemotePublisher;
use containerd_shim::Context;
use containerd_shim_protos::protobuf::MessageDyn;
use tokio::sync::{mpsc, oneshot};

/// How long the shim's exit waits for its last events to be published.
pub const FLUSH_DEADLINE: Duration = Duration::from_secs(5);

/// One event for containerd: its topic and message.
pub struct Event {
    pub topic: String,
    pub message: Box<dyn MessageDyn>,
}

enum Item {
    Event(Event),
    /// Answered once everything sent before it is published.
    Flush(oneshot::Sender<()>),
}

/// The sending end. Cheap to clone.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::UnboundedSender<Item>,
}

/// What a test reads from an [`EventSink::channel`].
pub struct EventReceiver(mpsc::UnboundedReceiver<Item>);

impl EventSink {
    /// A sink whose events containerd gets through `publisher`, for `namespace`.
    pub fn forward_to(publisher: RemotePublisher, namespace: &str) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let namespace = namespace.to_owned();
        tokio::spawn(async move {
            while let Some(item) = rx.recv().await {
                match item {
                    Item::Event(Event { topic, message }) => {
                        if let Err(e) = publisher
                            .publish(Context::default(), &topic, &namespace, message)
                            .await
                        {
                            log::warn!("publish {topic}: {e}");
                        }
                    }
                    Item::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        Self { tx }
    }

    /// A sink and the receiver its events go to (tests).
    pub fn channel() -> (Self, EventReceiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, EventReceiver(rx))
    }

    pub fn publish(&self, topic: &str, message: Box<dyn MessageDyn>) {
        let event = Event {
            topic: topic.to_owned(),
            message,
        };
        if self.tx.send(Item::Event(event)).is_err() {
            log::warn!("publish {topic}: the event forwarder is gone");
        }
    }

    /// Waits until every event sent so far is published (before the shim exits), at most
    /// [`FLUSH_DEADLINE`].
    pub async fn flush(&self) {
        let (done, published) = oneshot::channel();
        if self.tx.send(Item::Flush(done)).is_ok()
            && tokio::time::timeout(FLUSH_DEADLINE, published)
                .await
                .is_err()
        {
            log::warn!("events not published within {FLUSH_DEADLINE:?} of the shim's exit");
        }
    }
}

impl EventReceiver {
    /// The events sent so far, in order (flushes are answered).
    pub fn drain(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Ok(item) = self.0.try_recv() {
            match item {
                Item::Event(e) => events.push(e),
                Item::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
        events
    }

    /// The topics of [`EventReceiver::drain`].
    pub fn topics(&mut self) -> Vec<String> {
        self.drain().into_iter().map(|e| e.topic).collect()
    }
}
