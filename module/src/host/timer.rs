//! Timers and the drain signal for HTTP filters, which Envoy's ABI v0.2.0 gives neither.
//!
//! An HTTP filter has a scheduler (`..._http_filter_scheduler_new`): committing it, from any
//! thread, makes Envoy call `on_http_filter_scheduled` on the filter's own worker. This
//! service is one thread for the whole module that keeps every armed deadline and commits the
//! filter's scheduler when one is reached ([`TIMER_EVENT`]); the bootstrap extension
//! (`crate::bootstrap`) tells it when Envoy starts draining, and it commits [`DRAIN_EVENT`]
//! to every filter that asked to hear it. Nothing else crosses threads: the filter learns
//! the time on its own worker, and checks its deadline there.
//!
//! Lifetimes: a filter's [`Registration`] owns its scheduler. Dropping it (the filter is
//! destroyed) removes it and deletes the scheduler under the service's lock, the lock the
//! timer thread and the drain hold while they commit: a scheduler is never committed after
//! it is deleted, and a destroyed filter is never touched. (Envoy's scheduler holds a weak
//! pointer to its filter, so a commit racing the stream's end is harmless to Envoy too; the
//! lock is for the module's side: the scheduler's memory.)
//!
//! Cost: arming or disarming takes the lock and moves one entry of an ordered set (no call
//! into Envoy): about 0.2 µs with 10,000 other deadlines armed; a registration is one
//! scheduler (16 bytes in Envoy) and one slot here, about 0.15 µs to make and drop
//! (`module/benches/timers.rs`); a deadline reached costs one commit (an allocation and a
//! post to the worker's dispatcher, in Envoy).

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The event id of a deadline reached.
pub const TIMER_EVENT: u64 = 1;
/// The event id of Envoy's drain (to filters that watch it).
pub const DRAIN_EVENT: u64 = 2;

/// What the service commits: a filter's scheduler. Dropping it deletes it.
pub trait Scheduler: Send {
    fn commit(&self, event_id: u64);
}

/// Which registration (an index in the slab, and its generation: a reused index never
/// matches an older key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    index: usize,
    generation: u64,
}

struct Entry<S> {
    scheduler: S,
    generation: u64,
    deadline: Option<Instant>,
    drain: bool,
}

struct State<S> {
    entries: Vec<Option<Entry<S>>>,
    free: Vec<usize>,
    /// Every armed deadline, earliest first.
    deadlines: BTreeSet<(Instant, Key)>,
    next_generation: u64,
    draining: bool,
    thread: bool,
    stopped: bool,
    /// Deadlines committed and drains told, for the tests and the logs.
    fired: u64,
    /// Envoy is shutting down: called once no filter watches the drain any more, or at its
    /// deadline.
    quiet: Option<(Instant, Quiet)>,
    /// Registrations that watch the drain.
    watching: usize,
}

/// What a shutdown waits to call.
type Quiet = Box<dyn FnOnce() + Send>;

impl<S> State<S> {
    /// The shutdown's callback, if it is due: no watcher left, or its deadline reached.
    fn quiet_due(&mut self, now: Instant) -> Option<Quiet> {
        let due = match &self.quiet {
            Some((deadline, _)) => *deadline <= now || self.watching == 0,
            None => false,
        };
        if due {
            self.quiet.take().map(|(_, quiet)| quiet)
        } else {
            None
        }
    }
}

/// The timer thread and the registry of filters (one per module: [`Service::global`]).
pub struct Service<S> {
    state: Mutex<State<S>>,
    wake: Condvar,
    /// Runs before the thread starts (the real service pins the module in memory, so that
    /// Envoy never unloads the code the thread runs).
    on_start: fn(),
}

