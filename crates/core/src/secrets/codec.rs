//! Flyte's secret-request annotations, both directions.
//!
//! A Flyte task pod asks for secrets with one annotation per secret: key `flyte.secrets/s<i>`,
//! value `base32(text_proto(Secret))`. Both layers are Flyte's own and must be reproduced byte for
//! byte, or pods written by Flyte's executor do not decode here (and ours do not decode in Flyte):
//!
//! - base32 with the alphabet `a-z1-6` (not RFC 4648's `A-Z2-7`) and no padding;
//! - the *legacy* golang/protobuf text format as `proto.MarshalTextString` (github.com/golang/
//!   protobuf v1.4+) writes it, read with the leniency of `proto.UnmarshalText` that Flyte's own
//!   test vectors need: no space after the colon, trailing blanks, raw invalid UTF-8 in a string.

use std::collections::BTreeMap;

/// Prefix of every secret-request annotation key; the suffix is the secret's index.
pub const ANNOTATION_PREFIX: &str = "flyte.secrets/s";

/// Longest encoded value Flyte accepts (its `totalAnnotationSizeLimitB`, copied from the API
/// server's limit on all annotations of an object together).
pub const MAX_ENCODED_LEN: usize = 256 * 1024;

/// Flyte's base32 alphabet: lowercase letters, then the digits 1 to 6.
const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz123456";

/// Marks bytes outside [`ALPHABET`] in [`DECODE_MAP`].
const NOT_BASE32: u8 = 0xff;

/// 5-bit value of each byte of [`ALPHABET`], [`NOT_BASE32`] for every other byte.
const DECODE_MAP: [u8; 256] = {
    let mut map = [NOT_BASE32; 256];
    let mut i = 0;
    while i < ALPHABET.len() {
        map[ALPHABET[i] as usize] = i as u8;
        i += 1;
    }
    map
};

/// `flyteidl.core.Secret.MountType`: where the injector should put the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MountRequirement {
    /// Proto `ANY` (0), the default; each injector picks (FILE for K8s/Vault/sidecars, env for
    /// Global and Embedded).
    #[default]
    Any,
    /// Proto `ENV_VAR` (1).
    EnvVar,
    /// Proto `FILE` (2).
    File,
    /// A number with no name, as text may give it (`mount_requirement: 7`). Go keeps such numbers
    /// and the injectors then fail with "unrecognized mount requirement", so we keep them too.
    /// [`MountRequirement::from_number`] never builds this from 0, 1 or 2.
    Unknown(i32),
}

impl MountRequirement {
    /// The proto enum number.
    pub const fn number(self) -> i32 {
        match self {
            MountRequirement::Any => 0,
            MountRequirement::EnvVar => 1,
            MountRequirement::File => 2,
            MountRequirement::Unknown(n) => n,
        }
    }

    /// The named variant for 0, 1 and 2, `Unknown(n)` for every other number.
    pub const fn from_number(n: i32) -> Self {
        match n {
            0 => MountRequirement::Any,
            1 => MountRequirement::EnvVar,
            2 => MountRequirement::File,
            n => MountRequirement::Unknown(n),
        }
    }

    /// The proto name, `None` for numbers without one.
    pub(crate) const fn name(self) -> Option<&'static str> {
        match MountRequirement::from_number(self.number()) {
            MountRequirement::Any => Some("ANY"),
            MountRequirement::EnvVar => Some("ENV_VAR"),
            MountRequirement::File => Some("FILE"),
            MountRequirement::Unknown(_) => None,
        }
    }

    fn from_name(name: &[u8]) -> Option<Self> {
        [Self::Any, Self::EnvVar, Self::File]
            .into_iter()
            .find(|m| m.name().map(str::as_bytes) == Some(name))
    }
}

/// `flyteidl.core.Secret`: one secret a task asks for (a name, never a value).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Secret {
    pub group: String,
    pub group_version: String,
    pub key: String,
    pub mount_requirement: MountRequirement,
    /// Name of the env var to expose the secret as (Flyte 1.15+; empty means the default name).
    pub env_var: String,
}

/// Why a value could not be encoded or decoded.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// A character outside Flyte's alphabet (uppercase, `0`, `7`-`9`, `=` before the end, ...).
    #[error(
        "illegal base32 data at input byte {offset} ({}): Flyte's alphabet is a-z and 1-6",
        char_literal(.found)
    )]
    IllegalBase32 { offset: usize, found: char },
    /// Unpadded base32 whose length is 1, 3 or 6 mod 8, which no byte string encodes to.
    #[error(
        "truncated base32 data at input byte {offset}: {len} characters cannot be unpadded base32 \
         (the length mod 8 must be 0, 2, 4, 5 or 7)"
    )]
    TruncatedBase32 { offset: usize, len: usize },
    /// The decoded text is not a `flyteidl.core.Secret` in protobuf text format.
    #[error("line {line}: {problem}")]
    Text { line: usize, problem: TextProblem },
    /// Flyte refuses to write a value longer than [`MAX_ENCODED_LEN`].
    #[error("encoded secret is {len} bytes; Flyte's limit is {limit}", limit = MAX_ENCODED_LEN)]
    TooLong { len: usize },
    /// Flyte refuses to write a mount requirement it has no name for.
    #[error("invalid mount requirement {0}: Flyte knows ANY (0), ENV_VAR (1) and FILE (2)")]
    InvalidMountRequirement(i32),
}

/// What is wrong in protobuf text, at the line [`CodecError::Text`] gives.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TextProblem {
    #[error(
        "unknown field {0:?} in flyteidl.core.Secret; its fields are group, group_version, key, \
         mount_requirement and env_var"
    )]
    UnknownField(String),
    #[error("expected a field name, found {0}")]
    ExpectedFieldName(String),
    #[error("extensions and Any expansions (`[...]`) do not exist in flyteidl.core.Secret")]
    Extension,
    #[error("field {0:?} is set twice; flyteidl.core.Secret has no repeated fields")]
    RepeatedField(&'static str),
    #[error("expected ':' after field {field:?}, found {found}")]
    ExpectedColon { field: &'static str, found: String },
    #[error("invalid value for field {field:?}: expected a double-quoted string, found {found}")]
    NotAString { field: &'static str, found: String },
    #[error(
        "invalid value for field \"mount_requirement\": expected ANY, ENV_VAR, FILE or a 32-bit \
         integer, found {0} (a number is decimal: 7, -3, no leading zero)"
    )]
    NotAMountRequirement(String),
    #[error(
        "unexpected byte {}; Flyte writes `name: value` per line, with names, ':', double-quoted \
         strings and decimal numbers only (no comments, ';', ',' or single quotes)",
        byte_literal(.0)
    )]
    UnexpectedByte(u8),
    #[error("unterminated string literal: a string must close with '\"' on the same line")]
    UnterminatedString,
    #[error(
        "unknown escape \\{0} in a string literal; Flyte writes only \\n \\r \\t \\\" \\\\ and \
         three octal digits \\000 to \\377"
    )]
    UnknownEscape(char),
    #[error("invalid octal escape \\{0}: an octal escape is exactly three digits, \\000 to \\377")]
    OctalEscape(String),
    #[error(
        "invalid UTF-8 in a string literal with escapes; raw bytes pass through only in literals \
         without a backslash, as in Go"
    )]
    InvalidUtf8WithEscapes,
}

