//! A tool's arguments, declared once as a list of [`Arg`]s: the JSON Schema
//! `tools/list` shows is built from it ([`schema`]), and a call's `arguments`
//! are checked against it before they become the tool's typed struct
//! ([`decode`]). The check is what names the argument in an error (serde's
//! own messages do not): an unknown argument, a missing one, one of the wrong
//! type, each an `isError` result that names the argument, quotes the value
//! it got and says what is allowed. An explicit `null` counts as absent.
//! Rules beyond the type (not blank, at most so long, exactly one of two) are
//! the command's own `validate`, shared with every other client.

use super::ToolOutcome;
use crate::proto::lines::push_json_str;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

/// The type of one argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Str,
    /// A string the schema says is at most this many characters long (the
    /// command refuses a longer one).
    StrMax(u64),
    /// One of these strings.
    Enum(&'static [&'static str]),
    /// A string; an integer is taken too, as its digits (ids models send as
    /// numbers).
    Id,
    Int,
    /// A non-negative integer; the schema shows the bounds, the command clamps
    /// or refuses beyond them.
    Uint {
        min: u64,
        max: Option<u64>,
    },
    Bool,
    StrList,
}

impl Ty {
    fn wanted(self) -> &'static str {
        match self {
            Ty::Str | Ty::StrMax(_) | Ty::Enum(_) | Ty::Id => "a string",
            Ty::Int => "an integer",
            Ty::Uint { .. } => "a non-negative integer",
            Ty::Bool => "a boolean",
            Ty::StrList => "an array of strings",
        }
    }

    fn schema(self) -> Value {
        match self {
            Ty::Str | Ty::Id => json!({"type": "string"}),
            Ty::StrMax(n) => json!({"type": "string", "maxLength": n}),
            Ty::Enum(values) => json!({"type": "string", "enum": values}),
            Ty::Int => json!({"type": "integer"}),
            Ty::Uint { min, max } => {
                let mut s = json!({"type": "integer", "minimum": min});
                if let Some(m) = max {
                    s["maximum"] = json!(m);
                }
                s
            }
            Ty::Bool => json!({"type": "boolean"}),
            Ty::StrList => json!({"type": "array", "items": {"type": "string"}}),
        }
    }

    /// The value as the typed struct wants it, or None when it has the wrong type.
    fn accept(self, v: Value) -> Result<Value, Value> {
        let ok = match (self, &v) {
            (Ty::Str | Ty::StrMax(_) | Ty::Enum(_) | Ty::Id, Value::String(_)) => true,
            (Ty::Id, Value::Number(n)) if n.is_u64() => return Ok(Value::String(n.to_string())),
            (Ty::Int, Value::Number(n)) => n.is_i64(),
            (Ty::Uint { .. }, Value::Number(n)) => n.is_u64(),
            (Ty::Bool, Value::Bool(_)) => true,
            (Ty::StrList, Value::Array(items)) => items.iter().all(Value::is_string),
            _ => false,
        };
        if ok {
            Ok(v)
        } else {
            Err(v)
        }
    }
}

/// One argument of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arg {
    pub name: &'static str,
    pub ty: Ty,
    pub required: bool,
    /// What the model reads about it.
    pub description: &'static str,
}

impl Arg {
    pub const fn req(name: &'static str, ty: Ty, description: &'static str) -> Arg {
        Arg {
            name,
            ty,
            required: true,
            description,
        }
    }

    pub const fn opt(name: &'static str, ty: Ty, description: &'static str) -> Arg {
        Arg {
            name,
            ty,
            required: false,
            description,
        }
    }
}

