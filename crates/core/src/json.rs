//! JSON strings written by hand where serde_json's writer would cost more than the text: the
//! Lambda response's body (transport/lambda.rs), the EMF line ([`crate::metrics`]) and the
//! log lines (the `podmutator` binary's logging). Byte for byte what serde_json writes.

/// The index of the first byte from `i` on that a JSON string escapes (`"`, `\`, or a control
/// character), or the length: eight bytes a step. Used to skip strings when counting a review's
/// objects ([`crate::admission::objects_in`]) and by [`push_escaped`]. In each word, the lowest byte flagged by
/// "has a zero byte" (of the word XOR each quote) or "has a byte below 0x20" is exact; the
/// tricks' false positives lie only above a true one.
pub fn next_escape(bytes: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |w: u64, n: u8| w.wrapping_sub(ONES * u64::from(n)) & !w & HIGH;
    while let Some(word) = bytes.get(i..i + 8) {
        let w = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        let hits = below(w ^ (ONES * u64::from(b'"')), 1)
            | below(w ^ (ONES * u64::from(b'\\')), 1)
            | below(w, 0x20);
        if hits != 0 {
            return i + (hits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    let rest = &bytes[i..];
    i + rest
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .unwrap_or(rest.len())
}

/// What serde_json writes for a byte a JSON string escapes, but for the `\u00XX` ones.
fn escape_of(b: u8) -> Option<&'static str> {
    Some(match b {
        b'"' => "\\\"",
        b'\\' => "\\\\",
        b'\n' => "\\n",
        b'\r' => "\\r",
        b'\t' => "\\t",
        0x08 => "\\b",
        0x0c => "\\f",
        _ => return None,
    })
}

/// `text` as the inside of a JSON string (no quotes), appended to `out`. Every byte escaped is
/// ASCII, so each run between two of them is whole characters.
pub fn push_escaped(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut start = 0;
    loop {
        let at = next_escape(text.as_bytes(), start);
        out.push_str(&text[start..at]);
        let Some(&b) = text.as_bytes().get(at) else {
            return;
        };
        match escape_of(b) {
            Some(escaped) => out.push_str(escaped),
            None => {
                out.push_str("\\u00");
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xf)]));
            }
        }
        start = at + 1;
    }
}

/// `text` as a JSON string, quotes and all, appended to `out`: what `serde_json::to_string`
/// gives.
pub fn push_str(out: &mut String, text: &str) {
    out.reserve(text.len() + 2);
    out.push('"');
    push_escaped(out, text);
    out.push('"');
}

/// The length of `text` written as the inside of a JSON string.
pub fn escaped_len(text: &[u8]) -> usize {
    let (mut len, mut i) = (text.len(), 0);
    loop {
        i = next_escape(text, i);
        let Some(&b) = text.get(i) else { return len };
        len += escape_of(b).map_or(5, |e| e.len() - 1);
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escapes_as_serde_json_does() {
        for text in testing::tricky_strings() {
            let mut ours = String::new();
            push_str(&mut ours, &text);
            let theirs = serde_json::to_string(&text).unwrap();
            assert_eq!(ours, theirs, "{text:?}");
            assert_eq!(escaped_len(text.as_bytes()) + 2, theirs.len(), "{text:?}");
        }
    }

    proptest! {
        #[test]
        fn escapes_any_string_as_serde_json_does(text in "\\PC*|[\\x00-\\x7f]{0,64}") {
            let mut ours = String::new();
            push_str(&mut ours, &text);
            let theirs = serde_json::to_string(&text).unwrap();
            prop_assert_eq!(escaped_len(text.as_bytes()) + 2, theirs.len());
            prop_assert_eq!(ours, theirs);
        }
    }
}

/// Strings for the tests of what writes JSON strings.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    /// Every byte a string can hold at every place in an eight-byte word, and in the tail;
    /// each short and after a 2,048-byte base64-like run (past a Lambda response's
    /// `RAW_FROM`).
    pub fn tricky_strings() -> Vec<String> {
        let mut out = vec![String::new(), "é\u{2028}😀".into(), "\u{7f}".into()];
        for b in (0u8..0x80).chain([0xe9]) {
            let c = char::from(b).to_string();
            for at in 0..20 {
                out.push(format!("{}{c}{}", "A".repeat(at), "b".repeat(19 - at)));
            }
        }
        let long = "Zm9v+/0=".repeat(2048 / 8);
        let longer: Vec<String> = out.iter().map(|t| format!("{long}{t}{long}")).collect();
        out.extend(longer);
        out
    }
}
