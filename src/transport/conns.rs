//! The connections a server holds, for its caps and for choosing which one to close when full:
//! shared by the webhook port ([`super::server`]) and the probe port ([`super::probe`]), so that
//! neither can be locked by clients that only hold sockets.
//!
//! A full server closes a connection to make room for a new one: one of the source that holds
//! the most connections (so that many sockets from a few pods cannot push out the one or two a
//! kubelet or an API server holds), and of that source's, in this order: one that never sent a
//! request head in the [`YOUNG`] it had to (longest open first), one idle between requests (idle
//! longest first), one whose request is still arriving (least of its body read first), then one
//! just accepted that has not sent its request yet (longest open first: a kubelet's probe sends
//! its request within a millisecond of connecting, and is not pushed out by the keep-alive
//! sockets held around it). Only a connection with a request wholly read whose admission is
//! running is never chosen: a slow body holds its slot no better than an idle socket does, and
//! a reply the client does not take ([`Answering`]) no better than a body still arriving, and
//! for a bounded time only.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::header::{CONTENT_TYPE, HeaderValue};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long a new connection has to send its first request head before it is closed, when room
/// is needed, ahead of idle ones.
pub const YOUNG: Duration = Duration::from_secs(1);

/// Requests in flight (head parsed, answer not yet sent) in the low bits of a slot's state,
/// requests being answered (body read) from [`ANSWERING_ONE`], and [`SHED`] once the registry
/// chose to close the connection: one word, so a connection is never shed while it answers.
const IN_FLIGHT_MASK: u64 = (1 << 24) - 1;
const ANSWERING_ONE: u64 = 1 << 24;
const ANSWERING_MASK: u64 = ((1 << 24) - 1) << 24;
const SHED: u64 = 1 << 63;

/// One open connection as the registry sees it.
pub struct Slot {
    id: u64,
    pub source: IpAddr,
    pub accepted: Instant,
    state: AtomicU64,
    /// A request head has been parsed on this connection.
    served: AtomicBool,
    /// When the last request finished, in milliseconds after `accepted`.
    idle_since_ms: AtomicU64,
    /// Body bytes read of the requests in flight: how far along a request still arriving is.
    body_read: AtomicU64,
    /// The registry chose this connection to close: its task ends the connection.
    pub shed: Notify,
    /// A request ended: the connection's timers are looked at again.
    pub request_ended: Notify,
}

impl Slot {
    pub fn served(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    pub fn idle_since(&self) -> Instant {
        self.accepted + Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed))
    }

    pub fn in_flight(&self) -> u64 {
        self.state.load(Ordering::Acquire) & IN_FLIGHT_MASK
    }

    /// A request head was parsed: the request is in flight until the returned guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.served.store(true, Ordering::Relaxed);
        self.state.fetch_add(1, Ordering::AcqRel);
        InFlight {
            slot: self.clone(),
            answering: false,
            read: 0,
        }
    }

    /// Marks the connection for closing if nothing on it is being answered.
    fn try_shed(&self) -> bool {
        self.state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & (ANSWERING_MASK | SHED) == 0).then_some(s | SHED)
            })
            .is_ok()
    }

    /// How eagerly this connection is closed to make room (lower first), or `None` when it is
    /// answering a request and so never chosen.
    fn shed_rank(&self) -> Option<(u8, u128, u64)> {
        // Answering a request: never chosen.
        if self.state.load(Ordering::Acquire) & ANSWERING_MASK != 0 {
            return None;
        }
        let since = |at: Instant| at.elapsed().as_nanos();
        let (class, order) = match (self.in_flight(), self.served()) {
            // Longest open (or idle) first: the larger the age, the earlier.
            (0, false) if self.accepted.elapsed() >= YOUNG => (0, u128::MAX - since(self.accepted)),
            (0, false) => (3, u128::MAX - since(self.accepted)),
            (0, true) => (1, u128::MAX - since(self.idle_since())),
            // A request still arriving: the least read first.
            _ => (2, u128::from(self.body_read.load(Ordering::Relaxed))),
        };
        // Then the one accepted first.
        Some((class, order, self.id))
    }
}