/// Renders a character for an error message: `'8'`, `'\n'`, `'é'`.
fn char_literal(c: &char) -> String {
    format!("'{}'", c.escape_debug())
}

/// Renders a byte for an error message: `0x40 ('@')`, or `0xff` when it is not printable ASCII.
fn byte_literal(b: &u8) -> String {
    if b.is_ascii_graphic() {
        format!("{b:#04x} ('{}')", char::from(*b))
    } else {
        format!("{b:#04x}")
    }
}

/// Encodes with Flyte's alphabet, unpadded: `ceil(8n/5)` characters.
pub fn encode_base32(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(encoded_len(bytes.len()));
    for chunk in bytes.chunks(5) {
        let mut block = [0u8; 8];
        block[3..3 + chunk.len()].copy_from_slice(chunk);
        let bits = u64::from_be_bytes(block);
        for i in 0..encoded_len(chunk.len()) {
            out.push(char::from(ALPHABET[((bits >> (35 - 5 * i)) & 31) as usize]));
        }
    }
    out
}

/// Length of [`encode_base32`]'s output for `n` input bytes, without overflowing for any `n`.
const fn encoded_len(n: usize) -> usize {
    n / 5 * 8 + (n % 5 * 8).div_ceil(5)
}

/// Decodes Flyte's base32.
///
/// Trailing `=` are ignored, as a value padded by some other encoder still means the same bytes;
/// Go's decoder would reject them, Flyte's encoder trims them. Everything else Go rejects is an
/// error here too, naming the byte offset, and so are two things Go lets through: CR and LF
/// (Go's `DecodeString` drops them; no annotation Flyte writes has them) and lengths that no
/// input encodes to (1, 3 or 6 mod 8; Go drops the dangling characters). Leftover bits of the
/// last character are ignored, as in Go.
pub fn decode_base32(s: &str) -> Result<Vec<u8>, CodecError> {
    let data = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(data.len() * 5 / 8);
    let mut acc: u32 = 0;
    let mut bits: u32 = 0;
    for (offset, &b) in data.iter().enumerate() {
        let value = DECODE_MAP[usize::from(b)];
        if value == NOT_BASE32 {
            // Every earlier byte is ASCII, so `offset` starts a character.
            let found = s
                .get(offset..)
                .and_then(|rest| rest.chars().next())
                .unwrap_or(char::REPLACEMENT_CHARACTER);
            return Err(CodecError::IllegalBase32 { offset, found });
        }
        acc = (acc << 5) | u32::from(value);
        bits += 5;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    if matches!(data.len() % 8, 1 | 3 | 6) {
        return Err(CodecError::TruncatedBase32 {
            offset: data.len() - 1,
            len: data.len(),
        });
    }
    Ok(out)
}

crate::named_enum! {
    /// The five fields of `flyteidl.core.Secret`, in field-number order.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Field as name {
        Group = "group",
        GroupVersion = "group_version",
        Key = "key",
        MountRequirement = "mount_requirement",
        EnvVar = "env_var",
    }
}

/// Writes `s` exactly as golang/protobuf's legacy `proto.MarshalTextString` does.
///
/// One `name: value\n` line per non-default field in field-number order; strings double-quoted
/// with `\n \r \t \" \\` escaped and every other byte outside printable ASCII (so every byte of
/// non-ASCII UTF-8) as three-digit octal; the mount requirement by name, or by number when it has
/// none. An all-default secret is the empty string.
pub fn marshal_text(s: &Secret) -> String {
    let strings = s.group.len() + s.group_version.len() + s.key.len() + s.env_var.len();
    let mut out = String::with_capacity(strings + 64);
    push_string_field(&mut out, Field::Group, &s.group);
    push_string_field(&mut out, Field::GroupVersion, &s.group_version);
    push_string_field(&mut out, Field::Key, &s.key);
    let mount = s.mount_requirement;
    if mount.number() != 0 {
        let value = mount
            .name()
            .map_or_else(|| mount.number().to_string(), str::to_owned);
        out += &format!("{}: {value}\n", Field::MountRequirement.name());
    }
    push_string_field(&mut out, Field::EnvVar, &s.env_var);
    out
}

fn push_string_field(out: &mut String, field: Field, value: &str) {
    if value.is_empty() {
        return;
    }
    out.reserve(field.name().len() + value.len() + 5);
    out.push_str(field.name());
    out.push_str(": \"");
    for &b in value.as_bytes() {
        match b {
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => {
                out.push('\\');
                out.extend([b >> 6, (b >> 3) & 7, b & 7].map(|d| char::from(b'0' + d)));
            }
        }
    }
    out.push_str("\"\n");
}

/// Parses the protobuf text Flyte writes ([`marshal_text`]'s grammar) into a [`Secret`].
///
/// What is read: `name: value` for each of the five fields, in any order, each at most once;
/// spaces, tabs, CR and LF between tokens, none needed (`key:"x"` and trailing blanks, which one of
/// Flyte's own test vectors has); strings in double quotes with the escapes Flyte writes (`\n \r
/// \t \" \\` and exactly three octal digits `\000`-`\377`) and raw bytes, invalid UTF-8 included
/// (that same vector); the mount requirement by name (`ANY`, `ENV_VAR`, `FILE`) or as a decimal
/// `int32` (`7`, `-3`), which is how Flyte writes a number without a name. Numbers other than 0-2
/// are kept as [`MountRequirement::Unknown`].
///
/// Everything read here is read the same way by golang/protobuf's legacy `proto.UnmarshalText`,
/// which Flyte's webhook uses. That parser takes more, none of which Flyte writes: comments, `;`
/// and `,` after a field, single quotes, adjacent literals joined, the escapes `\a \b \f \v \' \?
/// \x \u \U`, and numbers such as `0x2`, `010` or `1_0`. Those are errors here that name what to
/// write instead.
///
/// Strings are bytes in Go; here they are `String`s that end up in JSON. Invalid UTF-8 (raw, or
/// built from `\ooo` escapes) therefore becomes one U+FFFD per invalid byte, the exact replacement
/// Go's `encoding/json` makes when Flyte's webhook writes the same string into a pod. As in Go, a
/// literal with a backslash escape must otherwise be valid UTF-8.
///
/// Errors carry the line of the offending token (for problems at the end of input, the line of
/// the last token), as in Go.
pub fn unmarshal_text(text: &[u8]) -> Result<Secret, CodecError> {
    let mut lexer = Lexer {
        src: text,
        pos: 0,
        line: 1,
        token_line: 1,
    };
    let mut secret = Secret::default();
    let mut seen = [false; 5];
    loop {
        let token = match lexer.next() {
            Err(CodecError::Text {
                problem: TextProblem::UnexpectedByte(b'['),
                ..
            }) => return Err(lexer.error(TextProblem::Extension)),
            other => other?,
        };
        let field = match token {
            Token::Eof => return Ok(secret),
            Token::Ident(name) => (Field::ALL.into_iter())
                .find(|f| f.name().as_bytes() == name)
                .ok_or_else(|| lexer.error(TextProblem::UnknownField(shown(name))))?,
            other => return Err(lexer.error(TextProblem::ExpectedFieldName(other.describe()))),
        };
        if std::mem::replace(&mut seen[field as usize], true) {
            return Err(lexer.error(TextProblem::RepeatedField(field.name())));
        }
        let colon = lexer.next()?;
        if !matches!(colon, Token::Colon) {
            return Err(lexer.error(TextProblem::ExpectedColon {
                field: field.name(),
                found: colon.describe(),
            }));
        }
        let value = lexer.next()?;
        let slot = match field {
            Field::Group => &mut secret.group,
            Field::GroupVersion => &mut secret.group_version,
            Field::Key => &mut secret.key,
            Field::EnvVar => &mut secret.env_var,
            Field::MountRequirement => {
                secret.mount_requirement = match value {
                    Token::Ident(v) => MountRequirement::from_name(v)
                        .or_else(|| parse_decimal(v).map(MountRequirement::from_number)),
                    _ => None,
                }
                .ok_or_else(|| lexer.error(TextProblem::NotAMountRequirement(value.describe())))?;
                continue;
            }
        };
        let Token::Str(bytes) = value else {
            return Err(lexer.error(TextProblem::NotAString {
                field: field.name(),
                found: value.describe(),
            }));
        };
        *slot = string_from_go_bytes(bytes);
    }
}

