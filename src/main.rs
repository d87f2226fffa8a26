//! Wiring only: everything testable lives in the library.

/// An admission allocates many small objects and frees them at once; glibc's allocator spends
/// a third of a 10,000-container admission consolidating free chunks (README, Performance).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(message) = podmutator::cli::run(&args) {
        eprintln!("podmutator: {message}");
        std::process::exit(1);
    }
}