/// A request in flight on a slot; dropping it marks the connection idle from now.
pub struct InFlight {
    slot: Arc<Slot>,
    answering: bool,
    read: u64,
}

impl InFlight {
    /// `n` more bytes of the body have arrived.
    pub fn read(&mut self, n: usize) {
        let n = n as u64;
        self.read += n;
        self.slot.body_read.fetch_add(n, Ordering::Relaxed);
    }

    /// The body is wholly read and the request is being answered: until its reply is made the
    /// connection is not closed to make room. `false` when it was chosen for closing already.
    pub fn answering(&mut self) -> bool {
        let begun = self
            .slot
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & SHED == 0).then_some(s + ANSWERING_ONE)
            })
            .is_ok();
        self.answering |= begun;
        begun
    }

    /// The reply is made: from now the request protects its connection no better than a body
    /// still arriving does, and the bytes of its body no longer rank it last among those.
    fn answered(&mut self) {
        if std::mem::take(&mut self.answering) {
            self.slot.state.fetch_sub(ANSWERING_ONE, Ordering::AcqRel);
        }
        let read = std::mem::take(&mut self.read);
        self.slot.body_read.fetch_sub(read, Ordering::Relaxed);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let slot = &self.slot;
        let ms = u64::try_from(slot.accepted.elapsed().as_millis()).unwrap_or(u64::MAX);
        slot.idle_since_ms.store(ms, Ordering::Relaxed);
        slot.body_read.fetch_sub(self.read, Ordering::Relaxed);
        let done = 1 + if self.answering { ANSWERING_ONE } else { 0 };
        slot.state.fetch_sub(done, Ordering::AcqRel);
        slot.request_ended.notify_one();
    }
}

/// How much of a reply is handed to the connection at a time: the rest stays here, so what the
/// client has not taken is held once, and the deadline below sees whether it was taken.
const REPLY_CHUNK: usize = 16 * 1024;

/// A response body that keeps its request in flight (the connection is not idle) until the
/// connection has taken the last of it, in [`REPLY_CHUNK`]s as the client makes room for them.
/// A client that does not take it within the deadline given (an HTTP/2 window it never opens, a
/// receive buffer it never reads) has its connection closed: a reply, up to
/// `http.maxReplyBytes`, is not held for longer on its behalf.
pub struct Answering {
    left: hyper::body::Bytes,
    _in_flight: InFlight,
    /// Dropped when the reply is taken, or the connection closed: the deadline's watch ends.
    _taken: tokio::sync::oneshot::Sender<()>,
}

impl Answering {
    /// The response with `status`, `content_type` and `body`, in flight until it is taken; the
    /// connection is closed if that takes longer than `take_within`.
    pub fn response(
        status: u16,
        content_type: &'static str,
        body: Vec<u8>,
        mut in_flight: InFlight,
        take_within: Duration,
    ) -> hyper::Response<Self> {
        in_flight.answered();
        let (taken, not_taken) = tokio::sync::oneshot::channel::<()>();
        let slot = in_flight.slot.clone();
        tokio::spawn(async move {
            if tokio::time::timeout(take_within, not_taken).await.is_err() {
                tracing::debug!(peer = %slot.source, "reply not taken in time: connection closed");
                slot.shed.notify_one();
            }
        });
        let mut resp = hyper::Response::new(Self {
            left: body.into(),
            _in_flight: in_flight,
            _taken: taken,
        });
        *resp.status_mut() =
            hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        resp
    }
}

