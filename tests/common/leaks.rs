//! Leak probes: every form in which a secret value could reach an output, and a search that
//! looks through base64 (replies carry their patch base64-encoded, and file values travel
//! base64-encoded inside it, e.g. Embedded's `SECRETS` lines), so a value is found whichever
//! layer it hides in.

use base64::Engine;
use base64::alphabet;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD_NO_PAD};

/// Decoders that take any slice of a longer encoding: no padding needed, stray bits allowed.
const LENIENT_CONFIG: GeneralPurposeConfig = GeneralPurposeConfig::new()
    .with_decode_allow_trailing_bits(true)
    .with_decode_padding_mode(DecodePaddingMode::Indifferent);
const LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT_CONFIG);
const LENIENT_URL_SAFE: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT_CONFIG);

/// How deep base64 is unwrapped (a file value in a patch is base64 inside base64).
const MAX_DEPTH: usize = 4;
/// Shortest base64 run worth decoding: 12 characters hold 9 bytes.
const MIN_RUN: usize = 12;

/// The forms `sentinel` takes in text, each with how it was made: itself, and the base64
/// characters that its bytes alone determine, at each of the three byte alignments a value can
/// have inside a longer encoded string (standard and URL-safe alphabets).
pub fn forms(sentinel: &str) -> Vec<(String, String)> {
    let bytes = sentinel.as_bytes();
    let mut out = vec![("in clear".to_owned(), sentinel.to_owned())];
    for offset in 0..3 {
        let mut input = vec![0u8; offset];
        input.extend_from_slice(bytes);
        let encoded = STANDARD_NO_PAD.encode(&input);
        // Character i covers bits [6i, 6i + 6); keep those inside the sentinel's bytes.
        let first = (8 * offset).div_ceil(6);
        let last = (8 * (offset + bytes.len())) / 6; // exclusive
        let core = &encoded[first..last];
        assert!(core.len() >= 8, "a sentinel is too short to probe");
        out.push((format!("as base64 at alignment {offset}"), core.to_owned()));
        out.push((
            format!("as URL-safe base64 at alignment {offset}"),
            core.replace('+', "-").replace('/', "_"),
        ));
    }
    out
}

fn is_b64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_')
}

/// Where each sentinel appears in `text`, in any of its [`forms`], directly or inside base64
/// (decoded recursively, at every start offset of every base64 run). `sentinels` are (label,
/// value) pairs; a hit names the label, the form and the layer, never the value itself.
pub fn find(text: &[u8], sentinels: &[(&str, &str)]) -> Vec<String> {
    let probes: Vec<(&str, Vec<(String, String)>)> =
        sentinels.iter().map(|(l, s)| (*l, forms(s))).collect();
    let mut hits = Vec::new();
    search(text, &probes, "", 0, &mut hits);
    hits.sort();
    hits.dedup();
    hits
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&first, _)) = needle.split_first() else {
        return true;
    };
    let mut from = 0;
    while let Some(at) = haystack[from..].iter().position(|&b| b == first) {
        if haystack[from + at..].starts_with(needle) {
            return true;
        }
        from += at + 1;
    }
    false
}

fn search(
    text: &[u8],
    probes: &[(&str, Vec<(String, String)>)],
    layer: &str,
    depth: usize,
    hits: &mut Vec<String>,
) {
    for (label, forms) in probes {
        for (how, form) in forms {
            if contains(text, form.as_bytes()) {
                hits.push(format!("{label} {how}{layer}"));
            }
        }
    }
    if depth == MAX_DEPTH {
        return;
    }
    let mut i = 0;
    while i < text.len() {
        if !is_b64(text[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < text.len() && is_b64(text[i]) {
            i += 1;
        }
        let run = &text[start..i];
        if run.len() < MIN_RUN {
            continue;
        }
        // The run may begin with a character that is not part of the encoding (`\n` written
        // as `\` `n`, a key glued to its value): try each start within one quantum. Padding
        // (`=`) ends the run and is optional to the decoder.
        for skip in 0..4 {
            let mut part = &run[skip..];
            if part.len() % 4 == 1 {
                part = &part[..part.len() - 1];
            }
            for engine in [&LENIENT, &LENIENT_URL_SAFE] {
                if let Ok(decoded) = engine.decode(part) {
                    let inner = format!("{layer} in base64 at byte {}", start + skip);
                    search(&decoded, probes, &inner, depth + 1, hits);
                }
            }
        }
    }
}