/// [`schema`] written straight to JSON text: byte for byte what serializing
/// [`schema`] gives (its keys in order), without building the value. Every
/// agent's `hive mcp` answers `tools/list` from this at start-up.
pub fn write_schema(args: &[Arg], out: &mut String) {
    use std::fmt::Write as _;
    out.push_str(r#"{"additionalProperties":false,"properties":{"#);
    let mut sorted: Vec<&Arg> = args.iter().collect();
    sorted.sort_by_key(|a| a.name);
    sorted.dedup_by_key(|a| a.name);
    for (i, a) in sorted.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_json_str(out, a.name);
        out.push_str(r#":{"description":"#);
        push_json_str(out, a.description);
        match a.ty {
            Ty::Str | Ty::Id => out.push_str(r#","type":"string""#),
            Ty::StrMax(n) => {
                let _ = write!(out, r#","maxLength":{n},"type":"string""#);
            }
            Ty::Enum(values) => {
                out.push_str(r#","enum":["#);
                for (j, v) in values.iter().enumerate() {
                    if j > 0 {
                        out.push(',');
                    }
                    push_json_str(out, v);
                }
                out.push_str(r#"],"type":"string""#);
            }
            Ty::Int => out.push_str(r#","type":"integer""#),
            Ty::Uint { min, max } => {
                if let Some(m) = max {
                    let _ = write!(out, r#","maximum":{m}"#);
                }
                let _ = write!(out, r#","minimum":{min},"type":"integer""#);
            }
            Ty::Bool => out.push_str(r#","type":"boolean""#),
            Ty::StrList => out.push_str(r#","items":{"type":"string"},"type":"array""#),
        }
        out.push('}');
    }
    out.push('}');
    let mut required = args.iter().filter(|a| a.required).peekable();
    if required.peek().is_some() {
        out.push_str(r#","required":["#);
        for (i, a) in required.enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_str(out, a.name);
        }
        out.push(']');
    }
    out.push_str(r#","type":"object"}"#);
}

/// The JSON Schema of `args`: a closed object.
pub fn schema(args: &[Arg]) -> Value {
    let mut props = Map::new();
    for a in args {
        let mut s = a.ty.schema();
        s["description"] = json!(a.description);
        props.insert(a.name.into(), s);
    }
    let required: Vec<&str> = args.iter().filter(|a| a.required).map(|a| a.name).collect();
    let mut s = json!({"type": "object", "properties": props, "additionalProperties": false});
    if !required.is_empty() {
        s["required"] = json!(required);
    }
    s
}

/// A value as an error quotes it: a string quoted and cut, anything else as
/// its JSON, cut.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => crate::proto::text::excerpt(s),
        other => {
            let text = other.to_string();
            match text.char_indices().nth(60) {
                Some((at, _)) => format!("{}…", &text[..at]),
                None => text,
            }
        }
    }
}

/// Checks `value` (a call's `arguments` object) against `args`: returns the
/// object without nulls and with ids as strings, or the error's text.
pub fn check(args: &[Arg], value: Value) -> Result<Value, String> {
    let Value::Object(given) = value else {
        return Err("the arguments must be an object".into());
    };
    if let Some(k) = given
        .keys()
        .find(|k| !args.iter().any(|a| a.name == k.as_str()))
    {
        let known: Vec<&str> = args.iter().map(|a| a.name).collect();
        return Err(format!(
            "unknown argument \"{k}\"; expected one of: {}",
            known.join(", ")
        ));
    }
    let mut given = given;
    let mut out = Map::new();
    for a in args {
        match given.remove(a.name) {
            None | Some(Value::Null) if a.required => {
                return Err(format!(
                    "missing required argument \"{}\" ({})",
                    a.name,
                    a.ty.wanted()
                ))
            }
            None | Some(Value::Null) => {}
            Some(v) => {
                let v = a.ty.accept(v).map_err(|v| {
                    format!(
                        "argument \"{}\" must be {}, got {}",
                        a.name,
                        a.ty.wanted(),
                        shown(&v)
                    )
                })?;
                if let (Ty::Enum(values), Value::String(s)) = (a.ty, &v) {
                    if !values.contains(&s.as_str()) {
                        return Err(format!(
                            "argument \"{}\" must be one of {}, got {}",
                            a.name,
                            values.join(", "),
                            crate::proto::text::excerpt(s)
                        ));
                    }
                }
                out.insert(a.name.into(), v);
            }
        }
    }
    Ok(Value::Object(out))
}

/// The arguments as the tool's struct `T`, checked against `args` first.
pub fn decode<T: DeserializeOwned>(args: &[Arg], value: Value) -> Result<T, ToolOutcome> {
    let value = check(args, value).map_err(ToolOutcome::InvalidParams)?;
    serde_json::from_value(value)
        .map_err(|e| ToolOutcome::InvalidParams(format!("the arguments do not fit: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema written as text is the serialized schema, byte for byte,
    /// for every type of argument, none, and strings that need escaping.
    #[test]
    fn the_written_schema_is_the_serialized_schema() {
        const ALL: &[Arg] = &[
            Arg::req("z", Ty::Str, "a \"quoted\"\\ line\nwith\ttabs \u{1} and é"),
            Arg::opt("a", Ty::StrMax(9), "m"),
            Arg::req("e", Ty::Enum(&["x", "y\"z"]), "e"),
            Arg::opt("i", Ty::Id, "i"),
            Arg::opt("n", Ty::Int, "n"),
            Arg::opt(
                "u",
                Ty::Uint {
                    min: 0,
                    max: Some(30),
                },
                "u",
            ),
            Arg::opt("v", Ty::Uint { min: 1, max: None }, "v"),
            Arg::opt("b", Ty::Bool, "b"),
            Arg::req("l", Ty::StrList, "l"),
        ];
        for args in [ALL, &ALL[1..2], &[][..]] {
            let mut out = String::new();
            write_schema(args, &mut out);
            assert_eq!(out, schema(args).to_string());
        }
    }

    const ARGS: &[Arg] = &[
        Arg::req("to", Ty::Str, "who"),
        Arg::opt(
            "n",
            Ty::Uint {
                min: 1,
                max: Some(32),
            },
            "how many",
        ),
        Arg::opt("neg", Ty::Int, "signed"),
        Arg::opt("b", Ty::Bool, "flag"),
        Arg::opt("l", Ty::StrList, "list"),
        Arg::opt("k", Ty::Enum(&["question", "reminder"]), "kind"),
        Arg::opt("id", Ty::Id, "an id"),
    ];

    #[test]
    fn present_values_pass_and_nulls_are_absent() {
        let all = json!({"to":"bob","n":3,"neg":-2,"b":true,"l":["x"],"k":"reminder","id":7});
        let v = check(ARGS, all).unwrap();
        assert_eq!(v["id"], "7", "an integer id becomes its digits");
        let v = check(ARGS, json!({"to":"bob","n":null})).unwrap();
        assert_eq!(v, json!({"to":"bob"}));
    }

    #[test]
    fn errors_name_the_argument_and_the_expected_type() {
        let cases = [
            (json!({}), "missing required argument \"to\" (a string)"),
            (
                json!({"to":null}),
                "missing required argument \"to\" (a string)",
            ),
            (json!({"to":5}), "argument \"to\" must be a string, got 5"),
            (
                json!({"to":"a","n":-5}),
                "argument \"n\" must be a non-negative integer, got -5",
            ),
            (
                json!({"to":"a","neg":1.5}),
                "argument \"neg\" must be an integer, got 1.5",
            ),
            (
                json!({"to":"a","b":"yes"}),
                "argument \"b\" must be a boolean, got \"yes\"",
            ),
            (
                json!({"to":"a","l":["x",1]}),
                "argument \"l\" must be an array of strings, got [\"x\",1]",
            ),
            (
                json!({"to":"a","l":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30]}),
                "argument \"l\" must be an array of strings, got [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,…",
            ),
            (
                json!({"to":"a","k":"task"}),
                "argument \"k\" must be one of question, reminder, got \"task\"",
            ),
            (
                json!({"to":"a","cc":1}),
                "unknown argument \"cc\"; expected one of: to, n, neg, b, l, k, id",
            ),
        ];
        for (args, want) in cases {
            assert_eq!(check(ARGS, args.clone()).unwrap_err(), want, "{args}");
        }
        assert_eq!(
            check(&[], json!({"now":true})).unwrap_err(),
            "unknown argument \"now\"; expected one of: "
        );
    }

    #[test]
    fn the_schema_is_a_closed_object() {
        let s = schema(ARGS);
        assert_eq!(s["type"], "object");
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["required"], json!(["to"]));
        assert_eq!(
            s["properties"]["n"],
            json!({"type":"integer","minimum":1,"maximum":32,"description":"how many"})
        );
        assert!(schema(&[]).get("required").is_none());
    }
}
