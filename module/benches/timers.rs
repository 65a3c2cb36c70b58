//! The module's side of a timer (`module/src/host/timer.rs`): what one registration costs and
//! what arming, re-arming and disarming its deadline cost, with many other filters' deadlines
//! armed (a socket's idle timer is re-armed on every message). Envoy's side is one 16-byte
//! scheduler per registration and, only when a deadline is reached, one commit (a post to the
//! worker). Run: `cargo bench -p responses-module --bench timers`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use responses_module::host::timer::{Registration, Scheduler, Service};

/// A scheduler that is never due in these runs (deadlines are far ahead).
struct Never;

impl Scheduler for Never {
    fn commit(&self, _event_id: u64) {
        unreachable!("no deadline is reached during the bench");
    }
}

fn timers(c: &mut Criterion) {
    let service = Service::<Never>::new(|| {});
    let far = Instant::now() + Duration::from_secs(3600);
    // 10,000 other sockets, each with a deadline armed.
    let others: Vec<Registration<Never>> = (0..10_000u64)
        .map(|i| {
            let r = service.register(Never);
            r.arm(far + Duration::from_micros(i));
            r
        })
        .collect();

    c.bench_function("timer: register and drop (a socket's life)", |b| {
        b.iter(|| drop(black_box(service.register(Never))))
    });
    let mine = service.register(Never);
    let mut n = 0u64;
    c.bench_function("timer: re-arm a later deadline (each message)", |b| {
        b.iter(|| {
            n += 1;
            mine.arm(black_box(far + Duration::from_nanos(n)));
        })
    });
    c.bench_function("timer: arm and disarm", |b| {
        b.iter(|| {
            mine.arm(black_box(far));
            mine.disarm();
        })
    });
    drop(mine);
    drop(others);
    service.stop();
}

criterion_group!(benches, timers);
criterion_main!(benches);
