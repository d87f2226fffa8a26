//! Wiring only: everything testable lives in the library.

/// An admission allocates many small objects and frees them at once; glibc's allocator spends
/// a third of a 10,000-container admission consolidating free chunks (docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // `--help`, `--version` and usage errors are answered (and exit) here.
    let cli = podmutator::cli::Cli::from_env();
    if let Err(err) = podmutator::cli::run(cli) {
        eprintln!("podmutator: {}", err.chain());
        std::process::exit(1);
    }
}
