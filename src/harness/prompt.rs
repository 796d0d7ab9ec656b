//! The system-prompt renderer: turns the `prompts/system.md` template into the
//! `claude-system-prompt.md` the harness passes with `--system-prompt-file`. It owns
//! the role-marker grammar (`<!-- role:X -->` … `<!-- /role:X -->` gate blocks; the
//! renderer keeps role `agent` and shared text, and elides every other role) and the
//! five placeholders `{label}`, `{qualified_label}`, `{operator_pronouns}`,
//! `{hive_identity}` and `{swarm_identity}`. Apart from reading the environment in
//! [`PromptVars::from_env`] it does no I/O.

/// The template shipped in the binary.
pub const SYSTEM_TEMPLATE: &str = include_str!("../../prompts/system.md");

/// The role whose blocks the renderer keeps.
pub const RENDER_ROLE: &str = "agent";

/// The operator's pronouns when `HIVE_OPERATOR_PRONOUNS` is unset or empty.
pub const DEFAULT_OPERATOR_PRONOUNS: &str = "she/her";

/// The values substituted into the template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptVars {
    /// The agent's short name.
    pub label: String,
    /// `label@hive` when the hive has a name, else the label.
    pub qualified_label: String,
    pub operator_pronouns: String,
    /// `Some("")` is treated as `None`.
    pub hive_name: Option<String>,
    /// `Some("")` is treated as `None`.
    pub swarm_name: Option<String>,
}

impl PromptVars {
    /// Reads `HIVE_OPERATOR_PRONOUNS`, `HIVE_HIVE_NAME` and `HIVE_SWARM_NAME`.
    pub fn from_env(label: &str) -> PromptVars {
        PromptVars::from_lookup(label, &|key| std::env::var(key).ok())
    }

    /// [`PromptVars::from_env`] over any lookup, for tests.
    pub fn from_lookup(label: &str, env: &dyn Fn(&str) -> Option<String>) -> PromptVars {
        let set = |key: &str| env(key).filter(|v| !v.trim().is_empty());
        let hive_name = set("HIVE_HIVE_NAME");
        let qualified_label = match &hive_name {
            Some(hive) => format!("{label}@{hive}"),
            None => label.to_string(),
        };
        PromptVars {
            label: label.to_string(),
            qualified_label,
            operator_pronouns: set("HIVE_OPERATOR_PRONOUNS")
                .unwrap_or_else(|| DEFAULT_OPERATOR_PRONOUNS.to_string()),
            hive_name,
            swarm_name: set("HIVE_SWARM_NAME"),
        }
    }

    /// `` on hive `NAME` `` with a leading space, or empty.
    pub fn hive_identity(&self) -> String {
        identity(" on hive", self.hive_name.as_deref())
    }

    /// `` in swarm `NAME` `` with a leading space, or empty.
    pub fn swarm_identity(&self) -> String {
        identity(" in swarm", self.swarm_name.as_deref())
    }
}

fn identity(prefix: &str, name: Option<&str>) -> String {
    match name {
        Some(n) if !n.is_empty() => format!("{prefix} `{n}`"),
        _ => String::new(),
    }
}

/// Renders the template for role `agent`: role blocks first, placeholders second
/// (so a substituted value is never read as a marker or a placeholder).
pub fn render(template: &str, vars: &PromptVars) -> String {
    substitute(&filter_roles(template, RENDER_ROLE), vars)
}

/// A role marker found in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Marker {
    Open(String),
    Close(String),
}

/// Reads the inside of an HTML comment as a role marker. Whitespace around the
/// parts is ignored, so `<!--role:foo-->` and `<!-- / role : foo -->` both parse;
/// a role name is one word of letters, digits, `_` and `-`.
fn parse_marker(inner: &str) -> Option<Marker> {
    let inner = inner.trim();
    let (closing, rest) = match inner.strip_prefix('/') {
        Some(rest) => (true, rest.trim_start()),
        None => (false, inner),
    };
    let role = rest
        .strip_prefix("role")?
        .trim_start()
        .strip_prefix(':')?
        .trim();
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if role.is_empty() || !role.chars().all(valid) {
        return None;
    }
    Some(if closing {
        Marker::Close(role.to_string())
    } else {
        Marker::Open(role.to_string())
    })
}

