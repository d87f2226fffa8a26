//! The process's log: JSON lines on stdout behind a `RUST_LOG`-style filter whose caps keep
//! raw requests and events (path tokens among them) out of it, and the start line.

use std::fmt::Write as _;
use std::io::Write as _;

use tracing::Level;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

/// JSON log lines on stdout; the filter comes from `RUST_LOG`, else `AWS_LAMBDA_LOG_LEVEL`. A
/// filter that is not valid (a misspelt level, an empty value) is named in one line on stderr
/// and `info` is used: a typo must not silence the log.
pub fn init_logging() {
    use tracing_subscriber::util::SubscriberInitExt;
    let (var, spec) = ["RUST_LOG", "AWS_LAMBDA_LOG_LEVEL"]
        .into_iter()
        .find_map(|var| Some((var, std::env::var(var).ok()?)))
        .unwrap_or(("", "info".to_owned()));
    let filter = log_filter(&spec).unwrap_or_else(|e| {
        eprintln!("podmutator: {var}={spec:?} is not a valid log filter: {e}; logging at info");
        log_filter("info").expect("a level is a filter")
    });
    if let Some(hidden) = hides_the_start_line(&filter) {
        eprintln!("podmutator: {var}={spec:?} {hidden}");
    }
    let _ = json_subscriber(std::io::stdout, filter).try_init();
}

/// `serve`'s and `lambda`'s start line: an INFO line like every other (`timestamp`, `level`,
/// `message`, then `fields`), written here rather than through `tracing`, whose field values
/// are text, so that `mutators` is a JSON array. The log filter decides as for any INFO line
/// of this module.
pub fn start_line(message: &str, fields: serde_json::Value) {
    if !tracing::enabled!(Level::INFO) {
        return;
    }
    let mut timestamp = String::new();
    let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
    let mut line = serde_json::json!({"timestamp": timestamp, "level": "INFO", "message": message});
    if let (Some(line), serde_json::Value::Object(fields)) = (line.as_object_mut(), fields) {
        line.extend(fields);
    }
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// The target of `serve`'s and `lambda`'s start lines (and every line of this module).
const START_LINE_TARGET: &str = module_path!();

/// What a valid filter that hides the start line hides, for the note `init_logging` prints on
/// stderr (the filter is still used: an operator may want warnings only).
fn hides_the_start_line(filter: &Targets) -> Option<&'static str> {
    if filter.would_enable(START_LINE_TARGET, &Level::INFO) {
        return None;
    }
    Some(if filter.would_enable(START_LINE_TARGET, &Level::WARN) {
        "hides podmutator's INFO lines: the start line and each admission's audit line; warnings and errors are still logged"
    } else {
        "hides every line of podmutator's own, the start line and its errors among them: add podmutator=info to see them"
    })
}

/// The log subscriber: one flat JSON object per event, written to `writer`, behind `filter`.
/// The admission bench builds its logged case with this too.
pub fn json_subscriber<W>(writer: W, filter: Targets) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    JsonLines { writer, filter }
}

/// The lines tracing-subscriber's JSON format writes with `flatten_event(true)` and neither
/// spans nor target: `timestamp`, `level`, then the event's fields in the order they are
/// recorded (`message` first), each value as tracing-serde gives it; one `write_all` a line.
/// Written here because the formatter serialises each field through a UTF-8-checking adaptor
/// and formats every span's fields whether it prints them or not: 33,000 instructions of an
/// unselected pod's 219,000 through the Lambda loop (docs/performance.md). Spans are off: no
/// line shows them. `logging::tests` holds the lines to the formatter's, byte for byte.
struct JsonLines<W> {
    writer: W,
    filter: Targets,
}

impl<W> tracing::Subscriber for JsonLines<W>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + 'static,
{
    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        !meta.is_span() && self.filter.would_enable(meta.target(), meta.level())
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        tracing_subscriber::Layer::<Self>::max_level_hint(&self.filter)
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        // Never called: no span is enabled.
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        let mut line = String::with_capacity(256);
        line.push_str("{\"timestamp\":\"");
        let _ = SystemTime.format_time(&mut Writer::new(&mut line));
        line.push_str("\",\"level\":\"");
        line.push_str(meta.level().as_str());
        line.push('"');
        event.record(&mut Fields(&mut line));
        line.push_str("}\n");
        let _ = self.writer.make_writer_for(meta).write_all(line.as_bytes());
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// An event's fields as `,"name":value` members, as tracing-serde writes them: text and
/// `Debug` values as strings, integers that fit 64 bits and floats as numbers (a float that is
/// not finite as `null`), booleans as booleans. Errors, and integers of 128 bits, come through
/// `record_debug` as in tracing-serde.
struct Fields<'a>(&'a mut String);

