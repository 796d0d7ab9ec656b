//! Argument checks for tool handlers. Each helper reads one member of a call's
//! `arguments` object and either returns it typed or returns
//! [`ToolOutcome::InvalidParams`] with a message naming the argument and what it
//! should be, which the server sends as a JSON-RPC -32602 error. An explicit
//! `null` counts as absent. Handlers use them with `?` in a function returning
//! `Result<ToolOutcome, ToolOutcome>`.

use super::ToolOutcome;
use serde_json::Value;

/// The result of every helper.
pub type ArgResult<T> = Result<T, ToolOutcome>;

fn present<'a>(args: &'a Value, key: &str) -> Option<&'a Value> {
    args.get(key).filter(|v| !v.is_null())
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

fn wrong(key: &str, want: &str, got: &Value) -> ToolOutcome {
    ToolOutcome::InvalidParams(format!(
        "argument \"{key}\" must be {want}, got {}",
        type_name(got)
    ))
}

fn missing(key: &str, want: &str) -> ToolOutcome {
    ToolOutcome::InvalidParams(format!("missing required argument \"{key}\" ({want})"))
}

fn opt<T>(
    args: &Value,
    key: &str,
    want: &str,
    read: impl FnOnce(&Value) -> Option<T>,
) -> ArgResult<Option<T>> {
    match present(args, key) {
        None => Ok(None),
        Some(v) => read(v).map(Some).ok_or_else(|| wrong(key, want, v)),
    }
}

const STR: &str = "a string";
const U64: &str = "a non-negative integer";
const I64: &str = "an integer";
const BOOL: &str = "a boolean";
const STR_LIST: &str = "an array of strings";

/// An optional string.
pub fn opt_str(args: &Value, key: &str) -> ArgResult<Option<String>> {
    opt(args, key, STR, |v| v.as_str().map(str::to_string))
}

/// A required string.
pub fn req_str(args: &Value, key: &str) -> ArgResult<String> {
    opt_str(args, key)?.ok_or_else(|| missing(key, STR))
}

/// An optional non-negative integer.
pub fn opt_u64(args: &Value, key: &str) -> ArgResult<Option<u64>> {
    opt(args, key, U64, Value::as_u64)
}

/// A required non-negative integer.
pub fn req_u64(args: &Value, key: &str) -> ArgResult<u64> {
    opt_u64(args, key)?.ok_or_else(|| missing(key, U64))
}

/// An optional integer.
pub fn opt_i64(args: &Value, key: &str) -> ArgResult<Option<i64>> {
    opt(args, key, I64, Value::as_i64)
}

/// A required integer.
pub fn req_i64(args: &Value, key: &str) -> ArgResult<i64> {
    opt_i64(args, key)?.ok_or_else(|| missing(key, I64))
}

/// An optional boolean.
pub fn opt_bool(args: &Value, key: &str) -> ArgResult<Option<bool>> {
    opt(args, key, BOOL, Value::as_bool)
}

/// An optional array of strings.
pub fn opt_str_list(args: &Value, key: &str) -> ArgResult<Option<Vec<String>>> {
    opt(args, key, STR_LIST, |v| {
        v.as_array()?
            .iter()
            .map(|item| item.as_str().map(str::to_string))
            .collect()
    })
}

/// Refuses any argument not in `known`, so a misspelt optional argument is not
/// silently ignored.
pub fn only(args: &Value, known: &[&str]) -> ArgResult<()> {
    let Some(obj) = args.as_object() else {
        return Ok(());
    };
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(ToolOutcome::InvalidParams(format!(
            "unknown argument \"{k}\"; expected one of: {}",
            known.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg<T: std::fmt::Debug>(r: ArgResult<T>) -> String {
        match r {
            Err(ToolOutcome::InvalidParams(m)) => m,
            other => panic!("expected InvalidParams, got {other:?}"),
        }
    }

    #[test]
    fn present_values_are_read_typed() {
        let a = json!({"to":"bob","n":3,"neg":-2,"b":true,"l":["x","y"],"nil":null});
        assert_eq!(req_str(&a, "to").unwrap(), "bob");
        assert_eq!(opt_str(&a, "nil").unwrap(), None);
        assert_eq!(opt_u64(&a, "n").unwrap(), Some(3));
        assert_eq!(req_u64(&a, "n").unwrap(), 3);
        assert_eq!(opt_u64(&a, "absent").unwrap(), None);
        assert_eq!(req_i64(&a, "neg").unwrap(), -2);
        assert_eq!(opt_i64(&a, "absent").unwrap(), None);
        assert_eq!(opt_bool(&a, "b").unwrap(), Some(true));
        assert_eq!(
            opt_str_list(&a, "l").unwrap(),
            Some(vec!["x".into(), "y".into()])
        );
        assert!(only(&a, &["to", "n", "neg", "b", "l", "nil"]).is_ok());
    }

    #[test]
    fn errors_name_the_argument_and_the_expected_type() {
        let a = json!({"n":-1,"s":5,"l":["x",1],"b":"yes","f":1.5,"nil":null});
        let cases = [
            (
                msg(req_str(&a, "to")),
                "missing required argument \"to\" (a string)",
            ),
            (
                msg(req_str(&a, "nil")),
                "missing required argument \"nil\" (a string)",
            ),
            (
                msg(req_str(&a, "s")),
                "argument \"s\" must be a string, got a number",
            ),
            (
                msg(opt_u64(&a, "n")),
                "argument \"n\" must be a non-negative integer, got a number",
            ),
            (
                msg(req_i64(&a, "f")),
                "argument \"f\" must be an integer, got a number",
            ),
            (
                msg(opt_bool(&a, "b")),
                "argument \"b\" must be a boolean, got a string",
            ),
            (
                msg(opt_str_list(&a, "l")),
                "argument \"l\" must be an array of strings, got an array",
            ),
            (
                msg(only(&a, &["n"])),
                "unknown argument \"b\"; expected one of: n",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }
}
