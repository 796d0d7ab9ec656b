//! Text helpers every process formats the same way: how an error echoes an
//! input ([`excerpt`]), which characters may not reach a terminal
//! ([`is_control_or_bidi`]), the first characters of a long text
//! ([`preview`]) and times as people read them ([`fmt_time`]).

use super::limits::ECHO_CHARS;

/// At most the first [`ECHO_CHARS`] characters of `s`, quoted and escaped, with
/// `…` when cut: how every error echoes its input, so a huge or hostile value
/// never comes back whole.
pub fn excerpt(s: &str) -> String {
    match s.char_indices().nth(ECHO_CHARS) {
        None => format!("{s:?}"),
        Some((i, _)) => format!("{:?}…", &s[..i]),
    }
}

/// True for characters that can rewrite a terminal or reorder the text around
/// them: C0 and C1 controls, DEL, and the Unicode bidi marks, embeddings,
/// overrides and isolates.
pub fn is_control_or_bidi(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// The first `max` characters of `s`, with `…` when cut: for texts the reader
/// can read in full elsewhere.
pub fn preview(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

/// A unix time as `YYYY-MM-DD HH:MM:SSZ` (UTC).
pub fn fmt_time(unix: i64) -> String {
    // UTC, from the civil-from-days algorithm, to avoid a time dependency.
    let days = unix.div_euclid(86400);
    let secs = unix.rem_euclid(86400);
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_are_short_and_times_are_utc() {
        assert_eq!(excerpt("short"), "\"short\"");
        assert_eq!(excerpt(&"é".repeat(100)), format!("{:?}…", "é".repeat(80)));
        assert_eq!(preview("abcdef", 3), "abc…");
        assert_eq!(preview("abc", 3), "abc");
        assert!(is_control_or_bidi('\u{202e}') && is_control_or_bidi('\u{1b}'));
        assert!(!is_control_or_bidi('é'));
        assert_eq!(fmt_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(fmt_time(1_795_323_782), "2026-11-22 05:03:02Z");
    }
}
