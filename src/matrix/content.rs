//! The rules an event's content must pass before it is sent, so that a message
//! the homeserver would refuse is refused here with a clear error instead: the
//! content is a JSON object (with the string `msgtype` and `body` of an
//! `m.room.message`); it holds no float and no integer outside
//! ±(2^53−1) (Matrix canonical JSON, which Synapse enforces with
//! `400 M_BAD_JSON`); and its canonical encoding stays under [`CONTENT_CAP`],
//! which leaves room for the envelope (ids, hashes, signatures) inside the
//! specification's 65 536-byte cap on the whole event.

use serde_json::Value;

/// The specification's cap on a whole event, in bytes of canonical JSON.
pub const EVENT_CAP: usize = 65_536;

/// The cap on the content alone. The envelope the homeserver adds (event and
/// room ids, `prev_events`, `auth_events`, hashes, the signature, the sender)
/// is well under 2 KiB for a room with few forward extremities; 4 KiB of
/// margin keeps a content that passes here from being refused there.
pub const CONTENT_CAP: usize = EVENT_CAP - 4096;

/// The largest integer canonical JSON allows (2^53−1); its negation is the
/// smallest.
pub const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// Checks `content`; returns its size in bytes of canonical JSON, or what is
/// wrong with it and what to do.
pub fn check(content: &Value) -> Result<usize, String> {
    if !content.is_object() {
        return Err(format!(
            "the event content must be a JSON object, not {}",
            type_name(content)
        ));
    }
    check_value(content, &mut String::from("content"))?;
    // serde_json escapes exactly what canonical JSON escapes (`"`, `\` and
    // control characters, with the same short forms) and writes no spaces, so
    // the length is the canonical length; key order does not change it.
    let size = serde_json::to_vec(content)
        .map_err(|e| format!("the event content cannot be encoded: {e}"))?
        .len();
    if size > CONTENT_CAP {
        return Err(format!(
            "the event content is {size} bytes of canonical JSON, over the {CONTENT_CAP}-byte \
             cap (a Matrix event is at most {EVENT_CAP} bytes, envelope included): \
             send a shorter message"
        ));
    }
    Ok(size)
}

/// Checks the content of an `m.room.message` event: [`check`], and the
/// string `msgtype` and `body` a homeserver requires of one (Synapse answers
/// `400` without them).
pub fn check_message(content: &Value) -> Result<usize, String> {
    let size = check(content)?;
    for key in ["msgtype", "body"] {
        if !content.get(key).is_some_and(Value::is_string) {
            return Err(format!(
                "an m.room.message needs a string {key:?} in its content (e.g. \
                 \"msgtype\": \"m.text\", \"body\": the readable text)"
            ));
        }
    }
    Ok(size)
}

fn check_value(value: &Value, path: &mut String) -> Result<(), String> {
    match value {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                if !(-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(&i) {
                    return Err(out_of_range(path, n));
                }
            } else if n.is_u64() {
                return Err(out_of_range(path, n));
            } else {
                return Err(format!(
                    "{path} is the float {n}: Matrix canonical JSON allows no floats; \
                     send the number as a string"
                ));
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                check_value(item, path)?;
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let len = path.len();
                path.push('[');
                path.push_str(&Value::from(key.as_str()).to_string());
                path.push(']');
                check_value(item, path)?;
                path.truncate(len);
            }
        }
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
    Ok(())
}

fn out_of_range(path: &str, n: &serde_json::Number) -> String {
    format!(
        "{path} is the integer {n}, outside ±{MAX_SAFE_INTEGER} (2^53−1) that Matrix canonical \
         JSON allows; send the number as a string"
    )
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_content_passes_and_reports_its_size() {
        // The content the reference saw come back unchanged.
        let content: Value = serde_json::from_str(
            r#"{"msgtype":"m.text","body":"hello from hive A","hive.from":"hive-a",
                "hive.to":"hive-b","hive.msg_id":"m-0001",
                "hive.payload":{"list":[1,-2,null,true,"\u0000é"],"max":9007199254740991,
                                "min":-9007199254740991}}"#,
        )
        .unwrap();
        let size = check(&content).unwrap();
        let canonical = r#"{"body":"hello from hive A","hive.from":"hive-a","hive.msg_id":"m-0001","hive.payload":{"list":[1,-2,null,true,"\u0000é"],"max":9007199254740991,"min":-9007199254740991},"hive.to":"hive-b","msgtype":"m.text"}"#;
        assert_eq!(size, canonical.len());
    }

    #[test]
    fn floats_and_big_integers_are_refused_with_their_place() {
        let cases = [
            (json!({"a": 1.5}), r#"content["a"] is the float 1.5"#),
            (json!({"a": 1.0}), r#"content["a"] is the float 1.0"#),
            (
                json!({"hive.payload": {"x": [0, 9007199254740992u64]}}),
                r#"content["hive.payload"]["x"][1] is the integer 9007199254740992"#,
            ),
            (
                json!({"n": -9007199254740992i64}),
                r#"content["n"] is the integer -9007199254740992"#,
            ),
            (
                json!({"n": u64::MAX}),
                r#"content["n"] is the integer 18446744073709551615"#,
            ),
            (json!("text"), "must be a JSON object, not a string"),
            (json!([1]), "must be a JSON object, not an array"),
        ];
        for (content, want) in cases {
            let err = check(&content).unwrap_err();
            assert!(err.contains(want), "{content}: {err}");
        }
        let err = check(&json!({"a": 0.25})).unwrap_err();
        assert!(err.contains("send the number as a string"), "{err}");
    }

    #[test]
    fn a_message_needs_a_string_msgtype_and_body() {
        assert!(check_message(&json!({"msgtype": "m.text", "body": "hi"})).is_ok());
        for content in [
            json!({"body": "hi"}),
            json!({"msgtype": "m.text"}),
            json!({"msgtype": "m.text", "body": 7}),
        ] {
            let err = check_message(&content).unwrap_err();
            assert!(
                err.contains("an m.room.message needs a string"),
                "{content}: {err}"
            );
        }
        // The canonical JSON rules come first.
        let err = check_message(&json!({"body": 0.5})).unwrap_err();
        assert!(err.contains("float"), "{err}");
    }

    #[test]
    fn the_size_cap_counts_escapes_and_utf8_bytes() {
        // `{"body":"…"}` is 11 bytes around the text.
        let fits = json!({ "body": "x".repeat(CONTENT_CAP - 11) });
        assert_eq!(check(&fits).unwrap(), CONTENT_CAP);
        let over = json!({ "body": "x".repeat(CONTENT_CAP - 10) });
        let err = check(&over).unwrap_err();
        assert!(err.contains(&format!("{} bytes", CONTENT_CAP + 1)), "{err}");
        assert!(err.contains("send a shorter message"), "{err}");
        // A control character takes six bytes escaped, "é" two in UTF-8.
        let escaped = json!({ "body": "\u{1}".repeat(CONTENT_CAP / 6) });
        assert!(check(&escaped).is_err());
        let accents = json!({ "body": "é".repeat(CONTENT_CAP / 2) });
        assert!(check(&accents).is_err());
        assert_eq!(
            check(&json!({"b": "\u{1}é\n"})).unwrap(),
            r#"{"b":"\u0001é\n"}"#.len()
        );
    }
}