impl Fields<'_> {
    fn key(&mut self, field: &tracing::field::Field) {
        self.0.push(',');
        podmutator_core::json::push_str(self.0, field.name());
        self.0.push(':');
    }
}

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.key(field);
        podmutator_core::json::push_str(self.0, value);
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.key(field);
        podmutator_core::json::push_str(self.0, &format!("{value:?}"));
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.key(field);
        let _ = write!(self.0, "{value}");
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.key(field);
        let _ = write!(self.0, "{value}");
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.key(field);
        self.0.push_str(if value { "true" } else { "false" });
    }

    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.key(field);
        let _ = write!(self.0, "{}", serde_json::Value::from(value));
    }
}

/// The log filter: a level (`debug`), or `target=level` directives separated by commas
/// (`info,podmutator_core::secrets=trace`), as `RUST_LOG` takes them without span or field filters.
/// Lambda's own levels are accepted as they come (`DEBUG`), and its `FATAL` means `error`.
/// A `Targets` filter rather than `EnvFilter`: the latter's regex engine is a quarter of a
/// megabyte of the Lambda zip, for directives a webhook's logs never need.
///
/// Stricter than `RUST_LOG` elsewhere: a directive without `=` must be a level, because a bare
/// word is a target at TRACE there, so a misspelt level (`inof`) would turn every other line
/// off. Whatever the filter says, [`LOG_CAPS`] hold.
pub fn log_filter(spec: &str) -> Result<Targets, String> {
    let spec = match spec.trim() {
        s if s.eq_ignore_ascii_case("fatal") => "error",
        s => s,
    };
    let directives: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Err("it is empty: give a level (error, warn, info, debug, trace, off) or target=level directives".into());
    }
    for d in &directives {
        if d.contains(['[', '{']) {
            return Err(format!(
                "{d:?}: span and field filters ([span], {{field}}) are not supported: give target=level directives, e.g. podmutator=debug"
            ));
        }
        if !d.contains('=') && d.parse::<LevelFilter>().is_err() {
            return Err(format!(
                "{d:?} is not a level (error, warn, info, debug, trace, off); a target needs one: {d}=debug"
            ));
        }
        d.parse::<Targets>().map_err(|e| format!("{d:?}: {e}"))?;
    }
    let asked: Targets = directives.join(",").parse().map_err(|e| format!("{e}"))?;
    Ok(capped(&asked))
}

/// Targets (by prefix, as the filter matches them) whose verbose lines carry whole requests
/// or events, and the most each may log whatever the filter asks:
/// - `lambda_`: `lambda_runtime` logs every raw event at TRACE, so the request path, path
///   token included; `hyper`: the request heads of `serve`. INFO.
/// - `h2`: the frames of `serve`, and at WARN a line for each client connection that breaks
///   the protocol (`remotely-reset pending-accept streams reached limit`), unsampled: as many
///   lines as a client opens such connections. ERROR.
/// - `aws_`: the SDK logs each request, response and signing input at TRACE (the bodies too
///   with `LOG_SENSITIVE_BODIES`, a path token read from Secrets Manager among them). DEBUG,
///   which keeps its retry and credential decisions.
pub const LOG_CAPS: [(&str, LevelFilter); 4] = [
    ("lambda_", LevelFilter::INFO),
    ("hyper", LevelFilter::INFO),
    ("h2", LevelFilter::ERROR),
    ("aws_", LevelFilter::DEBUG),
];