/// Converts a Go string (bytes) to a `String` as Go's `encoding/json` would emit it: each byte
/// that does not start a valid UTF-8 sequence becomes U+FFFD.
fn string_from_go_bytes(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| {
        let mut s = String::with_capacity(e.as_bytes().len() + 8);
        for chunk in e.as_bytes().utf8_chunks() {
            s.push_str(chunk.valid());
            s.extend(chunk.invalid().iter().map(|_| char::REPLACEMENT_CHARACTER));
        }
        s
    })
}

/// A decimal number as Go writes one: an optional `-` (which `parse` takes only for a signed
/// `T`), then `0` or digits without a leading zero (Go would read `010` as octal, so it is not
/// taken as ten here).
fn parse_decimal<T: std::str::FromStr>(s: &[u8]) -> Option<T> {
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    let canonical = !digits.is_empty()
        && digits.iter().all(u8::is_ascii_digit)
        && (digits == b"0" || digits[0] != b'0');
    // ASCII digits with an optional sign: valid UTF-8, and `parse` checks the range.
    canonical.then(|| std::str::from_utf8(s).ok()?.parse().ok())?
}

/// Tokens of the text, split where golang/protobuf's legacy parser splits them.
enum Token<'a> {
    Eof,
    Colon,
    /// A run of `[-+._A-Za-z0-9]`: a field name, an enum name or a number.
    Ident(&'a [u8]),
    /// A double-quoted literal, unescaped, as bytes.
    Str(Vec<u8>),
}

impl Token<'_> {
    /// How an error message names the token, without echoing string contents.
    fn describe(&self) -> String {
        match self {
            Token::Eof => "end of input".to_owned(),
            Token::Colon => "':'".to_owned(),
            Token::Ident(text) => format!("{:?}", shown(text)),
            Token::Str(_) => "a string literal".to_owned(),
        }
    }
}

/// At most 40 characters of `bytes`, for an error message.
fn shown(bytes: &[u8]) -> String {
    const MAX: usize = 40;
    let text = String::from_utf8_lossy(bytes);
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.into_owned(),
    }
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.' | b'_')
}

struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    /// Line of `pos`, from 1.
    line: usize,
    /// Line of the token read last, where errors are reported.
    token_line: usize,
}

impl<'a> Lexer<'a> {
    fn error(&self, problem: TextProblem) -> CodecError {
        CodecError::Text {
            line: self.token_line,
            problem,
        }
    }

    fn next(&mut self) -> Result<Token<'a>, CodecError> {
        while let Some(&b @ (b' ' | b'\t' | b'\r' | b'\n')) = self.src.get(self.pos) {
            self.pos += 1;
            self.line += usize::from(b == b'\n');
        }
        let Some(&b) = self.src.get(self.pos) else {
            return Ok(Token::Eof);
        };
        self.token_line = self.line;
        match b {
            b':' => {
                self.pos += 1;
                Ok(Token::Colon)
            }
            b'"' => self.literal().map(Token::Str),
            b if is_ident_byte(b) => {
                let rest = &self.src[self.pos..];
                let ident = rest.split(|&c| !is_ident_byte(c)).next().unwrap_or(rest);
                self.pos += ident.len();
                Ok(Token::Ident(ident))
            }
            b => Err(self.error(TextProblem::UnexpectedByte(b))),
        }
    }

    /// Reads the double-quoted literal at `pos` and returns its unescaped bytes.
    fn literal(&mut self) -> Result<Vec<u8>, CodecError> {
        let start = self.pos + 1;
        let mut end = start;
        loop {
            match self.src.get(end) {
                None | Some(b'\n') => return Err(self.error(TextProblem::UnterminatedString)),
                Some(b'"') => break,
                // Whatever follows a backslash cannot close the literal.
                Some(b'\\') => end += 2,
                Some(_) => end += 1,
            }
        }
        self.pos = end + 1;
        unquote(&self.src[start..end]).map_err(|problem| self.error(problem))
    }
}

/// The unescaped bytes of a literal's body (between its quotes).
fn unquote(body: &[u8]) -> Result<Vec<u8>, TextProblem> {
    if !body.contains(&b'\\') {
        // Go returns such a body untouched, invalid UTF-8 included.
        return Ok(body.to_vec());
    }
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    loop {
        let cut = rest.iter().position(|&b| b == b'\\').unwrap_or(rest.len());
        let (plain, tail) = rest.split_at(cut);
        if std::str::from_utf8(plain).is_err() {
            return Err(TextProblem::InvalidUtf8WithEscapes);
        }
        out.extend_from_slice(plain);
        let Some((_, escaped)) = tail.split_first() else {
            return Ok(out);
        };
        rest = unescape(escaped, &mut out)?;
    }
}

/// Decodes the escape after a backslash into `out`; returns the input after it.
fn unescape<'a>(s: &'a [u8], out: &mut Vec<u8>) -> Result<&'a [u8], TextProblem> {
    let Some((&c, tail)) = s.split_first() else {
        return Err(TextProblem::UnknownEscape(char::REPLACEMENT_CHARACTER));
    };
    match c {
        b'n' => out.push(b'\n'),
        b'r' => out.push(b'\r'),
        b't' => out.push(b'\t'),
        b'"' | b'\\' => out.push(c),
        b'0'..=b'7' => {
            let Some((digits, rest)) = s.split_at_checked(3) else {
                return Err(TextProblem::OctalEscape(shown(s)));
            };
            // The first digit is octal, so no sign: three octal digits up to 377, or an error.
            let value = std::str::from_utf8(digits)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
                .ok_or_else(|| TextProblem::OctalEscape(shown(digits)))?;
            out.push(value);
            return Ok(rest);
        }
        _ if c.is_ascii() => return Err(TextProblem::UnknownEscape(char::from(c))),
        _ => {
            let valid = s.utf8_chunks().next().map_or("", |c| c.valid());
            return Err(match valid.chars().next() {
                Some(ch) => TextProblem::UnknownEscape(ch),
                None => TextProblem::InvalidUtf8WithEscapes,
            });
        }
    }
    Ok(tail)
}

