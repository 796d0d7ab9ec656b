//! Text helpers every process formats the same way: how an error echoes an
//! input ([`excerpt`]), which characters may not reach a terminal
//! ([`is_control_or_bidi`]), which are invisible format characters
//! ([`is_format`], Unicode's `Cf`), the first characters of a long text
//! ([`preview`]) and times as people read and write them ([`fmt_time`],
//! [`parse_time`]).

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

/// The general category `Cf` (format characters) of Unicode 16.0.0, as
/// ranges, first to last, from its `DerivedGeneralCategory.txt`: soft
/// hyphen, Arabic and Syriac number signs, the zero-width space, joiners and
/// marks, the bidi embeddings, overrides and isolates, the word joiner and
/// invisible operators, the byte order mark, interlinear annotations,
/// Kaithi, Egyptian hieroglyph, shorthand and musical format controls, and
/// the tags. Most are invisible: a name holding one can pass for another
/// (`op\u{200b}erator` reads as `operator`).
pub const FORMAT_CHARS: [(char, char); 21] = [
    ('\u{ad}', '\u{ad}'),
    ('\u{600}', '\u{605}'),
    ('\u{61c}', '\u{61c}'),
    ('\u{6dd}', '\u{6dd}'),
    ('\u{70f}', '\u{70f}'),
    ('\u{890}', '\u{891}'),
    ('\u{8e2}', '\u{8e2}'),
    ('\u{180e}', '\u{180e}'),
    ('\u{200b}', '\u{200f}'),
    ('\u{202a}', '\u{202e}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206f}'),
    ('\u{feff}', '\u{feff}'),
    ('\u{fff9}', '\u{fffb}'),
    ('\u{110bd}', '\u{110bd}'),
    ('\u{110cd}', '\u{110cd}'),
    ('\u{13430}', '\u{1343f}'),
    ('\u{1bca0}', '\u{1bca3}'),
    ('\u{1d173}', '\u{1d17a}'),
    ('\u{e0001}', '\u{e0001}'),
    ('\u{e0020}', '\u{e007f}'),
];

/// True for a format character ([`FORMAT_CHARS`], Unicode 16.0.0's `Cf`).
pub fn is_format(c: char) -> bool {
    FORMAT_CHARS
        .binary_search_by(|&(first, last)| {
            if last < c {
                std::cmp::Ordering::Less
            } else if first > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// The first `max` characters of `s`, with `…` when cut: for texts the reader
/// can read in full elsewhere.
pub fn preview(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

/// "HH:MM UTC (in 2h 13m)" for a time ahead.
pub fn clock(until: i64, now: i64) -> String {
    let day = until.rem_euclid(86_400);
    let left = (until - now).max(0);
    let span = if left >= 3600 {
        format!("{}h {}m", left / 3600, left % 3600 / 60)
    } else if left >= 60 {
        format!("{}m", left / 60)
    } else {
        format!("{left}s")
    };
    format!("{:02}:{:02} UTC (in {span})", day / 3600, day % 3600 / 60)
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

/// Days from 1970-01-01 to a civil date (the inverse of [`fmt_time`]'s).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// An RFC 3339 time (`2026-11-22T05:03:02Z`, `2026-11-22T07:03:02.5+02:00`;
/// a space for the `T` too) as unix seconds, or None when it is not one.
pub fn parse_time(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let month_days = [
        31,
        28 + i64::from(y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)),
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&mo) || d < 1 || d > month_days[(mo - 1) as usize] {
        return None;
    }
    if h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let rb = rest.as_bytes();
            if rb.len() != 6 || !matches!(rb[0], b'+' | b'-') || rb[3] != b':' {
                return None;
            }
            let oh: i64 = rest[1..3].parse().ok()?;
            let om: i64 = rest[4..6].parse().ok()?;
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if rb[0] == b'-' {
                -o
            } else {
                o
            }
        }
    };
    Some(days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec.min(59) - offset)
}

#[cfg(test)]
mod tests {
    #[test]
    fn clock_reads_as_a_time_and_a_span() {
        let now = 1_795_300_000;
        assert_eq!(
            clock(now + 2 * 3600 + 13 * 60, now),
            "00:39 UTC (in 2h 13m)"
        );
        assert_eq!(clock(now + 90, now), "22:28 UTC (in 1m)");
        assert_eq!(clock(now + 5, now), "22:26 UTC (in 5s)");
    }

    use super::*;

    /// The table is Unicode 16.0.0's `Cf`: sorted and apart; the members
    /// names are refused for (among them every bidi mark of
    /// `is_control_or_bidi`, and what Unicode 15.0 added to the Egyptian
    /// controls), and their neighbours, which are not format characters.
    #[test]
    fn format_characters_are_unicode_16s_cf() {
        for w in FORMAT_CHARS.windows(2) {
            assert!(w[0].0 <= w[0].1 && w[0].1 < w[1].0, "{w:?}");
        }
        let count: u32 = FORMAT_CHARS
            .iter()
            .map(|&(a, b)| b as u32 - a as u32 + 1)
            .sum();
        assert_eq!(count, 170, "Unicode 16.0.0 has 170 Cf code points");
        for c in [
            '\u{ad}',
            '\u{600}',
            '\u{605}',
            '\u{61c}',
            '\u{890}',
            '\u{180e}',
            '\u{200b}',
            '\u{200c}',
            '\u{200d}',
            '\u{200e}',
            '\u{200f}',
            '\u{202a}',
            '\u{202e}',
            '\u{2060}',
            '\u{2064}',
            '\u{2066}',
            '\u{2069}',
            '\u{206f}',
            '\u{feff}',
            '\u{fffb}',
            '\u{13439}',
            '\u{1343f}',
            '\u{1d173}',
            '\u{e0001}',
            '\u{e0041}',
            '\u{e007f}',
        ] {
            assert!(is_format(c), "{c:?}");
        }
        for c in [
            'a',
            ' ',
            '\u{ac}',
            '\u{ae}',
            '\u{5ff}',
            '\u{606}',
            '\u{200a}',
            '\u{2010}',
            '\u{2065}',
            '\u{fffc}',
            '\u{13440}',
            '\u{e0000}',
            '\u{e0002}',
            '\u{e0080}',
            '\u{10ffff}',
        ] {
            assert!(!is_format(c), "{c:?}");
        }
        for c in ['\u{61c}', '\u{200e}', '\u{202a}', '\u{2066}', '\u{2069}'] {
            assert!(is_control_or_bidi(c) && is_format(c), "{c:?}");
        }
    }

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

    #[test]
    fn rfc3339_times_read_back() {
        for (text, unix) in [
            ("1970-01-01T00:00:00Z", 0),
            ("2026-11-22T05:03:02Z", 1_795_323_782),
            ("2026-11-22 05:03:02z", 1_795_323_782),
            ("2026-11-22T07:03:02.250+02:00", 1_795_323_782),
            ("2026-11-21T23:03:02-06:00", 1_795_323_782),
            ("2024-02-29T12:00:00Z", 1_709_208_000),
        ] {
            assert_eq!(parse_time(text), Some(unix), "{text}");
        }
        for bad in [
            "",
            "2026-11-22",
            "2026-11-22T05:03:02",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-11-22T24:00:00Z",
            "2026-11-22T05:03:02+2:00",
            "2026-11-22T05:03:02.Z",
            "2026-11-22T05:03:02Zjunk",
            "+026-11-22T05:03:02Z",
        ] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }
}