impl hyper::body::Body for Answering {
    type Data = hyper::body::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let n = self.left.len().min(REPLY_CHUNK);
        std::task::Poll::Ready((n > 0).then(|| Ok(hyper::body::Frame::data(self.left.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left.len() as u64)
    }
}

#[derive(Default)]
struct Table {
    slots: HashMap<u64, Arc<Slot>>,
    per_source: HashMap<IpAddr, usize>,
    next_id: u64,
}

impl Table {
    fn remove(&mut self, id: u64) -> bool {
        let Some(slot) = self.slots.remove(&id) else {
            return false;
        };
        if let Some(n) = self.per_source.get_mut(&slot.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&slot.source);
            }
        }
        true
    }

    /// Closes one connection (from `source` only, if given) to make room: of the source that
    /// holds the most, then in the order of [`Slot::shed_rank`]. Connections answering a
    /// request are never chosen.
    fn shed_one(&mut self, source: Option<IpAddr>, what: &str) -> bool {
        let mut skip = Vec::new();
        loop {
            let held = |s: &Slot| self.per_source.get(&s.source).copied().unwrap_or(0);
            let victim = self
                .slots
                .values()
                .filter(|s| source.is_none_or(|src| s.source == src) && !skip.contains(&s.id))
                .filter_map(|s| s.shed_rank().map(|rank| ((Reverse(held(s)), rank), s)))
                .min_by_key(|(key, _)| *key)
                .map(|(_, s)| s.clone());
            let Some(victim) = victim else {
                return false;
            };
            if victim.try_shed() {
                self.remove(victim.id);
                victim.shed.notify_one();
                tracing::debug!(
                    peer = %victim.source,
                    served = victim.served(),
                    reading = victim.in_flight(),
                    "{what}: connection shed to make room"
                );
                return true;
            }
            // A request began to be answered on it meanwhile: look again without it.
            skip.push(victim.id);
        }
    }
}

/// What [`Registry::admit`] decided for a new connection.
pub enum Admit {
    Open(Arc<Slot>),
    /// The source is at its cap and every connection it holds is answering.
    Refused,
    /// The server is at its cap and every connection is answering.
    Full,
}

/// Every open connection of one listener, for its caps and for choosing which one to close.
pub struct Registry {
    table: Mutex<Table>,
    /// A connection closed: a full listener can admit again.
    pub freed: Notify,
    max: usize,
    max_per_source: usize,
    /// The listener's name in log lines.
    what: &'static str,
}

