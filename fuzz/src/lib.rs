//! Shared code of the fuzz targets: the oracles ([`harness`], also compiled into
//! `tests/fuzz_regressions.rs`) and slow-unit capture.

pub mod harness;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// An input slower than this is a finding (the budget of one admission in release).
pub const SLOW: Duration = Duration::from_millis(100);

/// Most slow units saved per process, so a slow region does not fill the disk.
const MAX_SLOW_SAVED: usize = 20;

/// Runs `check` on `data`; when it takes longer than [`SLOW`] twice in a row (the first run may
/// pay for lazy set-up or a noisy neighbour), saves the input as
/// `$PODMUTATOR_FUZZ_SLOW_DIR/<target>/slow-<hash>` and reports it on stderr.
pub fn timed(target: &str, data: &[u8], check: impl Fn(&[u8])) {
    let started = Instant::now();
    check(data);
    if started.elapsed() <= SLOW {
        return;
    }
    let again = Instant::now();
    check(data);
    let elapsed = again.elapsed();
    if elapsed <= SLOW {
        return;
    }
    static SAVED: AtomicUsize = AtomicUsize::new(0);
    let Some(dir) = std::env::var_os("PODMUTATOR_FUZZ_SLOW_DIR") else {
        return;
    };
    if SAVED.fetch_add(1, Ordering::Relaxed) >= MAX_SLOW_SAVED {
        return;
    }
    let mut h = DefaultHasher::new();
    data.hash(&mut h);
    let dir = PathBuf::from(dir).join(target);
    let path = dir.join(format!("slow-{:016x}", h.finish()));
    if std::fs::create_dir_all(&dir).is_ok() && std::fs::write(&path, data).is_ok() {
        eprintln!(
            "SLOW UNIT: {} ms, {} bytes, saved to {}",
            elapsed.as_millis(),
            data.len(),
            path.display()
        );
    }
}