/// The annotation value for `s`: Flyte's base32 of [`marshal_text`].
///
/// Fails where Flyte's `MarshalSecretsToMapStrings` fails: for a mount requirement without a
/// name, and for a value longer than [`MAX_ENCODED_LEN`].
pub fn encode_secret(s: &Secret) -> Result<String, CodecError> {
    if let MountRequirement::Unknown(n) =
        MountRequirement::from_number(s.mount_requirement.number())
    {
        return Err(CodecError::InvalidMountRequirement(n));
    }
    let text = marshal_text(s);
    let len = encoded_len(text.len());
    if len > MAX_ENCODED_LEN {
        return Err(CodecError::TooLong { len });
    }
    Ok(encode_base32(text.as_bytes()))
}

/// Decodes one annotation value: [`decode_base32`], then [`unmarshal_text`].
pub fn decode_secret(value: &str) -> Result<Secret, CodecError> {
    unmarshal_text(&decode_base32(value)?)
}

/// The annotations Flyte's producer writes for `secrets`: `flyte.secrets/s<i>` for the secret at
/// position `i`.
pub fn encode_annotations(secrets: &[Secret]) -> Result<BTreeMap<String, String>, CodecError> {
    secrets
        .iter()
        .enumerate()
        .map(|(i, s)| Ok((format!("{ANNOTATION_PREFIX}{i}"), encode_secret(s)?)))
        .collect()
}

/// One decoded request, in processing order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretAnnotation {
    /// The `<N>` of `flyte.secrets/s<N>`.
    pub index: u32,
    /// The whole annotation key, for messages.
    pub annotation: String,
    pub secret: Secret,
}

/// A secret-request annotation we cannot use.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("annotation {annotation:?}: {cause}")]
pub struct AnnotationError {
    /// The annotation key.
    pub annotation: String,
    pub cause: AnnotationProblem,
}