/// Keeps shared text and `role`'s blocks, drops other roles' blocks and every
/// marker. A marker alone on its line takes the whole line with it. An opener
/// replaces the active role (no nesting); a closer only ends the block of the role
/// it names, and any other closer is dropped without ending anything.
pub fn filter_roles(template: &str, role: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut active: Option<String> = None;
    let mut pos = 0;
    let mut search = 0;
    while let Some(rel) = template[search..].find("<!--") {
        let start = search + rel;
        let Some(end_rel) = template[start + 4..].find("-->") else {
            break;
        };
        let end = start + 4 + end_rel + 3;
        let Some(marker) = parse_marker(&template[start + 4..end - 3]) else {
            search = end;
            continue;
        };
        let (cut_from, resume) = standalone_span(template, start, end);
        if active.as_deref().is_none_or(|a| a == role) {
            out.push_str(&template[pos..cut_from]);
        }
        match marker {
            Marker::Open(r) => active = Some(r),
            Marker::Close(r) if active.as_deref() == Some(r.as_str()) => active = None,
            Marker::Close(_) => {}
        }
        pos = resume;
        search = resume;
    }
    if active.as_deref().is_none_or(|a| a == role) {
        out.push_str(&template[pos..]);
    }
    out
}

/// When the marker at `start..end` is alone on its line, the span of the whole line
/// including its newline; else the marker itself.
fn standalone_span(text: &str, start: usize, end: usize) -> (usize, usize) {
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[end..].find('\n').map_or(text.len(), |i| end + i);
    let blank = |s: &str| s.chars().all(char::is_whitespace);
    if blank(&text[line_start..start]) && blank(&text[end..line_end]) {
        (line_start, (line_end + 1).min(text.len()))
    } else {
        (start, end)
    }
}