/// `asked` with [`LOG_CAPS`] applied: each directive under a capped prefix lowered to the cap,
/// and a directive for each prefix at what `asked` gives it, capped. A target under a prefix
/// then matches a capped directive whichever is most specific.
fn capped(asked: &Targets) -> Targets {
    let cap_of = |target: &str| {
        LOG_CAPS
            .iter()
            .filter(|(prefix, _)| target.starts_with(prefix))
            .map(|(_, cap)| *cap)
            .min()
    };
    let mut out: Targets = asked
        .iter()
        .map(|(target, level)| (target, cap_of(target).map_or(level, |cap| level.min(cap))))
        .collect();
    if let Some(level) = asked.default_level() {
        out = out.with_default(level);
    }
    for (prefix, cap) in LOG_CAPS {
        if asked.iter().any(|(target, _)| target == prefix) {
            continue;
        }
        let level = [
            Level::TRACE,
            Level::DEBUG,
            Level::INFO,
            Level::WARN,
            Level::ERROR,
        ]
        .into_iter()
        .find(|l| asked.would_enable(prefix, l))
        .map_or(LevelFilter::OFF, LevelFilter::from_level);
        out = out.with_target(prefix, level.min(cap));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `MakeWriter` into one shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buffer {
        /// The lines written, each timestamp replaced by `T` (they differ by the clock).
        fn lines(&self) -> Vec<String> {
            let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
            text.lines()
                .map(|l| {
                    let rest = l
                        .strip_prefix("{\"timestamp\":\"")
                        .expect("a timestamp first");
                    let end = rest.find('"').unwrap();
                    assert_eq!(end, 27, "RFC 3339, microseconds, UTC: {l}");
                    format!("{{\"timestamp\":\"T{}", &rest[end..])
                })
                .collect()
        }
    }

    /// Every kind of field value, names that need escaping, a span around them, and lines the
    /// filter drops.
    fn log_a_bit() {
        let err = std::io::Error::other("disk \"full\"\n");
        let span = tracing::info_span!("invoke", requestId = "abc");
        let _in = span.enter();
        tracing::info!(
            uid = "a\"b\\c\n\u{1}\u{7f}é\u{2028}😀",
            n = 7u64,
            neg = -3i64,
            yes = true,
            no = false,
            f = 1.5f64,
            whole = 2.0f64,
            nan = f64::NAN,
            inf = f64::INFINITY,
            big = 1u128 << 100,
            small = -(1i128 << 90),
            dbg = ?vec!["x", "y"],
            disp = %"shown as is",
            err = &err as &(dyn std::error::Error + 'static),
            "message with {} and \"quotes\"",
            42
        );
        tracing::warn!("plain");
        tracing::error!(r#type = "a raw identifier", "\u{0}\u{8}\u{c}");
        tracing::info!(target: "lambda_runtime", "capped at info");
        tracing::debug!(hidden = 1, "below the filter");
        tracing::trace!(target: "lambda_runtime", "below the cap");
        tracing::info!(name: "named", target: "podmutator::x", { field.with.dots = 1 }, "dots");
        assert!(
            tracing::enabled!(tracing::Level::INFO),
            "`enabled!` asks as an event does"
        );
        assert!(!tracing::enabled!(tracing::Level::DEBUG));
    }

    /// The lines are tracing-subscriber's JSON format's, byte for byte but for the clock.
    #[test]
    fn the_json_lines_are_tracing_subscribers_json_format() {
        use tracing_subscriber::layer::SubscriberExt;
        let filter = || log_filter("info,lambda_runtime=trace").unwrap();
        let (ours, theirs) = (Buffer::default(), Buffer::default());
        let w = ours.clone();
        tracing::subscriber::with_default(json_subscriber(move || w.clone(), filter()), log_a_bit);
        let w = theirs.clone();
        let formatter = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_target(false)
            .with_writer(move || w.clone())
            .with_max_level(tracing::Level::TRACE)
            .finish()
            .with(filter());
        tracing::subscriber::with_default(formatter, log_a_bit);
        let lines = ours.lines();
        assert_eq!(lines.len(), 5, "{lines:#?}");
        assert_eq!(lines, theirs.lines());
        for line in &lines {
            serde_json::from_str::<serde_json::Value>(line).expect("each line is JSON");
        }
    }

    #[test]
    fn the_log_filter_takes_rust_log_directives_and_lambda_levels() {
        use tracing::Level;
        let on = |spec: &str, target: &str, level: Level| {
            log_filter(spec).unwrap().would_enable(target, &level)
        };
        assert!(on("info", "podmutator::app", Level::INFO));
        assert!(!on("info", "podmutator::app", Level::DEBUG));
        // Lambda's advanced logging controls set AWS_LAMBDA_LOG_LEVEL in capitals.
        assert!(on("DEBUG", "aws_smithy_runtime", Level::DEBUG));
        assert!(!on("DEBUG", "aws_smithy_runtime", Level::TRACE));
        assert!(on("FATAL", "podmutator", Level::ERROR));
        assert!(!on("FATAL", "podmutator", Level::WARN));
        let mixed = "info,podmutator::secrets=trace";
        assert!(on(mixed, "podmutator::secrets::embedded", Level::TRACE));
        assert!(!on(mixed, "podmutator::app", Level::DEBUG));
        assert!(on(mixed, "hyper", Level::INFO));
        // h2's WARN lines come one a misbehaving client connection: an attacker's to multiply.
        assert!(!on("trace", "h2::proto::streams", Level::WARN));
        assert!(on("info", "h2::proto::streams", Level::ERROR));
        // Only the named target, as with RUST_LOG.
        assert!(on("podmutator=debug", "podmutator::app", Level::DEBUG));
        // The core's lines are under `podmutator_core`: the crate's name covers them too.
        assert!(on(
            "podmutator=debug",
            "podmutator_core::secrets",
            Level::DEBUG
        ));
        assert!(!on("podmutator=debug", "hyper", Level::ERROR));
        assert!(log_filter("podmutator=loud").is_err());
    }

    #[rstest::rstest]
    #[case::misspelt_level("inof", "\"inof\" is not a level")]
    #[case::bare_target("podmutator", "a target needs one: podmutator=debug")]
    #[case::empty("", "it is empty")]
    #[case::blank(" , ", "it is empty")]
    #[case::bad_level_of_a_target("info,hyper=loud", "\"hyper=loud\"")]
    #[case::span_filter("podmutator[span]=debug", "span and field filters")]
    #[case::field_filter("podmutator[{uid}]=debug", "span and field filters")]
    fn a_filter_that_would_select_nothing_is_refused_naming_the_directive(
        #[case] spec: &str,
        #[case] named: &str,
    ) {
        let e = log_filter(spec).unwrap_err();
        assert!(e.contains(named), "{spec:?}: {e}");
    }

    /// Whatever `RUST_LOG` asks, the crates whose verbose lines hold whole events and requests
    /// (`lambda_runtime`'s raw event at TRACE holds the path token) stay at their cap, and
    /// everything else gets what was asked.
    #[rstest::rstest]
    #[case::trace("trace")]
    #[case::lambda_levels("TRACE")]
    #[case::named_crates(
        "lambda_runtime=trace,lambda_http=trace,hyper=trace,h2=trace,aws_smithy_runtime=trace"
    )]
    #[case::named_modules(
        "lambda_runtime::layers::api_response=trace,hyper::proto=trace,aws_sigv4::http_request=trace"
    )]
    #[case::shorter_prefixes("lambda=trace,hyp=trace,h=trace,aws=trace")]
    fn crates_that_log_raw_events_are_capped_whatever_the_filter_says(#[case] spec: &str) {
        use tracing::Level;
        let f = log_filter(spec).unwrap();
        for target in [
            "lambda_runtime::layers::api_response",
            "lambda_runtime_api_client",
            "lambda_http::request",
            "hyper::proto::h1::role",
            "hyper_util::server",
            "h2::codec::framed_read",
        ] {
            assert!(!f.would_enable(target, &Level::DEBUG), "{spec}: {target}");
            assert!(!f.would_enable(target, &Level::TRACE), "{spec}: {target}");
        }
        for target in [
            "aws_smithy_runtime::client::orchestrator",
            "aws_sigv4::http_request::sign",
            "aws_config",
        ] {
            assert!(!f.would_enable(target, &Level::TRACE), "{spec}: {target}");
        }
        // The caps lower, they never raise nor silence what was asked.
        if spec.eq_ignore_ascii_case("trace") {
            assert!(f.would_enable("podmutator::admission", &Level::TRACE));
            assert!(f.would_enable("lambda_runtime", &Level::INFO));
            assert!(f.would_enable("aws_smithy_runtime", &Level::DEBUG));
        }
    }

    #[rstest::rstest]
    #[case::info("info", None)]
    #[case::ours_at_debug("warn,podmutator=debug", None)]
    #[case::warnings_only("warn", Some("hides podmutator's INFO lines"))]
    #[case::another_crate_only("hyper=debug", Some("hides every line of podmutator's own"))]
    #[case::off("off", Some("hides every line"))]
    fn a_filter_that_hides_the_start_line_is_named(#[case] spec: &str, #[case] note: Option<&str>) {
        let got = hides_the_start_line(&log_filter(spec).unwrap());
        match note {
            None => assert_eq!(got, None, "{spec}"),
            Some(n) => assert!(got.is_some_and(|g| g.contains(n)), "{spec}: {got:?}"),
        }
    }

    #[test]
    fn the_caps_lower_levels_and_never_raise_them() {
        use tracing::Level;
        let f = log_filter("warn,podmutator=debug").unwrap();
        assert!(f.would_enable("podmutator::app", &Level::DEBUG));
        assert!(!f.would_enable("lambda_runtime", &Level::INFO));
        assert!(f.would_enable("lambda_runtime", &Level::WARN));
        assert!(!f.would_enable("aws_smithy_runtime", &Level::INFO));
        let f = log_filter("podmutator=info").unwrap();
        assert!(!f.would_enable("hyper", &Level::ERROR));
        assert!(!f.would_enable("aws_config", &Level::ERROR));
        assert!(f.would_enable("podmutator", &Level::INFO));
        let f = log_filter("off").unwrap();
        assert!(!f.would_enable("lambda_runtime", &Level::ERROR));
    }
}