/// What is wrong with one annotation.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AnnotationProblem {
    #[error(
        "expected flyte.secrets/s<N> with N a decimal index (0, 1, 17: no sign, no leading zero, \
         at most 4294967295)"
    )]
    NotAnIndex,
    /// Only possible when the input is not a map.
    #[error("given more than once")]
    Repeated,
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// Decodes every annotation whose key starts with [`ANNOTATION_PREFIX`], sorted by numeric index.
///
/// Stricter than Flyte, on purpose:
/// - the suffix must be a canonical decimal `u32` (`0`, `1`, `17`; not `01`, `+1`, `x` or empty),
///   so `flyte.secrets/sidecar` is an error rather than a silently decoded request, and distinct
///   keys never share an index;
/// - results are sorted by index (`s2` before `s10`), where Flyte iterates a Go map in random
///   order, so injection is deterministic.
///
/// Keys without the prefix are ignored. On error the report is deterministic whatever the
/// iteration order: a malformed key first (the smallest in byte order), otherwise the first value
/// that fails to decode in index order. A key given twice (impossible for a map) is an error.
pub fn decode_annotations<'a, I>(annotations: I) -> Result<Vec<SecretAnnotation>, AnnotationError>
where
    I: IntoIterator<Item = (&'a String, &'a String)>,
{
    let mut requests: Vec<(u32, &'a String, &'a String)> = Vec::new();
    let mut bad_key: Option<&'a String> = None;
    for (key, value) in annotations {
        let Some(suffix) = key.strip_prefix(ANNOTATION_PREFIX) else {
            continue;
        };
        match parse_decimal(suffix.as_bytes()) {
            Some(index) => requests.push((index, key, value)),
            None if bad_key.is_none_or(|worst| key < worst) => bad_key = Some(key),
            None => {}
        }
    }
    let error = |key: &String, cause| AnnotationError {
        annotation: key.clone(),
        cause,
    };
    if let Some(key) = bad_key {
        return Err(error(key, AnnotationProblem::NotAnIndex));
    }
    requests.sort_unstable_by_key(|&(index, _, _)| index);
    if let Some(pair) = requests.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(error(pair[1].1, AnnotationProblem::Repeated));
    }
    requests
        .into_iter()
        .map(|(index, key, value)| {
            Ok(SecretAnnotation {
                index,
                annotation: key.clone(),
                secret: decode_secret(value).map_err(|e| error(key, e.into()))?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rstest::rstest;

    fn annotation_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn decoded_secrets(annotations: &BTreeMap<String, String>) -> Vec<Secret> {
        decode_annotations(annotations)
            .expect("annotations decode")
            .into_iter()
            .map(|a| a.secret)
            .collect()
    }

    // --- Flyte's marshaler_test.go -------------------------------------------------------------

    const FLYTE_GROUP_CHARACTERS: &str =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz01234567890._-/";

    /// TestEncodeSecretGroup.
    #[test]
    fn every_character_flyte_allows_in_a_group_round_trips_through_base32() {
        let encoded = encode_base32(FLYTE_GROUP_CHARACTERS.as_bytes());
        assert_eq!(
            decode_base32(&encoded).expect("decodes"),
            FLYTE_GROUP_CHARACTERS.as_bytes()
        );
    }

    #[test]
    fn every_character_flyte_allows_in_a_group_round_trips_as_a_secret_group() {
        let secret = Secret {
            group: FLYTE_GROUP_CHARACTERS.into(),
            ..Default::default()
        };
        let encoded = encode_secret(&secret).expect("encodes");
        assert_eq!(decode_secret(&encoded).expect("decodes"), secret);
    }

    /// TestMarshalSecretsToMapStrings, both directions. Go's `nil` and empty slices are the same
    /// empty slice here.
    #[rstest]
    #[case::empty(vec![], &[])]
    #[case::nil(Vec::new(), &[])]
    #[case::forbidden_characters(
        vec![Secret { group: ";':/\\".into(), ..Default::default() }],
        &[("flyte.secrets/s0", "m4zg54lqhiqceozhhixvyxbcbi")],
    )]
    #[case::without_group(
        vec![Secret { key: "my_key".into(), ..Default::default() }],
        &[("flyte.secrets/s0", "nnsxsoraejwxsx2lmv3secq")],
    )]
    fn flyte_marshaler_vectors_encode_and_decode_back(
        #[case] secrets: Vec<Secret>,
        #[case] want: &[(&str, &str)],
    ) {
        let want = annotation_map(want);
        assert_eq!(encode_annotations(&secrets).expect("encodes"), want);
        assert_eq!(decoded_secrets(&want), secrets);
    }

    /// The vectors spec §1.2 computed with the same algorithm, plus the text they go through.
    #[rstest]
    #[case::env_var_user_info(
        Secret {
            group: "user-info".into(),
            key: "user_secret".into(),
            mount_requirement: MountRequirement::EnvVar,
            ..Default::default()
        },
        "group: \"user-info\"\nkey: \"user_secret\"\nmount_requirement: ENV_VAR\n",
        "m4zg54lqhiqce4ltmvzc11lomzxsectlmv3tuibcovzwk3s6onswg3tfoqrau2lpovxhix2smvyxk1lsmvwwk2tuhiqektswl4lecuqk",
    )]
    #[case::openai_env_var(
        Secret {
            key: "openai_key".into(),
            env_var: "OPENAI_API_KEY".into(),
            ..Default::default()
        },
        "key: \"openai_key\"\nenv_var: \"OPENAI_API_KEY\"\n",
        "nnsxsoraejxxazlomfuv512fperauzloozpxmylshiqcet1qivhecsk6ifiesx1livmsecq",
    )]
    fn computed_vectors_encode_and_decode_back(
        #[case] secret: Secret,
        #[case] text: &str,
        #[case] value: &str,
    ) {
        assert_eq!(marshal_text(&secret), text);
        assert_eq!(encode_secret(&secret).expect("encodes"), value);
        assert_eq!(decode_secret(value).expect("decodes"), secret);
    }

    /// K8s secret volume names (spec §3) are the same base32 of `group + "_" + group_version`.
    #[rstest]
    #[case::mixed_case_group("grOUP_", "m4ze5vkql3")]
    #[case::dashed_group("user-info_", "ovzwk3rnnfxgm216")]
    #[case::md5_of_key_as_group(
        "5d41402abc4b2a76b9719d911017c592_",
        "gvsdimjugazgcytdgrrdeyjxgzrdsnzrhfsdsmjrgaytoyzvhezf5"
    )]
    fn volume_name_vectors_are_flyte_base32(#[case] input: &str, #[case] want: &str) {
        assert_eq!(encode_base32(input.as_bytes()), want);
        assert_eq!(decode_base32(want).expect("decodes"), input.as_bytes());
    }

    /// Flyte's webhook test uses a value made with *standard* base32 (it spells `key:"my_key" `
    /// there). Under Flyte's alphabet it spells `key:"m{_\xef\x85y" `: no space after the colon,
    /// trailing whitespace and invalid UTF-8, all of which Go's parser accepts, so Flyte's test
    /// passes and a pod carrying this value is admitted. It must decode here too. The two invalid
    /// bytes become two U+FFFD, as Go's JSON encoder writes them.
    #[test]
    fn flyte_webhook_vector_made_with_standard_base32_still_decodes() {
        let raw = decode_base32("nnsxsorcnv4v623fperca").expect("valid Flyte base32");
        assert_eq!(raw, b"key:\"m{_\xef\x85y\" ");
        assert_eq!(
            decode_secret("nnsxsorcnv4v623fperca").expect("lenient parse"),
            Secret {
                key: "m{_\u{fffd}\u{fffd}y".into(),
                ..Default::default()
            }
        );
    }

    // --- base32 ---------------------------------------------------------------------------------

    #[rstest]
    #[case::uppercase("nnsX", 3, 'X')]
    #[case::zero("m0", 1, '0')]
    #[case::seven("abc7", 3, '7')]
    #[case::eight("m4zg54lq8", 8, '8')]
    #[case::nine("9a", 0, '9')]
    #[case::padding_inside("ab=cdefg", 2, '=')]
    #[case::space("ab cd", 2, ' ')]
    #[case::newline("abcd\n", 4, '\n')]
    #[case::non_ascii("abcé", 3, 'é')]
    fn base32_rejects_characters_outside_flytes_alphabet(
        #[case] input: &str,
        #[case] offset: usize,
        #[case] found: char,
    ) {
        let err = decode_base32(input).expect_err("illegal character");
        assert_eq!(err, CodecError::IllegalBase32 { offset, found });
        assert_eq!(
            err.to_string(),
            format!(
                "illegal base32 data at input byte {offset} ('{}'): Flyte's alphabet is a-z and 1-6",
                found.escape_debug()
            )
        );
    }

    #[rstest]
    #[case::one_character("a", 0)]
    #[case::three_characters("abc", 2)]
    #[case::six_characters("abcdef", 5)]
    #[case::nine_characters("abcdefgha", 8)]
    #[case::three_characters_before_padding("abc=====", 2)]
    fn base32_rejects_lengths_no_input_encodes_to(#[case] input: &str, #[case] offset: usize) {
        let err = decode_base32(input).expect_err("impossible length");
        assert_eq!(
            err,
            CodecError::TruncatedBase32 {
                offset,
                len: offset + 1
            }
        );
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("truncated base32 data at input byte {offset}: ")),
            "{message}"
        );
        assert!(message.contains("0, 2, 4, 5 or 7"), "{message}");
    }

    #[rstest]
    #[case::one_pad("nnsxsoraejwxsx2lmv3secq=")]
    #[case::rfc_style_padding("nnsxsoraejwxsx2lmv3secq=========")]
    fn base32_tolerates_trailing_padding(#[case] padded: &str) {
        assert_eq!(
            decode_base32(padded).expect("padding ignored"),
            b"key: \"my_key\"\n"
        );
    }

    #[test]
    fn empty_base32_is_empty_bytes_and_an_all_default_secret() {
        assert_eq!(encode_base32(b""), "");
        assert_eq!(decode_base32("").expect("empty"), b"");
        assert_eq!(decode_secret("").expect("empty"), Secret::default());
    }

    // --- text format: marshalling ---------------------------------------------------------------

    #[rstest]
    #[case::all_default_is_empty(Secret::default(), "")]
    #[case::fields_in_field_number_order(
        Secret {
            env_var: "E".into(),
            mount_requirement: MountRequirement::File,
            key: "k".into(),
            group_version: "v".into(),
            group: "g".into(),
        },
        "group: \"g\"\ngroup_version: \"v\"\nkey: \"k\"\nmount_requirement: FILE\nenv_var: \"E\"\n",
    )]
    #[case::any_is_omitted(
        Secret { key: "k".into(), mount_requirement: MountRequirement::Any, ..Default::default() },
        "key: \"k\"\n",
    )]
    #[case::env_var_mount_by_name(
        Secret { mount_requirement: MountRequirement::EnvVar, ..Default::default() },
        "mount_requirement: ENV_VAR\n",
    )]
    #[case::unknown_mount_as_number(
        Secret { mount_requirement: MountRequirement::Unknown(7), ..Default::default() },
        "mount_requirement: 7\n",
    )]
    #[case::unknown_holding_a_named_number_uses_the_name(
        Secret { mount_requirement: MountRequirement::Unknown(2), ..Default::default() },
        "mount_requirement: FILE\n",
    )]
    #[case::c_escapes(
        Secret { key: "a\"b\\c\nd\re\tf".into(), ..Default::default() },
        "key: \"a\\\"b\\\\c\\nd\\re\\tf\"\n",
    )]
    #[case::single_quote_is_not_escaped(
        Secret { key: "it's".into(), ..Default::default() },
        "key: \"it's\"\n",
    )]
    #[case::non_ascii_as_octal_bytes(
        Secret { key: "é😀".into(), ..Default::default() },
        "key: \"\\303\\251\\360\\237\\230\\200\"\n",
    )]
    #[case::control_bytes_nul_and_del_as_octal(
        Secret { key: "\0\x07\x1f\x7f".into(), ..Default::default() },
        "key: \"\\000\\007\\037\\177\"\n",
    )]
    fn marshal_text_writes_what_go_writes(#[case] secret: Secret, #[case] want: &str) {
        assert_eq!(marshal_text(&secret), want);
    }

    #[test]
    fn mount_requirement_without_a_name_cannot_be_encoded() {
        let secret = Secret {
            key: "k".into(),
            mount_requirement: MountRequirement::Unknown(7),
            ..Default::default()
        };
        let err = encode_secret(&secret).expect_err("Flyte refuses it");
        assert_eq!(err, CodecError::InvalidMountRequirement(7));
        assert!(err.to_string().starts_with("invalid mount requirement 7: "));
        assert!(encode_annotations(&[Secret::default(), secret]).is_err());
    }

    #[test]
    fn secret_at_flytes_size_limit_encodes_and_one_byte_more_does_not() {
        // `key: "` + key + `"\n` is key + 8 bytes; 163840 text bytes encode to exactly 262144.
        let at_limit = Secret {
            key: "k".repeat(163_832),
            ..Default::default()
        };
        assert_eq!(
            encode_secret(&at_limit).expect("at the limit").len(),
            MAX_ENCODED_LEN
        );

        let over = Secret {
            key: "k".repeat(163_833),
            ..Default::default()
        };
        let err = encode_secret(&over).expect_err("over the limit");
        assert_eq!(err, CodecError::TooLong { len: 262_146 });
        assert_eq!(
            err.to_string(),
            "encoded secret is 262146 bytes; Flyte's limit is 262144"
        );
    }

    // --- text format: parsing -------------------------------------------------------------------

    fn with_key(key: &str) -> Secret {
        Secret {
            key: key.into(),
            ..Default::default()
        }
    }

    fn with_mount(mount_requirement: MountRequirement) -> Secret {
        Secret {
            mount_requirement,
            ..Default::default()
        }
    }

    #[rstest]
    #[case::empty_input(b"", Secret::default())]
    #[case::only_blank_lines(b"\n \t\r\n", Secret::default())]
    #[case::no_space_after_colon(b"key:\"x\"", with_key("x"))]
    #[case::spaces_before_colon(b"key  :  \"x\"", with_key("x"))]
    #[case::trailing_whitespace(b"key: \"x\" \t\r\n\n", with_key("x"))]
    #[case::crlf_and_tabs(b"\tkey:\t\"x\"\r\n", with_key("x"))]
    #[case::single_quote_inside(b"key: \"it's\"", with_key("it's"))]
    #[case::all_fields_on_one_line_in_any_order(
        b"env_var: \"E\" key: \"k\" group:\"g\"group_version: \"v\" mount_requirement: FILE",
        Secret {
            group: "g".into(),
            group_version: "v".into(),
            key: "k".into(),
            mount_requirement: MountRequirement::File,
            env_var: "E".into(),
        },
    )]
    #[case::explicit_empty_string(b"key: \"\"", Secret::default())]
    #[case::the_escapes_flyte_writes(b"key: \"\\n\\r\\t\\\"\\\\\"", with_key("\n\r\t\"\\"))]
    #[case::octal_escapes(b"key: \"\\101\\000\\177\"", with_key("A\0\x7f"))]
    #[case::octal_bytes_spelling_utf8(b"key: \"\\303\\251\"", with_key("é"))]
    #[case::raw_utf8(b"key: \"\xc3\xa9\"", with_key("é"))]
    #[case::raw_invalid_utf8_without_escapes(b"key: \"a\xffb\"", with_key("a\u{fffd}b"))]
    #[case::invalid_utf8_from_escapes(b"key: \"\\377\\376\"", with_key("\u{fffd}\u{fffd}"))]
    #[case::raw_control_bytes(b"key: \"\x00\x01\x7f\"", with_key("\0\x01\x7f"))]
    #[case::mount_by_name(b"mount_requirement: ENV_VAR", with_mount(MountRequirement::EnvVar))]
    #[case::mount_zero_is_any(b"mount_requirement: 0", with_mount(MountRequirement::Any))]
    #[case::mount_by_number(b"mount_requirement: 1", with_mount(MountRequirement::EnvVar))]
    #[case::mount_unknown_number(b"mount_requirement: 7", with_mount(MountRequirement::Unknown(7)))]
    #[case::mount_ten(b"mount_requirement: 10", with_mount(MountRequirement::Unknown(10)))]
    #[case::mount_negative(b"mount_requirement: -3", with_mount(MountRequirement::Unknown(-3)))]
    #[case::mount_int32_max(
        b"mount_requirement: 2147483647",
        with_mount(MountRequirement::Unknown(i32::MAX))
    )]
    #[case::mount_int32_min(
        b"mount_requirement: -2147483648",
        with_mount(MountRequirement::Unknown(i32::MIN))
    )]
    fn text_forms_flyte_writes_or_tolerates_parse_as_go_parses_them(
        #[case] text: &[u8],
        #[case] want: Secret,
    ) {
        assert_eq!(unmarshal_text(text).expect("parses"), want);
    }

    /// Go's parser takes these, and Flyte never writes them; each is refused with a message that
    /// says what Flyte writes instead.
    #[rstest]
    #[case::comment(b"# a note\nkey: \"x\"", "unexpected byte 0x23 ('#'); Flyte writes")]
    #[case::semicolon_after_a_field(b"key: \"x\";", "unexpected byte 0x3b (';')")]
    #[case::comma_after_a_field(b"key: \"x\",", "unexpected byte 0x2c (',')")]
    #[case::single_quotes(b"key: 'x'", "unexpected byte 0x27 (''')")]
    #[case::adjacent_literals(b"key: \"a\" \"b\"", "expected a field name, found a string literal")]
    #[case::braces(b"{ key: \"a\" }", "unexpected byte 0x7b ('{')")]
    #[case::extension_syntax(b"[ext.field]: 1", "do not exist in flyteidl.core.Secret")]
    #[case::list_value(b"key: [\"a\"]", "unexpected byte 0x5b ('[')")]
    #[case::bell_escape(
        b"key: \"\\a\"",
        "unknown escape \\a in a string literal; Flyte writes only"
    )]
    #[case::question_escape(b"key: \"\\?\"", "unknown escape \\?")]
    #[case::single_quote_escape(b"key: \"\\'\"", "unknown escape \\'")]
    #[case::hex_escape(b"key: \"\\x41\"", "unknown escape \\x")]
    #[case::unicode_escape(b"key: \"\\u00e9\"", "unknown escape \\u")]
    #[case::long_unicode_escape(b"key: \"\\U0001F600\"", "unknown escape \\U")]
    #[case::hex_number(b"mount_requirement: 0x2", "found \"0x2\"")]
    #[case::octal_number(b"mount_requirement: 010", "found \"010\" (a number is decimal")]
    #[case::octal_prefix(b"mount_requirement: 0o7", "found \"0o7\"")]
    #[case::binary_number(b"mount_requirement: 0b1", "found \"0b1\"")]
    #[case::underscore_in_a_number(b"mount_requirement: 1_0", "found \"1_0\"")]
    #[case::plus_sign(b"mount_requirement: +1", "found \"+1\"")]
    fn go_text_syntax_flyte_never_writes_is_refused(#[case] text: &[u8], #[case] needle: &str) {
        let message = unmarshal_text(text)
            .expect_err("not Flyte's text")
            .to_string();
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    }

    #[rstest]
    #[case::unknown_field(
        b"colour: \"red\"",
        1,
        "unknown field \"colour\" in flyteidl.core.Secret"
    )]
    #[case::unknown_field_on_line_two(
        b"key: \"a\"\ncolour: \"red\"",
        2,
        "unknown field \"colour\" in flyteidl.core.Secret"
    )]
    #[case::field_names_are_case_sensitive(b"Key: \"a\"", 1, "unknown field \"Key\"")]
    #[case::string_as_field_name(
        b"\"key\": \"a\"",
        1,
        "expected a field name, found a string literal"
    )]
    #[case::colon_as_field_name(b"key: \"a\" : \"b\"", 1, "expected a field name, found ':'")]
    #[case::number_as_field_name(b"7: \"a\"", 1, "unknown field \"7\"")]
    #[case::repeated_field(b"key: \"a\"\nkey: \"b\"", 2, "field \"key\" is set twice")]
    #[case::repeated_even_when_first_is_empty(
        b"key: \"\" key: \"b\"",
        1,
        "field \"key\" is set twice"
    )]
    #[case::missing_colon(
        b"key \"a\"",
        1,
        "expected ':' after field \"key\", found a string literal"
    )]
    #[case::missing_colon_at_end(
        b"group",
        1,
        "expected ':' after field \"group\", found end of input"
    )]
    #[case::missing_value(
        b"key:",
        1,
        "invalid value for field \"key\": expected a double-quoted string, found end of input"
    )]
    #[case::missing_value_reported_on_last_token_line(
        b"key:\n\n",
        1,
        "expected a double-quoted string, found end of input"
    )]
    #[case::unquoted_string(
        b"key: abc",
        1,
        "invalid value for field \"key\": expected a double-quoted string, found \"abc\""
    )]
    #[case::colon_as_value(b"env_var: :", 1, "expected a double-quoted string, found ':'")]
    #[case::unterminated_string(b"key: \"abc", 1, "unterminated string literal")]
    #[case::string_broken_by_newline(
        b"group: \"g\"\nkey: \"ab\ncd\"",
        2,
        "unterminated string literal"
    )]
    #[case::backslash_at_end(b"key: \"abc\\", 1, "unterminated string literal")]
    #[case::unknown_escape(b"key: \"\\q\"", 1, "unknown escape \\q in a string literal")]
    #[case::escaped_newline(b"key: \"a\\\nb\"", 1, "unknown escape \\\n")]
    #[case::escaped_non_ascii(b"key: \"\\\xc3\xa9\"", 1, "unknown escape \\é")]
    #[case::single_octal_digit(
        b"key: \"\\1\"",
        1,
        "invalid octal escape \\1: an octal escape is exactly three digits"
    )]
    #[case::two_octal_digits_then_letter(b"key: \"\\12a\"", 1, "invalid octal escape \\12a")]
    #[case::octal_above_377(b"key: \"\\400\"", 1, "invalid octal escape \\400")]
    #[case::invalid_utf8_with_escapes(
        b"key: \"\xff\\n\"",
        1,
        "invalid UTF-8 in a string literal with escapes"
    )]
    #[case::unknown_mount_name(
        b"mount_requirement: SOMETIMES",
        1,
        "invalid value for field \"mount_requirement\": expected ANY, ENV_VAR, FILE or a 32-bit integer, found \"SOMETIMES\" (a number is decimal: 7, -3, no leading zero)"
    )]
    #[case::mount_names_are_case_sensitive(b"mount_requirement: file", 1, "found \"file\"")]
    #[case::quoted_mount_name(b"mount_requirement: \"FILE\"", 1, "found a string literal")]
    #[case::mount_above_int32(b"mount_requirement: 2147483648", 1, "found \"2147483648\"")]
    #[case::mount_below_int32(b"mount_requirement: -2147483649", 1, "found \"-2147483649\"")]
    #[case::mount_lone_minus(b"mount_requirement: -", 1, "found \"-\"")]
    #[case::mount_octal_with_nine(b"mount_requirement: 09", 1, "found \"09\"")]
    #[case::missing_mount_value(
        b"mount_requirement:",
        1,
        "expected ANY, ENV_VAR, FILE or a 32-bit integer, found end of input"
    )]
    #[case::unexpected_byte(b"key: \"a\"\n@", 2, "unexpected byte 0x40 ('@')")]
    #[case::unexpected_non_ascii_byte(b"\xc3\xa9", 1, "unexpected byte 0xc3;")]
    fn text_errors_name_the_line_and_the_problem(
        #[case] text: &[u8],
        #[case] line: usize,
        #[case] needle: &str,
    ) {
        let err = unmarshal_text(text).expect_err("malformed text");
        assert!(
            matches!(err, CodecError::Text { line: l, .. } if l == line),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.starts_with(&format!("line {line}: ")), "{message}");
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    }

    #[test]
    fn long_garbage_is_truncated_in_messages() {
        let text = format!("{}: \"x\"", "a".repeat(1000));
        let message = unmarshal_text(text.as_bytes())
            .expect_err("unknown field")
            .to_string();
        assert!(message.len() < 200, "{message}");
    }

    // --- annotations ----------------------------------------------------------------------------

    fn encoded(key: &str) -> String {
        encode_secret(&with_key(key)).expect("encodes")
    }

    #[test]
    fn annotations_are_numbered_from_zero_in_slice_order() {
        let secrets = [with_key("a"), with_key("b")];
        let annotations = encode_annotations(&secrets).expect("encodes");
        assert_eq!(
            annotations,
            annotation_map(&[
                ("flyte.secrets/s0", &encoded("a")),
                ("flyte.secrets/s1", &encoded("b")),
            ])
        );
    }

    #[test]
    fn decoded_annotations_follow_numeric_index_so_s10_comes_after_s2() {
        let annotations = annotation_map(&[
            ("flyte.secrets/s10", &encoded("ten")),
            ("flyte.secrets/s2", &encoded("two")),
            ("flyte.secrets/s0", &encoded("zero")),
        ]);
        let decoded = decode_annotations(&annotations).expect("decodes");
        assert_eq!(
            decoded,
            vec![
                SecretAnnotation {
                    index: 0,
                    annotation: "flyte.secrets/s0".into(),
                    secret: with_key("zero"),
                },
                SecretAnnotation {
                    index: 2,
                    annotation: "flyte.secrets/s2".into(),
                    secret: with_key("two"),
                },
                SecretAnnotation {
                    index: 10,
                    annotation: "flyte.secrets/s10".into(),
                    secret: with_key("ten"),
                },
            ]
        );
    }

    #[test]
    fn annotations_without_the_prefix_are_ignored() {
        let annotations = annotation_map(&[
            ("flyte.secrets/s0", &encoded("mine")),
            ("flyte.secrets/other", "not base32!"),
            ("example.com/flyte.secrets/s1", "not base32!"),
            ("inject-flyte-secrets", "true"),
            ("FLYTE.SECRETS/S1", "not base32!"),
        ]);
        assert_eq!(decoded_secrets(&annotations), vec![with_key("mine")]);
    }

    #[test]
    fn no_secret_annotations_decode_to_no_requests() {
        let annotations = annotation_map(&[("app", "x")]);
        assert_eq!(decode_annotations(&annotations), Ok(vec![]));
    }

    #[test]
    fn largest_u32_index_is_accepted() {
        let annotations = annotation_map(&[("flyte.secrets/s4294967295", &encoded("k"))]);
        let decoded = decode_annotations(&annotations).expect("decodes");
        assert_eq!(decoded[0].index, u32::MAX);
    }

    #[rstest]
    #[case::empty_suffix("flyte.secrets/s")]
    #[case::leading_zero("flyte.secrets/s01")]
    #[case::letters("flyte.secrets/sx")]
    #[case::word_sharing_the_prefix("flyte.secrets/sidecar")]
    #[case::sign("flyte.secrets/s+1")]
    #[case::trailing_letter("flyte.secrets/s1a")]
    #[case::above_u32("flyte.secrets/s4294967296")]
    #[case::non_ascii_digit("flyte.secrets/s١")]
    fn annotation_key_without_a_decimal_index_is_an_error_naming_it(#[case] key: &str) {
        let annotations =
            annotation_map(&[("flyte.secrets/s0", &encoded("ok")), (key, &encoded("k"))]);
        let err = decode_annotations(&annotations).expect_err("bad key");
        assert_eq!(
            err,
            AnnotationError {
                annotation: key.into(),
                cause: AnnotationProblem::NotAnIndex,
            }
        );
        assert!(
            err.to_string().starts_with(&format!(
                "annotation {key:?}: expected flyte.secrets/s<N> with N a decimal index"
            )),
            "{err}"
        );
    }

    #[test]
    fn bad_annotation_value_is_an_error_naming_the_key_and_the_byte() {
        let annotations = annotation_map(&[
            ("flyte.secrets/s0", &encoded("ok")),
            ("flyte.secrets/s1", "nns9"),
        ]);
        let err = decode_annotations(&annotations).expect_err("bad value");
        assert_eq!(
            err.to_string(),
            "annotation \"flyte.secrets/s1\": illegal base32 data at input byte 3 ('9'): \
             Flyte's alphabet is a-z and 1-6"
        );
    }

    #[test]
    fn bad_text_inside_an_annotation_is_an_error_naming_the_key_and_the_line() {
        let value = encode_base32(b"key: \"a\"\ncolour: \"red\"\n");
        let annotations = annotation_map(&[("flyte.secrets/s0", &value)]);
        let err = decode_annotations(&annotations).expect_err("unknown field");
        assert!(
            err.to_string()
                .starts_with("annotation \"flyte.secrets/s0\": line 2: unknown field \"colour\""),
            "{err}"
        );
    }

    #[test]
    fn lowest_index_bad_value_is_reported_whatever_the_iteration_order() {
        let keys = [
            "flyte.secrets/s10".to_owned(),
            "flyte.secrets/s3".to_owned(),
            "flyte.secrets/s1".to_owned(),
        ];
        let good = encoded("ok");
        let bad = "9".to_owned();
        let forward = [(&keys[0], &bad), (&keys[1], &bad), (&keys[2], &good)];
        let mut backward = forward;
        backward.reverse();
        for order in [forward, backward] {
            let err = decode_annotations(order).expect_err("bad values");
            assert_eq!(err.annotation, "flyte.secrets/s3");
        }
    }

    #[test]
    fn malformed_key_is_reported_before_any_bad_value() {
        let annotations = annotation_map(&[
            ("flyte.secrets/s0", "9"),
            ("flyte.secrets/sz", &encoded("k")),
            ("flyte.secrets/sy", &encoded("k")),
        ]);
        let err = decode_annotations(&annotations).expect_err("bad key");
        assert_eq!(err.annotation, "flyte.secrets/sy");
        assert_eq!(err.cause, AnnotationProblem::NotAnIndex);
    }

    #[test]
    fn same_key_twice_from_a_non_map_iterator_is_an_error() {
        let key = "flyte.secrets/s0".to_owned();
        let value = encoded("k");
        let err = decode_annotations([(&key, &value), (&key, &value)]).expect_err("repeated");
        assert_eq!(
            err.to_string(),
            "annotation \"flyte.secrets/s0\": given more than once"
        );
    }

    // --- properties -----------------------------------------------------------------------------

    /// Strings rich in what the text format must escape: quotes, backslashes, control bytes, NUL,
    /// newlines and non-ASCII.
    fn tricky_string() -> impl Strategy<Value = String> {
        let tricky_char = prop_oneof![
            4 => any::<char>(),
            2 => prop::char::range(' ', '~'),
            1 => prop::sample::select(vec!['"', '\'', '\\', '\n', '\r', '\t', '\0', '\x7f', 'é', '😀']),
            1 => prop::char::range('\0', '\x1f'),
        ];
        prop::collection::vec(tricky_char, 0..24).prop_map(String::from_iter)
    }

    fn known_mount_requirement() -> impl Strategy<Value = MountRequirement> {
        prop_oneof![
            Just(MountRequirement::Any),
            Just(MountRequirement::EnvVar),
            Just(MountRequirement::File),
        ]
    }

    fn any_secret() -> impl Strategy<Value = Secret> {
        (
            tricky_string(),
            tricky_string(),
            tricky_string(),
            known_mount_requirement(),
            tricky_string(),
        )
            .prop_map(
                |(group, group_version, key, mount_requirement, env_var)| Secret {
                    group,
                    group_version,
                    key,
                    mount_requirement,
                    env_var,
                },
            )
    }

    /// Tokens and fragments that steer random text into the parser's corners.
    fn text_soup() -> impl Strategy<Value = Vec<u8>> {
        let fragment = prop_oneof![
            prop::sample::select(vec![
                "key",
                "group",
                "group_version",
                "env_var",
                "mount_requirement",
                "colour",
                ":",
                ";",
                ",",
                "[",
                "]",
                "{",
                "\"",
                "'",
                "\\",
                "\\x",
                "\\u",
                "\\U",
                "\\0",
                "\\377",
                "\\n",
                " ",
                "\n",
                "#",
                "FILE",
                "ENV_VAR",
                "7",
                "-",
                "0x",
                "_",
                "1_0",
                "\"a\"",
                "'b'",
                "\u{e9}",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
            prop::collection::vec(any::<u8>(), 1..3),
        ];
        prop::collection::vec(fragment, 0..24).prop_map(|parts| parts.concat())
    }

    proptest! {
        #[test]
        fn any_secret_round_trips_through_its_annotation_value(secret in any_secret()) {
            let value = encode_secret(&secret)?;
            prop_assert_eq!(decode_secret(&value)?, secret);
        }

        #[test]
        fn any_marshalled_text_parses_back_whatever_the_mount_number(
            secret in any_secret(),
            mount in any::<i32>(),
        ) {
            let secret = Secret { mount_requirement: MountRequirement::from_number(mount), ..secret };
            prop_assert_eq!(unmarshal_text(marshal_text(&secret).as_bytes())?, secret);
        }

        #[test]
        fn marshalled_text_is_printable_ascii_lines(secret in any_secret()) {
            let text = marshal_text(&secret);
            prop_assert!(text.bytes().all(|b| b == b'\n' || (0x20..0x7f).contains(&b)), "{}", text);
            prop_assert!(text.is_empty() || text.ends_with('\n'));
        }

        #[test]
        fn base32_round_trips_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let encoded = encode_base32(&bytes);
            prop_assert_eq!(encoded.len(), (bytes.len() * 8).div_ceil(5));
            prop_assert!(encoded.bytes().all(|b| ALPHABET.contains(&b)));
            prop_assert_eq!(decode_base32(&encoded)?, bytes);
        }

        #[test]
        fn decode_secret_never_panics_on_arbitrary_strings(value in any::<String>()) {
            let _ = decode_secret(&value);
        }

        #[test]
        fn decode_secret_never_panics_on_strings_of_flytes_alphabet(
            value in prop::collection::vec(prop::sample::select(b"abcdefghijklmnopqrstuvwxyz123456=".to_vec()), 0..64)
        ) {
            let value = String::from_utf8(value)?;
            let _ = decode_secret(&value);
        }

        #[test]
        fn unmarshal_text_never_panics_on_arbitrary_bytes(text in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = unmarshal_text(&text);
        }

        #[test]
        fn unmarshal_text_never_panics_on_token_soup(text in text_soup()) {
            let _ = unmarshal_text(&text);
        }
    }
}