/// Replaces the five placeholders in one pass; any other `{…}` stays as it is.
fn substitute(text: &str, vars: &PromptVars) -> String {
    let hive = vars.hive_identity();
    let swarm = vars.swarm_identity();
    let table: [(&str, &str); 5] = [
        ("{label}", &vars.label),
        ("{qualified_label}", &vars.qualified_label),
        ("{operator_pronouns}", &vars.operator_pronouns),
        ("{hive_identity}", &hive),
        ("{swarm_identity}", &swarm),
    ];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        match table.iter().find(|(key, _)| tail.starts_with(key)) {
            Some((key, value)) => {
                out.push_str(value);
                rest = &tail[key.len()..];
            }
            None => {
                out.push('{');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(hive: Option<&str>, swarm: Option<&str>) -> PromptVars {
        PromptVars {
            label: "ada".into(),
            qualified_label: "ada@pr1ma".into(),
            operator_pronouns: "they/them".into(),
            hive_name: hive.map(String::from),
            swarm_name: swarm.map(String::from),
        }
    }

    #[test]
    fn role_blocks_follow_the_marker_grammar() {
        let cases: &[(&str, &str, &str)] = &[
            ("shared text stays", "a\nb\n", "a\nb\n"),
            (
                "agent block kept, markers dropped with their lines",
                "a\n<!-- role:agent -->\nb\n<!-- /role:agent -->\nc\n",
                "a\nb\nc\n",
            ),
            (
                "manager block elided",
                "a\n<!-- role:manager -->\nsecret\n<!-- /role:manager -->\nc\n",
                "a\nc\n",
            ),
            (
                "whitespace inside markers tolerated",
                "a\n<!--role:manager-->\nm\n<!--/role:manager-->\n<!--  role:agent  -->\nx\n<!-- / role : agent -->\nc\n",
                "a\nx\nc\n",
            ),
            (
                "a stray opener overrides until its own closer",
                "a\n<!-- role:agent -->\nb\n<!-- role:manager -->\nm\n<!-- /role:agent -->\nm2\n<!-- /role:manager -->\nc\n",
                "a\nb\nc\n",
            ),
            (
                "an unclosed opener runs to the end of the file",
                "a\n<!-- role:manager -->\nm\nm2\n",
                "a\n",
            ),
            (
                "a mismatched closer is elided and does not pop",
                "a\n<!-- role:manager -->\nm\n<!-- /role:agent -->\nstill m\n<!-- /role:manager -->\nc\n",
                "a\nc\n",
            ),
            (
                "a closer with nothing open is elided",
                "a\n<!-- /role:manager -->\nb\n",
                "a\nb\n",
            ),
            (
                "inline markers cut only themselves",
                "x <!-- role:manager -->M<!-- /role:manager --> y <!-- role:agent -->A<!-- /role:agent --> z\n",
                "x  y A z\n",
            ),
            (
                "other comments are content",
                "<!-- just a note -->\n<!-- role: -->\n<!-- role:a b -->\n",
                "<!-- just a note -->\n<!-- role: -->\n<!-- role:a b -->\n",
            ),
            (
                "an unterminated comment is content",
                "a <!-- role:manager\nb\n",
                "a <!-- role:manager\nb\n",
            ),
            (
                "marker at end of file without newline",
                "a\n<!-- role:manager -->m<!-- /role:manager -->",
                "a\n",
            ),
        ];
        for (name, input, want) in cases {
            assert_eq!(&filter_roles(input, RENDER_ROLE), want, "{name}");
        }
    }

    #[test]
    fn placeholders_are_substituted_once_and_unknown_ones_stay() {
        let tpl = "I am {label} ({qualified_label}){hive_identity}{swarm_identity}. \
                   Operator: {operator_pronouns}. {unknown} {label {} {{label}}";
        assert_eq!(
            render(tpl, &vars(Some("pr1ma"), Some("constellat1on"))),
            "I am ada (ada@pr1ma) on hive `pr1ma` in swarm `constellat1on`. \
             Operator: they/them. {unknown} {label {} {ada}"
        );
        assert_eq!(
            render(
                "{label}{hive_identity}{swarm_identity}.",
                &vars(None, Some(""))
            ),
            "ada."
        );
        assert_eq!(
            render("{label}{hive_identity}", &vars(Some(""), None)),
            "ada"
        );
    }

    #[test]
    fn substituted_values_are_not_rendered_again() {
        let mut v = vars(None, None);
        v.label = "{swarm_identity}<!-- role:manager -->".into();
        assert_eq!(
            render("x {label} y", &v),
            "x {swarm_identity}<!-- role:manager --> y"
        );
    }

    #[test]
    fn vars_come_from_the_environment_with_defaults() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let v = PromptVars::from_lookup("ada", &env(&[]));
        assert_eq!(v.qualified_label, "ada");
        assert_eq!(v.operator_pronouns, "she/her");
        assert_eq!((v.hive_name.clone(), v.swarm_name.clone()), (None, None));

        let v = PromptVars::from_lookup(
            "ada",
            &env(&[
                ("HIVE_HIVE_NAME", "pr1ma"),
                ("HIVE_SWARM_NAME", ""),
                ("HIVE_OPERATOR_PRONOUNS", "he/him"),
            ]),
        );
        assert_eq!(v.qualified_label, "ada@pr1ma");
        assert_eq!(v.operator_pronouns, "he/him");
        assert_eq!(v.hive_identity(), " on hive `pr1ma`");
        assert_eq!(v.swarm_identity(), "");

        let v = PromptVars::from_lookup("ada", &env(&[("HIVE_OPERATOR_PRONOUNS", " ")]));
        assert_eq!(v.operator_pronouns, "she/her");
    }

    #[test]
    fn the_shipped_template_renders_cleanly_for_an_agent() {
        let out = render(SYSTEM_TEMPLATE, &vars(Some("pr1ma"), Some("constellat1on")));
        assert!(out.contains("ada"), "{out}");
        assert!(
            out.contains(" on hive `pr1ma` in swarm `constellat1on`"),
            "{out}"
        );
        assert!(out.contains("they/them"), "{out}");
        for leftover in [
            "{label}",
            "{qualified_label}",
            "{operator_pronouns}",
            "{hive_identity}",
            "{swarm_identity}",
            "role:",
            "<!--",
        ] {
            assert!(!out.contains(leftover), "{leftover} left in:\n{out}");
        }
        assert!(SYSTEM_TEMPLATE.contains("<!-- role:manager -->"));
        let manager_only = filter_roles(SYSTEM_TEMPLATE, "manager");
        assert!(manager_only.len() > filter_roles(SYSTEM_TEMPLATE, RENDER_ROLE).len());
        let lines = SYSTEM_TEMPLATE.lines().count();
        assert!((50..=100).contains(&lines), "template is {lines} lines");
    }
}