impl<S: Scheduler + 'static> Service<S> {
    pub fn new(on_start: fn()) -> Arc<Service<S>> {
        Arc::new(Service {
            state: Mutex::new(State {
                entries: Vec::new(),
                free: Vec::new(),
                deadlines: BTreeSet::new(),
                next_generation: 0,
                draining: false,
                thread: false,
                stopped: false,
                fired: 0,
                quiet: None,
                watching: 0,
            }),
            wake: Condvar::new(),
            on_start,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<S>> {
        // A panic while the lock was held left consistent data (each step is one assignment
        // or one set operation): carry on with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a filter's scheduler; the registration owns it.
    pub fn register(self: &Arc<Self>, scheduler: S) -> Registration<S> {
        let mut state = self.lock();
        state.next_generation += 1;
        let generation = state.next_generation;
        let entry = Entry {
            scheduler,
            generation,
            deadline: None,
            drain: false,
        };
        let index = match state.free.pop() {
            Some(i) => {
                state.entries[i] = Some(entry);
                i
            }
            None => {
                state.entries.push(Some(entry));
                state.entries.len() - 1
            }
        };
        Registration {
            service: Arc::clone(self),
            key: Key { index, generation },
        }
    }

    /// Envoy started draining: every filter that watches the drain is told, now (once: a
    /// second drain, e.g. the shutdown after `/drain_listeners`, tells no one again) and when
    /// it starts watching. Returns how many were told.
    pub fn drain(&self) -> usize {
        let mut state = self.lock();
        if std::mem::replace(&mut state.draining, true) {
            return 0;
        }
        let mut told = 0;
        for entry in state.entries.iter().flatten().filter(|e| e.drain) {
            entry.scheduler.commit(DRAIN_EVENT);
            told += 1;
        }
        state.fired += told as u64;
        told
    }

    /// Envoy is shutting down (SIGTERM; it waits for `quiet` to exit): the drain is told as by
    /// [`Service::drain`], then `quiet` is called once every filter that watched it is gone
    /// (its stream ended), or at `deadline`, whichever comes first: at once if none watches.
    /// It runs on whichever thread sees that (a worker, the timer thread, or this one).
    /// Returns how many were told (none if the drain had begun: they were told then).
    pub fn shutdown(self: &Arc<Self>, deadline: Instant, quiet: Quiet) -> usize {
        let told = self.drain();
        let due = {
            let mut state = self.lock();
            state.quiet = Some((deadline, quiet));
            let due = state.quiet_due(Instant::now());
            if due.is_none() {
                self.start_thread(&mut state);
                self.wake.notify_one();
            }
            due
        };
        if let Some(quiet) = due {
            quiet();
        }
        told
    }

    pub fn draining(&self) -> bool {
        self.lock().draining
    }

    /// Filters registered (for the tests and the probe).
    pub fn registered(&self) -> usize {
        self.lock().entries.iter().flatten().count()
    }

    /// Deadlines armed.
    pub fn armed(&self) -> usize {
        self.lock().deadlines.len()
    }

    /// Events committed so far (deadlines and drains).
    pub fn fired(&self) -> u64 {
        self.lock().fired
    }

    /// Ends the thread (tests; the module's service lives as long as the process).
    pub fn stop(&self) {
        self.lock().stopped = true;
        self.wake.notify_all();
    }

    fn start_thread(self: &Arc<Self>, state: &mut State<S>) {
        if state.thread {
            return;
        }
        (self.on_start)();
        let service = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("responses-timers".into())
            .spawn(move || service.run());
        // Without a thread no deadline fires: a filter's own bound (Envoy's idle timeouts)
        // still ends its stream. Tried again on the next arm.
        state.thread = spawned.is_ok();
    }

    /// The thread: commits each deadline reached, sleeps until the next (or an earlier one
    /// is armed).
    fn run(&self) {
        let mut state = self.lock();
        loop {
            if state.stopped {
                state.thread = false;
                return;
            }
            let now = Instant::now();
            while let Some(&(at, key)) = state.deadlines.first() {
                if at > now {
                    break;
                }
                state.deadlines.pop_first();
                let fired = match state.entries.get_mut(key.index) {
                    Some(Some(entry)) if entry.generation == key.generation => {
                        entry.deadline = None;
                        entry.scheduler.commit(TIMER_EVENT);
                        true
                    }
                    _ => false,
                };
                state.fired += u64::from(fired);
            }
            if let Some(quiet) = state.quiet_due(now) {
                drop(state);
                quiet();
                state = self.lock();
                continue;
            }
            let next = state.deadlines.first().map(|&(at, _)| at);
            let next = match (next, state.quiet.as_ref().map(|(at, _)| *at)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let wait = next.map(|at| at.saturating_duration_since(now));
            state = match wait {
                Some(wait) => {
                    self.wake
                        .wait_timeout(state, wait.max(Duration::from_micros(100)))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.wake.wait(state).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

/// One filter's place in the service: its scheduler, deadline and drain watch. Dropped with
/// the filter, which deletes the scheduler (under the lock the committing side holds).
pub struct Registration<S: Scheduler + 'static> {
    service: Arc<Service<S>>,
    key: Key,
}

impl<S: Scheduler + 'static> Registration<S> {
    /// The scheduler commits [`TIMER_EVENT`] at `at` (at once if it has passed), replacing
    /// any deadline armed before.
    pub fn arm(&self, at: Instant) {
        let service = &self.service;
        let mut state = service.lock();
        let Some(Some(entry)) = state.entries.get_mut(self.key.index) else {
            return;
        };
        let before = entry.deadline.replace(at);
        if let Some(before) = before {
            state.deadlines.remove(&(before, self.key));
        }
        let earliest = state.deadlines.first().map(|&(t, _)| t);
        state.deadlines.insert((at, self.key));
        service.start_thread(&mut state);
        if earliest.is_none_or(|t| at < t) {
            service.wake.notify_one();
        }
    }

    /// No deadline (a commit already made may still arrive: the filter checks its own).
    pub fn disarm(&self) {
        let mut state = self.service.lock();
        let Some(Some(entry)) = state.entries.get_mut(self.key.index) else {
            return;
        };
        if let Some(before) = entry.deadline.take() {
            state.deadlines.remove(&(before, self.key));
        }
    }

    /// The deadline armed and not yet reached.
    pub fn deadline(&self) -> Option<Instant> {
        let state = self.service.lock();
        state.entries.get(self.key.index)?.as_ref()?.deadline
    }

    /// A handle that commits an event of this registration's scheduler from any thread, for
    /// as long as the registration lives (a work thread's result: `super::work`).
    pub fn waker(&self) -> Waker<S> {
        Waker {
            service: Arc::clone(&self.service),
            key: self.key,
        }
    }

    /// From now on the scheduler commits [`DRAIN_EVENT`] when Envoy starts draining. True if
    /// it already has (no event then: the caller knows).
    pub fn watch_drain(&self) -> bool {
        let mut state = self.service.lock();
        let draining = state.draining;
        if let Some(Some(entry)) = state.entries.get_mut(self.key.index) {
            if !std::mem::replace(&mut entry.drain, true) {
                state.watching += 1;
            }
        }
        draining
    }
}

/// Commits events of one registration's scheduler (see [`Registration::waker`]).
pub struct Waker<S: Scheduler + 'static> {
    service: Arc<Service<S>>,
    key: Key,
}

impl<S: Scheduler + 'static> Waker<S> {
    /// Commits `event_id` if the registration still lives (its filter is there); under the
    /// lock its drop deletes the scheduler under. Returns whether it did.
    pub fn wake(&self, event_id: u64) -> bool {
        let mut state = self.service.lock();
        match state.entries.get(self.key.index) {
            Some(Some(entry)) if entry.generation == self.key.generation => {
                entry.scheduler.commit(event_id);
                state.fired += 1;
                true
            }
            _ => false,
        }
    }
}

impl<S: Scheduler + 'static> Drop for Registration<S> {
    fn drop(&mut self) {
        let mut state = self.service.lock();
        let Some(slot) = state.entries.get_mut(self.key.index) else {
            return;
        };
        if slot.as_ref().map(|e| e.generation) != Some(self.key.generation) {
            return;
        }
        let entry = slot.take();
        if let Some(at) = entry.as_ref().and_then(|e| e.deadline) {
            state.deadlines.remove(&(at, self.key));
        }
        if entry.as_ref().is_some_and(|e| e.drain) {
            state.watching -= 1;
        }
        state.free.push(self.key.index);
        // The scheduler is deleted here, under the lock.
        drop(entry);
        // The last stream a shutdown waited for is gone.
        let quiet = state.quiet_due(Instant::now());
        drop(state);
        if let Some(quiet) = quiet {
            quiet();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;

    /// A scheduler that sends its commits down a channel and panics if committed after it was
    /// deleted.
    struct Probe {
        id: u32,
        sent: mpsc::Sender<Commit>,
        deleted: Arc<AtomicBool>,
    }

    impl Scheduler for Probe {
        fn commit(&self, event_id: u64) {
            assert!(
                !self.deleted.load(Ordering::SeqCst),
                "committed after delete"
            );
            let _ = self.sent.send((self.id, event_id, Instant::now()));
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.deleted.store(true, Ordering::SeqCst);
        }
    }

    /// A commit: which scheduler, which event, when.
    type Commit = (u32, u64, Instant);

    /// Makes schedulers that report to one channel.
    #[derive(Clone)]
    struct Maker(mpsc::Sender<Commit>);

    impl Maker {
        fn make(&self, id: u32) -> (Probe, Arc<AtomicBool>) {
            let deleted = Arc::new(AtomicBool::new(false));
            let probe = Probe {
                id,
                sent: self.0.clone(),
                deleted: Arc::clone(&deleted),
            };
            (probe, deleted)
        }
    }

    fn service() -> (Arc<Service<Probe>>, mpsc::Receiver<Commit>, Maker) {
        let (tx, rx) = mpsc::channel();
        (Service::new(|| {}), rx, Maker(tx))
    }

    const LONG: Duration = Duration::from_secs(5);

    #[test]
    fn a_deadline_commits_the_timer_event_once_it_is_reached() {
        let (service, rx, make) = service();
        let (a, _) = make.make(1);
        let reg = service.register(a);
        let at = Instant::now() + Duration::from_millis(30);
        reg.arm(at);
        assert_eq!(reg.deadline(), Some(at));
        let (id, event, when) = rx.recv_timeout(LONG).expect("fired");
        assert_eq!((id, event), (1, TIMER_EVENT));
        assert!(when >= at, "never early");
        assert_eq!(reg.deadline(), None);
        assert!(rx.recv_timeout(Duration::from_millis(60)).is_err(), "once");
        service.stop();
    }

    #[test]
    fn deadlines_fire_in_order_rearming_replaces_and_disarming_cancels() {
        let (service, rx, make) = service();
        let now = Instant::now();
        let regs: Vec<_> = (0..4).map(|i| service.register(make.make(i).0)).collect();
        regs[0].arm(now + Duration::from_millis(80));
        regs[1].arm(now + Duration::from_millis(20));
        regs[2].arm(now + Duration::from_millis(10));
        regs[2].arm(now + Duration::from_millis(50)); // later: replaces
        regs[3].arm(now + Duration::from_millis(30));
        regs[3].disarm();
        assert_eq!(service.armed(), 3);
        let order: Vec<u32> = (0..3).map(|_| rx.recv_timeout(LONG).unwrap().0).collect();
        assert_eq!(order, [1, 2, 0]);
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        // A deadline already passed fires at once.
        regs[3].arm(now);
        assert_eq!(rx.recv_timeout(LONG).unwrap().0, 3);
        service.stop();
    }

    #[test]
    fn a_waker_commits_while_its_filter_lives_and_never_after() {
        let (service, rx, make) = service();
        let (a, a_deleted) = make.make(1);
        let a = service.register(a);
        let waker = a.waker();
        assert!(waker.wake(7));
        assert_eq!(rx.recv_timeout(LONG).map(|(id, e, _)| (id, e)), Ok((1, 7)));
        drop(a);
        assert!(a_deleted.load(Ordering::SeqCst));
        // A new registration takes the same slot; the old key wakes neither it nor the
        // deleted scheduler (whose probe would panic), from another thread as a work
        // thread's would.
        let (b, _) = make.make(2);
        let b = service.register(b);
        assert_eq!(b.key.index, 0);
        let late = std::thread::scope(|s| s.spawn(|| waker.wake(7)).join().unwrap());
        assert!(!late);
        assert!(rx.recv_timeout(Duration::from_millis(30)).is_err());
        drop(b);
        service.stop();
    }

    #[test]
    fn a_filter_destroyed_before_its_deadline_is_never_touched() {
        let (service, rx, make) = service();
        let (a, a_deleted) = make.make(1);
        let (b, _) = make.make(2);
        let a = service.register(a);
        let b = service.register(b);
        let soon = Instant::now() + Duration::from_millis(20);
        a.arm(soon);
        b.arm(soon + Duration::from_millis(20));
        drop(a);
        assert!(
            a_deleted.load(Ordering::SeqCst),
            "the scheduler is deleted with it"
        );
        assert_eq!(service.registered(), 1);
        assert_eq!(service.armed(), 1);
        // Only b fires; a's scheduler would panic (in the thread) if committed.
        assert_eq!(rx.recv_timeout(LONG).unwrap().0, 2);
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        // Its slot is reused under a new generation: the old key means nothing.
        let (c, _) = make.make(3);
        let c = service.register(c);
        assert_eq!(c.key.index, 0);
        c.arm(Instant::now());
        assert_eq!(rx.recv_timeout(LONG).unwrap().0, 3);
        drop(b);
        service.stop();
    }

    #[test]
    fn racing_drops_and_deadlines_never_commit_a_deleted_scheduler() {
        // Many filters arm deadlines around now and are dropped around the same time, from
        // several threads, while the timer thread fires: the scheduler panics if committed
        // after its deletion, which would poison nothing but end the thread (checked below).
        let (service, rx, make) = service();
        let make = Arc::new(make);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let service = Arc::clone(&service);
                let make = Arc::clone(&make);
                std::thread::spawn(move || {
                    for i in 0..500u32 {
                        let reg = service.register(make.make(t * 1000 + i).0);
                        reg.arm(Instant::now() + Duration::from_micros(u64::from(i % 7) * 50));
                        if i % 3 == 0 {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                        drop(reg);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(service.registered(), 0);
        assert_eq!(service.armed(), 0);
        // The timer thread survived: a new deadline still fires.
        let reg = service.register(make.make(9).0);
        while rx.try_recv().is_ok() {}
        reg.arm(Instant::now());
        assert_eq!(rx.recv_timeout(LONG).unwrap().0, 9);
        service.stop();
    }

    #[test]
    fn a_shutdown_waits_for_the_streams_watching_the_drain_or_its_deadline() {
        let (service, rx, make) = service();
        let (quiet_tx, quiet_rx) = mpsc::channel();
        let quiet = move || -> Quiet {
            let tx = quiet_tx.clone();
            Box::new(move || tx.send(Instant::now()).unwrap())
        };
        // Two watch (one more does not): told, then quiet when both are gone.
        let a = service.register(make.make(1).0);
        let b = service.register(make.make(2).0);
        let c = service.register(make.make(3).0);
        a.watch_drain();
        b.watch_drain();
        service.shutdown(Instant::now() + LONG, quiet());
        let told: Vec<u32> = (0..2).map(|_| rx.recv_timeout(LONG).unwrap().0).collect();
        assert_eq!(told, [1, 2]);
        drop(a);
        assert!(quiet_rx.recv_timeout(Duration::from_millis(50)).is_err());
        drop(b);
        assert!(quiet_rx.try_recv().is_ok(), "called by the last drop");
        // One that never goes: its deadline.
        let d = service.register(make.make(4).0);
        d.watch_drain();
        let deadline = Instant::now() + Duration::from_millis(40);
        service.shutdown(deadline, quiet());
        let when = quiet_rx.recv_timeout(LONG).expect("at its deadline");
        assert!(when >= deadline);
        drop((c, d));
        // Nobody watches: at once.
        service.shutdown(Instant::now() + LONG, quiet());
        assert!(quiet_rx.try_recv().is_ok());
        service.stop();
    }

    #[test]
    fn the_drain_reaches_the_filters_that_watch_it_and_later_watchers_learn_at_once() {
        let (service, rx, make) = service();
        let a = service.register(make.make(1).0);
        let b = service.register(make.make(2).0);
        assert!(!a.watch_drain());
        assert_eq!(service.drain(), 1);
        let (id, event, _) = rx.recv_timeout(LONG).unwrap();
        assert_eq!((id, event), (1, DRAIN_EVENT));
        assert!(rx.try_recv().is_err(), "b did not watch");
        assert!(
            b.watch_drain(),
            "already draining: b knows without an event"
        );
        assert_eq!(service.drain(), 0, "told once");
        assert!(rx.try_recv().is_err());
        drop((a, b));
        service.stop();
    }
}