impl Registry {
    pub fn new(what: &'static str, max: usize, max_per_source: usize) -> Self {
        Self {
            table: Mutex::new(Table::default()),
            freed: Notify::new(),
            max: max.max(1),
            max_per_source: max_per_source.max(1),
            what,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // The table holds counts only; a panic elsewhere cannot leave it half-updated.
        super::unpoisoned(self.table.lock())
    }

    /// A slot for a new connection from `source`, closing another to make room if need be.
    pub fn admit(&self, source: IpAddr) -> Admit {
        let mut t = self.lock();
        let from_source = t.per_source.get(&source).copied().unwrap_or(0);
        if from_source >= self.max_per_source && !t.shed_one(Some(source), self.what) {
            return Admit::Refused;
        }
        if t.slots.len() >= self.max && !t.shed_one(None, self.what) {
            return Admit::Full;
        }
        t.next_id += 1;
        let slot = Arc::new(Slot {
            id: t.next_id,
            source,
            accepted: Instant::now(),
            state: AtomicU64::new(0),
            served: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            body_read: AtomicU64::new(0),
            shed: Notify::new(),
            request_ended: Notify::new(),
        });
        t.slots.insert(slot.id, slot.clone());
        *t.per_source.entry(source).or_insert(0) += 1;
        Admit::Open(slot)
    }

    /// The guard that removes `slot` from the registry when its connection task ends, however
    /// it ends.
    pub fn release_on_drop(self: &Arc<Self>, slot: &Slot) -> Release {
        Release(self.clone(), slot.id)
    }
}

/// Removes a slot from its registry when dropped ([`Registry::release_on_drop`]).
pub struct Release(Arc<Registry>, u64);

impl Drop for Release {
    fn drop(&mut self) {
        if self.0.lock().remove(self.1) {
            self.0.freed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn open(r: &Registry, source: IpAddr) -> Arc<Slot> {
        match r.admit(source) {
            Admit::Open(slot) => slot,
            _ => panic!("not admitted"),
        }
    }

    #[tokio::test]
    async fn a_full_registry_sheds_silent_then_idle_then_the_least_read_body_and_never_one_answering()
     {
        let r = Registry::new("test", 4, 4);
        let answering = open(&r, ip(1));
        let mut a = answering.begin();
        assert!(a.answering());
        let reading_more = open(&r, ip(2));
        let mut more = reading_more.begin();
        more.read(1000);
        let reading_less = open(&r, ip(3));
        let mut less = reading_less.begin();
        less.read(10);
        let idle = open(&r, ip(4));
        drop(idle.begin());
        // Full: the idle one goes first, then the body with less read, then the other. (Each
        // newcomer answers at once, so that it is not chosen.)
        let fifth = open(&r, ip(5));
        let mut fifth_answering = fifth.begin();
        assert!(fifth_answering.answering());
        assert!(idle.state.load(Ordering::Relaxed) & SHED != 0);
        assert!(matches!(r.admit(ip(6)), Admit::Open(_)));
        assert!(reading_less.state.load(Ordering::Relaxed) & SHED != 0);
        assert!(reading_more.state.load(Ordering::Relaxed) & SHED == 0);
        // A shed connection's request cannot start being answered.
        assert!(!less.answering());
        // The connection answering is never chosen.
        assert!(answering.state.load(Ordering::Relaxed) & SHED == 0);
        drop((a, more, less, fifth_answering));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_just_accepted_is_closed_after_idle_ones_and_silent_ones_past_their_time()
    {
        let shed = |s: &Slot| s.state.load(Ordering::Relaxed) & SHED != 0;
        let r = Registry::new("test", 3, 3);
        let silent = open(&r, ip(1));
        tokio::time::advance(YOUNG).await;
        let idle = open(&r, ip(2));
        drop(idle.begin());
        // A probe's connection, accepted a moment ago, its request not read yet.
        let probe = open(&r, ip(3));
        assert!(matches!(r.admit(ip(4)), Admit::Open(_)));
        assert!(shed(&silent), "silent past its time: first");
        assert!(matches!(r.admit(ip(5)), Admit::Open(_)));
        assert!(shed(&idle), "idle: next");
        assert!(!shed(&probe), "just accepted: kept while others can go");
    }

    #[tokio::test]
    async fn the_source_holding_the_most_loses_a_connection_first() {
        let r = Registry::new("test", 4, 4);
        // A kubelet's one connection, opened first and silent: the oldest, yet kept.
        let kubelet = open(&r, ip(1));
        let crowd: Vec<_> = (0..3).map(|_| open(&r, ip(9))).collect();
        assert!(matches!(r.admit(ip(2)), Admit::Open(_)));
        assert!(kubelet.state.load(Ordering::Relaxed) & SHED == 0);
        let shed = crowd
            .iter()
            .filter(|s| s.state.load(Ordering::Relaxed) & SHED != 0)
            .count();
        assert_eq!(shed, 1);
    }

    #[tokio::test]
    async fn one_source_makes_room_among_its_own_connections() {
        let r = Registry::new("test", 100, 2);
        let first = open(&r, ip(1));
        let _second = open(&r, ip(1));
        let _other = open(&r, ip(2));
        assert!(matches!(r.admit(ip(1)), Admit::Open(_)));
        assert!(
            first.state.load(Ordering::Relaxed) & SHED != 0,
            "its own oldest"
        );
        let t = r.lock();
        assert_eq!(t.per_source[&ip(1)], 2);
        assert_eq!(t.per_source[&ip(2)], 1);
    }
}
