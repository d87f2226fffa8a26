//! Wiring only: everything testable lives in the library.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(message) = podmutator::cli::run(&args) {
        eprintln!("podmutator: {message}");
        std::process::exit(1);
    }
}
