//! The module's work threads: a request body costly to read (compressed, or of
//! `COSTLY_BODY_BYTES` or more: the core's `Exchange::is_costly`) is decoded, parsed and
//! translated here, off Envoy's workers, so that the other streams of a worker are served
//! meanwhile. A hostile compressed body may take up to the decoding budget's time
//! (docs/limits-and-failures.md); on a worker, every stream of that worker would wait for it.
//!
//! A job's result goes back to its filter's worker through the filter's scheduler
//! ([`WORK_EVENT`], committed under the timer service's lock: never after the filter is gone,
//! see [`super::timer`]).
//!
//! Bounds: [`threads`] threads (started on the first job), and at most [`max_queued`] jobs
//! waiting (both may be set in Envoy's environment); beyond that a body is refused with a 503
//! the client may retry, rather than read on the worker. A waiting job holds only its body, which its stream held already.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

/// The event id of a job's result ready for its filter.
pub const WORK_EVENT: u64 = 3;

/// Jobs waiting for a thread, at most, by default: a burst of costly bodies waits here (each
/// is bounded in time), a flood is refused.
pub const MAX_QUEUED: usize = 1024;

/// The most work threads by default, whatever the machine.
pub const MAX_THREADS: usize = 8;

/// Envoy's environment variable that sets the number of work threads (1 or more).
pub const THREADS_VAR: &str = "RESPONSES_MODULE_WORK_THREADS";
/// ... and the most jobs waiting (0: every costly body is refused, for tests).
pub const QUEUE_VAR: &str = "RESPONSES_MODULE_WORK_QUEUE";

/// How many work threads: [`THREADS_VAR`], else as many as the machine's cores, at most
/// [`MAX_THREADS`]; they compete with Envoy's workers for the cores only while costly bodies
/// are read.
pub fn threads() -> usize {
    from_env(THREADS_VAR).map_or_else(
        || {
            std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .clamp(1, MAX_THREADS)
        },
        |n| n.max(1),
    )
}

/// The most jobs waiting: [`QUEUE_VAR`], else [`MAX_QUEUED`].
pub fn max_queued() -> usize {
    from_env(QUEUE_VAR).unwrap_or(MAX_QUEUED)
}

fn from_env(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// One job: the body's reading and the delivery of its result.
pub type Job = Box<dyn FnOnce() + Send>;

/// The pool was full (or could start no thread): the job was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

/// A pool of threads and its queue (one per module: [`pool`]).
pub struct Pool {
    state: Mutex<State>,
    ready: Condvar,
    threads: usize,
    max_queued: usize,
    /// Runs before the first thread starts (the real pool pins the module in memory, as the
    /// timer service does).
    on_start: fn(),
}

struct State {
    queue: VecDeque<Job>,
    started: usize,
    /// Threads waiting for a job.
    idle: usize,
    stopped: bool,
}

impl Pool {
    pub fn new(threads: usize, max_queued: usize, on_start: fn()) -> Pool {
        Pool {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                started: 0,
                idle: 0,
                stopped: false,
            }),
            ready: Condvar::new(),
            threads: threads.max(1),
            max_queued,
            on_start,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Each step under the lock is one push, pop or count: consistent after a panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `job` on one of the pool's threads, or refuses it.
    pub fn submit(&'static self, job: Job) -> Result<(), Busy> {
        let mut state = self.lock();
        if state.stopped || state.queue.len() >= self.max_queued {
            return Err(Busy);
        }
        if state.idle == 0 && state.started < self.threads {
            if state.started == 0 {
                (self.on_start)();
            }
            let spawned = std::thread::Builder::new()
                .name("responses-work".into())
                .spawn(move || self.run());
            match spawned {
                Ok(_) => state.started += 1,
                // No thread at all: nothing would ever run the job.
                Err(_) if state.started == 0 => return Err(Busy),
                Err(_) => {}
            }
        }
        state.queue.push_back(job);
        drop(state);
        self.ready.notify_one();
        Ok(())
    }

    /// Jobs waiting for a thread.
    pub fn queued(&self) -> usize {
        self.lock().queue.len()
    }

    /// Threads started.
    pub fn started(&self) -> usize {
        self.lock().started
    }

    /// Ends the threads once the queue is empty (tests; the module's pool lives as long as
    /// the process).
    pub fn stop(&self) {
        self.lock().stopped = true;
        self.ready.notify_all();
    }

    fn run(&self) {
        let mut state = self.lock();
        loop {
            if let Some(job) = state.queue.pop_front() {
                drop(state);
                // A job catches its own panics (its filter is told); one that escapes must not
                // end the thread.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                state = self.lock();
                continue;
            }
            if state.stopped {
                state.started -= 1;
                return;
            }
            state.idle += 1;
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
            state.idle -= 1;
        }
    }
}

/// The module's pool.
pub fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool::new(threads(), max_queued(), super::pin_module))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn leaked(threads: usize, max_queued: usize) -> &'static Pool {
        Box::leak(Box::new(Pool::new(threads, max_queued, || {})))
    }

    #[test]
    fn runs_jobs_on_its_threads_up_to_its_count() {
        let pool = leaked(2, 16);
        let (tx, rx) = mpsc::channel();
        for i in 0..6 {
            let tx = tx.clone();
            pool.submit(Box::new(move || {
                tx.send((i, std::thread::current().name().map(str::to_owned)))
                    .unwrap();
            }))
            .unwrap();
        }
        let mut got: Vec<_> = (0..6)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        got.sort();
        assert_eq!(
            got.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 5]
        );
        assert!(got
            .iter()
            .all(|(_, name)| name.as_deref() == Some("responses-work")));
        assert!(pool.started() <= 2, "{} threads", pool.started());
        pool.stop();
    }

    #[test]
    fn refuses_a_job_when_its_queue_is_full_and_survives_a_panic() {
        let pool = leaked(1, 2);
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        // The one thread is held by the first job; two more wait; the fourth is refused.
        pool.submit(Box::new(move || {
            gate_rx.recv().unwrap();
            panic!("a job that panics");
        }))
        .unwrap();
        while pool.queued() > 0 {
            std::thread::yield_now();
        }
        for i in 0..2 {
            let done = done_tx.clone();
            pool.submit(Box::new(move || done.send(i).unwrap()))
                .unwrap();
        }
        assert_eq!(pool.submit(Box::new(|| {})), Err(Busy));
        gate_tx.send(()).unwrap();
        let got: Vec<i32> = (0..2)
            .map(|_| done_rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got, [0, 1], "the thread outlived the panic, in order");
        pool.stop();
    }
}
