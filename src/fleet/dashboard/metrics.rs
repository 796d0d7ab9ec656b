//! The dashboard's hive-wide `GET /metrics` (issue 43, item 2), behind the
//! dashboard's guard like every route (`Authorization: Bearer` with the
//! dashboard's token is what a Prometheus `credentials_file` sends). It owns
//! the gathering: the broker's answers as the operator over the host socket
//! (`agents` for who runs and their pools, `supervision` for each page's
//! token, `budget` for every scope's spend, `message_counts` for the message
//! rows per recipient and state — the web thread never opens `broker.db`),
//! and each running agent's own page's `/metrics` over its socket, relabelled
//! with `agent` and `pool`. Only the families an agent page writes
//! ([`crate::web::metrics::FAMILIES`], less the budget ones, which come from
//! the broker here for every scope) are taken in, each sample re-written
//! with its name, labels and value checked: the page is the agent's, and its
//! answer never reaches the exposition as text.
//!
//! Each of the broker's answers is waited for at most [`BROKER_WAIT`]; one
//! that does not come leaves its families out (`hive_broker_up 0`).
//! The pages are asked per request, in a bounded fan-out: at most
//! [`FETCHERS`] threads, each read of a page waits at most [`PAGE_WAIT`], and
//! the whole gathering ends at [`DEADLINE`] whatever is left (those pages
//! show `hive_page_up 0`). A page whose previous answer is still awaited (a
//! page that trickles its answer) is not asked again until it ends, so a
//! slow page costs at most one thread, never a hung `/metrics`.

use super::{agent_token, host, App};
use crate::http::prometheus::{self as page, Expo, Family, BUDGET_FAMILIES, FAMILIES};
use crate::http::Reply;
use crate::proto::cmd::{Agents, GetBudget, MessageCounts, NotifyStatus, Supervision};
use crate::proto::{AgentRow, AgentState, Client, Command};
use crossbeam_channel::unbounded;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Threads asking pages at once, per request.
pub const FETCHERS: usize = 8;
/// How long one read of a page's answer waits.
pub const PAGE_WAIT: Duration = Duration::from_secs(2);
/// When the gathering of pages ends, from its start.
pub const DEADLINE: Duration = Duration::from_secs(4);
/// How long each of the broker's answers is waited for.
pub const BROKER_WAIT: Duration = Duration::from_secs(3);
/// The most bytes of one page's answer read.
const MAX_PAGE_BYTES: u64 = 512 * 1024;
/// The most samples taken from one page.
const MAX_PAGE_SAMPLES: usize = 2000;

pub const BROKER_UP: Family = Family {
    name: "hive_broker_up",
    kind: page::Kind::Gauge,
    help: "1 when the broker answered the dashboard's questions for this scrape.",
};
pub const MESSAGES: Family = Family {
    name: "hive_messages",
    kind: page::Kind::Gauge,
    help: "Message rows the broker keeps, by recipient and state (queued, handed_out, acked until pruned, dead_lettered).",
};
pub const NOTIFY_DELIVERIES: Family = Family {
    name: "hive_notify_deliveries_total",
    kind: page::Kind::Counter,
    help: "Tries to post a notification, by destination (scheme and host) and result (delivered: accepted; failed: refused or not reached, tried again).",
};
pub const NOTIFY_DROPPED: Family = Family {
    name: "hive_notify_dropped_total",
    kind: page::Kind::Counter,
    help: "Notifications given up on after notify.give_up_days, by destination (scheme and host).",
};
pub const NOTIFY_PENDING: Family = Family {
    name: "hive_notify_pending",
    kind: page::Kind::Gauge,
    help: "Notifications waiting for their destination (scheme and host).",
};
pub const SPANS_DROPPED: Family = Family {
    name: "hive_spans_dropped_total",
    kind: page::Kind::Counter,
    help: "Spans of claude runs hive up dropped since it started: its export queue was full or the collector did not take them.",
};
pub const AGENT_RUNNING: Family = Family {
    name: "hive_agent_running",
    kind: page::Kind::Gauge,
    help: "1 while the agent's harness runs.",
};
pub const PAGE_UP: Family = Family {
    name: "hive_page_up",
    kind: page::Kind::Gauge,
    help: "1 when the running agent's page answered its /metrics within the scrape's bound.",
};

/// The agents whose page is being asked now (see the module's docs).
#[derive(Default)]
pub struct Scrapes {
    busy: Arc<Mutex<HashSet<String>>>,
}

/// One page to ask.
struct Target {
    agent: String,
    socket: std::path::PathBuf,
    token: Option<String>,
}

/// `GET /metrics`.
pub fn reply(app: &App) -> Reply {
    Reply::new(
        200,
        "text/plain; version=0.0.4; charset=utf-8",
        render(app).text(),
    )
}

/// The broker's answer to `cmd`. After a question without an answer the
/// connection is dropped (a late answer must not pass for the next one's),
/// and the questions after it go unasked.
fn ask<C: Command>(broker: &mut Option<Client>, cmd: C) -> Option<C::Reply> {
    let answer = broker
        .as_mut()?
        .call(&cmd)
        .map_err(|e| log::debug!("/metrics: no answer to {}: {e}", C::CMD))
        .ok();
    if answer.is_none() {
        *broker = None;
    }
    answer
}

/// The whole exposition.
fn render(app: &App) -> Expo {
    let mut o = Expo::default();
    let mut broker = host(app).ok().filter(|c| {
        c.set_read_timeout(Some(BROKER_WAIT))
            .map_err(|e| log::debug!("/metrics: {e}"))
            .is_ok()
    });
    let agents = ask(&mut broker, Agents {});
    let sup = ask(&mut broker, Supervision {})
        .map(|s| s.agents)
        .unwrap_or_default();
    let budget = ask(&mut broker, GetBudget {});
    let counts = ask(&mut broker, MessageCounts {});
    let notify = ask(&mut broker, NotifyStatus {});
    drop(broker);
    let up = agents.is_some() && counts.is_some();
    o.sample(&BROKER_UP, &[], f64::from(u8::from(up)));
    let rows: Vec<AgentRow> = agents.map(|a| a.agents).unwrap_or_default();
    let pool_of = |name: &str| -> String {
        rows.iter()
            .find(|r| r.name == name)
            .and_then(|r| r.pool.clone())
            .unwrap_or_default()
    };
    o.family(&AGENT_RUNNING);
    for r in &rows {
        let pool = pool_of(&r.name);
        o.sample(
            &AGENT_RUNNING,
            &labels(&r.name, &pool),
            f64::from(u8::from(r.running)),
        );
    }
    o.family(&MESSAGES);
    for c in counts.map(|c| c.counts).unwrap_or_default() {
        o.sample(
            &MESSAGES,
            &[("agent", &c.agent), ("state", &c.state)],
            c.count as f64,
        );
    }
    // Each notification destination's deliveries (`broker/notify/`); a
    // URL's scheme and host, never its path, is the label.
    o.family(&NOTIFY_DELIVERIES);
    o.family(&NOTIFY_DROPPED);
    o.family(&NOTIFY_PENDING);
    for d in notify.map(|n| n.destinations).unwrap_or_default() {
        let dest = [("destination", d.url.as_str())];
        for (result, n) in [("delivered", d.delivered), ("failed", d.failed)] {
            o.sample(&NOTIFY_DELIVERIES, &[dest[0], ("result", result)], n as f64);
        }
        o.sample(&NOTIFY_DROPPED, &dest, d.dropped as f64);
        o.sample(&NOTIFY_PENDING, &dest, d.pending as f64);
    }
    // The harnesses hand their spans to this process, which exports them
    // (`telemetry::exporter`).
    o.sample(
        &SPANS_DROPPED,
        &[],
        crate::telemetry::exporter::dropped_total() as f64,
    );
    // Every scope's spend and budget, from the broker.
    o.sample(&page::BUDGET_UP, &[], f64::from(u8::from(budget.is_some())));
    if let Some(b) = &budget {
        let scoped = b.rows.iter().map(|r| &r.row).map(|r| {
            let mut l: Vec<(&'static str, String)> = Vec::new();
            if r.scope == "hive" {
                l.push(("scope", "hive".into()));
            } else {
                l.push(("scope", "agent".into()));
                l.push(("agent", r.scope.clone()));
                let pool = pool_of(&r.scope);
                if !pool.is_empty() {
                    l.push(("pool", pool));
                }
            }
            (l, r)
        });
        page::render_budget_rows(&mut o, scoped);
    }
    // Each running page's families, labelled with its agent and pool.
    let targets: Vec<Target> = sup
        .iter()
        .filter(|s| s.pid.is_some() && super::super::pages::plain_name(&s.name))
        .map(|s: &AgentState| Target {
            agent: s.name.clone(),
            socket: super::super::pages::socket_path(&app.data.join("run"), &s.name),
            token: agent_token(app, &s.name, Some(s)),
        })
        .collect();
    let answers = gather(&app.scrapes, targets);
    o.family(&PAGE_UP);
    for (agent, answer) in &answers {
        let pool = pool_of(agent);
        o.sample(
            &PAGE_UP,
            &labels(agent, &pool),
            f64::from(u8::from(answer.is_ok())),
        );
    }
    for f in FAMILIES {
        if !BUDGET_FAMILIES.iter().any(|b| b.name == f.name) {
            o.family(f);
        }
    }
    for (agent, answer) in &answers {
        let Ok(text) = answer else {
            continue;
        };
        let pool = pool_of(agent);
        take_in(&mut o, text, &labels(agent, &pool));
    }
    o
}

/// `agent`, and `pool` when it has one.
fn labels<'a>(agent: &'a str, pool: &'a str) -> Vec<(&'static str, &'a str)> {
    let mut l = vec![("agent", agent)];
    if !pool.is_empty() {
        l.push(("pool", pool));
    }
    l
}

/// Asks every target's page for its `/metrics` (see the module's docs for
/// the bounds): each agent's answer, or why there is none, in `targets`'
/// order.
fn gather(scrapes: &Scrapes, targets: Vec<Target>) -> Vec<(String, Result<String, String>)> {
    let names: Vec<String> = targets.iter().map(|t| t.agent.clone()).collect();
    let deadline = Instant::now() + DEADLINE;
    let (jobs, todo) = unbounded::<Target>();
    for t in targets {
        let _ = jobs.send(t);
    }
    drop(jobs);
    let (done, answers) = unbounded::<(String, Result<String, String>)>();
    for i in 0..FETCHERS.min(names.len()) {
        let (todo, done, busy) = (todo.clone(), done.clone(), scrapes.busy.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("metrics-fetch-{i}"))
            .spawn(move || {
                while Instant::now() < deadline {
                    let Ok(t) = todo.try_recv() else {
                        return;
                    };
                    let fresh = busy
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(t.agent.clone());
                    let answer = if fresh {
                        let a = fetch(&t);
                        busy.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&t.agent);
                        a
                    } else {
                        Err("its page has not finished answering the last scrape".into())
                    };
                    if done.send((t.agent, answer)).is_err() {
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            log::warn!("/metrics: cannot start a thread to ask the agents' pages: {e}");
            break;
        }
    }
    drop(done);
    let mut got: Vec<(String, Result<String, String>)> = Vec::new();
    while got.len() < names.len() {
        match answers.recv_deadline(deadline) {
            Ok(a) => got.push(a),
            Err(_) => break,
        }
    }
    names
        .into_iter()
        .map(|n| {
            let answer = match got.iter().position(|(a, _)| *a == n) {
                Some(i) => got.swap_remove(i).1,
                None => Err(format!(
                    "its page did not answer within {}s",
                    DEADLINE.as_secs()
                )),
            };
            if let Err(e) = &answer {
                log::debug!("/metrics: no figures of {n}'s page: {e}");
            }
            (n, answer)
        })
        .collect()
}

/// `GET /metrics` of one page.
fn fetch(t: &Target) -> Result<String, String> {
    let (status, body) = super::super::pages::fetch(
        &t.socket,
        &t.agent,
        "/metrics",
        t.token.as_deref(),
        MAX_PAGE_BYTES,
        PAGE_WAIT,
    )?;
    if status != 200 {
        return Err(format!("its page answered {status}"));
    }
    String::from_utf8(body).map_err(|_| "its page's answer is not UTF-8".into())
}

/// The samples of `text` (a page's exposition) whose family is an agent
/// page's and not a budget one, each with `extra` labels first (a label of
/// the same name the page sent is dropped), at most [`MAX_PAGE_SAMPLES`]; a
/// series the page wrote twice is taken once.
fn take_in(o: &mut Expo, text: &str, extra: &[(&str, &str)]) {
    let mut taken = 0;
    let mut seen: HashSet<(&'static str, Vec<(String, String)>)> = HashSet::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((name, labels, v)) = parse_sample(line) else {
            continue;
        };
        let Some(f) = FAMILIES.iter().copied().find(|f| f.name == name) else {
            continue;
        };
        if BUDGET_FAMILIES.iter().any(|b| b.name == f.name) {
            continue;
        }
        let mut labels: Vec<(String, String)> = labels
            .into_iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .collect();
        labels.sort();
        if !seen.insert((f.name, labels.clone())) {
            continue;
        }
        let mut l: Vec<(&str, &str)> = extra.to_vec();
        l.extend(labels.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        o.sample(f, &l, v);
        taken += 1;
        if taken >= MAX_PAGE_SAMPLES {
            log::warn!("/metrics: a page wrote more than {MAX_PAGE_SAMPLES} samples; the rest are left out");
            return;
        }
    }
}

/// True for a metric or label name of the text format.
fn is_name(s: &str, colon: bool) -> bool {
    let mut b = s.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_' || (colon && c == b':'))
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || (colon && c == b':'))
}

/// A sample's labels, as the page wrote them.
pub(super) type Labels = Vec<(String, String)>;

/// One sample line of the text format: its name, labels and value (a
/// timestamp after it is ignored); None for anything else.
pub(super) fn parse_sample(line: &str) -> Option<(String, Labels, f64)> {
    let line = line.trim();
    let end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..end];
    if !is_name(name, true) {
        return None;
    }
    let mut rest = &line[end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        loop {
            while chars.next_if(|(_, c)| *c == ' ').is_some() {}
            match chars.peek() {
                Some((i, '}')) => {
                    rest = &inner[i + 1..];
                    break;
                }
                Some(_) => {}
                None => return None,
            }
            let (start, _) = *chars.peek()?;
            let mut key_end = start;
            for (i, c) in chars.by_ref() {
                if c == '=' {
                    key_end = i;
                    break;
                }
            }
            let key = inner[start..key_end].trim();
            if !is_name(key, false) || chars.next()?.1 != '"' {
                return None;
            }
            let mut val = String::new();
            loop {
                match chars.next()?.1 {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => val.push('\n'),
                        c => val.push(c),
                    },
                    c => val.push(c),
                }
            }
            if labels.iter().any(|(k, _)| k == key) {
                return None;
            }
            labels.push((key.to_string(), val));
            while chars.next_if(|(_, c)| *c == ' ').is_some() {}
            chars.next_if(|(_, c)| *c == ',');
        }
    }
    let v = rest.split_whitespace().next()?;
    let v = match v {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        _ => v.parse::<f64>().ok()?,
    };
    Some((name.to_string(), labels, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{AgentConfig, AgentPhase};
    use serde_json::json;
    use std::io::{BufRead, BufReader, Write};

    /// A broker stand-in: one running agent, `slow`, in pool `p`; every
    /// other question answered empty.
    fn fake_broker(path: &std::path::Path) {
        let l = std::os::unix::net::UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut w = conn.try_clone().unwrap();
                    for line in BufReader::new(conn).lines().map_while(Result::ok) {
                        let cmd: serde_json::Value = serde_json::from_str(&line).unwrap();
                        let sup = AgentState {
                            name: "slow".into(),
                            state: AgentPhase::Running,
                            pid: Some(1),
                            restarts: 0,
                            logged_in: true,
                            up_to_date: true,
                            port: None,
                            applied: AgentConfig::named("slow"),
                            last_rebuild: None,
                        };
                        let answer = match cmd["cmd"].as_str().unwrap() {
                            "supervision" => json!({"ok": true, "agents": [sup]}),
                            "message_counts" => json!({"ok": true, "counts": [
                                {"agent": "slow", "state": "queued", "count": 3}]}),
                            "budget" => json!({"ok": true, "rows": []}),
                            _ => json!({"ok": true, "agents": []}),
                        };
                        if writeln!(w, "{answer}").is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }

    /// A page that takes the request and trickles its answer, a byte a
    /// while, never ending it: `/metrics` still answers, with the page down,
    /// and while the page holds its first ask it is not asked again.
    #[test]
    fn a_page_that_never_answers_does_not_hang_metrics() {
        let data = std::env::temp_dir().join(format!("hive-dash-metrics-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(data.join("run/pages")).unwrap();
        let sock = data.join("host.sock");
        fake_broker(&sock);
        let page = super::super::super::pages::socket_path(&data.join("run"), "slow");
        let l = std::os::unix::net::UnixListener::bind(&page).unwrap();
        let (accepted, asks) = crossbeam_channel::unbounded();
        std::thread::spawn(move || {
            for mut conn in l.incoming().flatten() {
                let _ = accepted.send(());
                std::thread::spawn(move || {
                    // Each byte comes well within PAGE_WAIT; the answer
                    // never ends while the test runs.
                    for _ in 0..600 {
                        if conn.write_all(b"H").is_err() {
                            return;
                        }
                        std::thread::sleep(PAGE_WAIT / 4);
                    }
                });
            }
        });
        let cfg = super::super::DashConfig {
            auth: false,
            ..super::super::DashConfig::read(&crate::sys::env::Env::new(&|_| None)).unwrap()
        };
        let d = super::super::start(&data, sock, cfg).unwrap();
        let url = format!("http://127.0.0.1:{}/metrics", d.port);
        let get = || {
            ureq::get(&url)
                .timeout(Duration::from_secs(30))
                .call()
                .unwrap()
                .into_string()
                .unwrap()
        };
        let text = get();
        assert!(text.contains("hive_page_up{agent=\"slow\"} 0\n"), "{text}");
        assert!(
            text.contains("hive_messages{agent=\"slow\",state=\"queued\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("hive_broker_up 1\n"), "{text}");
        assert_eq!(asks.len(), 1, "one ask of the page");
        // Its first ask still trickles: the next scrape does not ask again.
        let text = get();
        assert!(text.contains("hive_page_up{agent=\"slow\"} 0\n"), "{text}");
        assert_eq!(asks.len(), 1, "the page was asked again while it answered");
        drop(d);
        let _ = std::fs::remove_dir_all(&data);
    }

    #[test]
    fn samples_are_read_with_their_escapes_and_junk_is_not() {
        assert_eq!(
            parse_sample(r#"hive_turns_total{kind="turn",outcome="ok"} 2"#),
            Some((
                "hive_turns_total".into(),
                vec![
                    ("kind".into(), "turn".into()),
                    ("outcome".into(), "ok".into())
                ],
                2.0
            ))
        );
        assert_eq!(
            parse_sample(r#"hive_x{a="q\"\\\n}",} +Inf 123"#),
            Some((
                "hive_x".into(),
                vec![("a".into(), "q\"\\\n}".into())],
                f64::INFINITY
            ))
        );
        assert_eq!(
            parse_sample("hive_unread 4"),
            Some(("hive_unread".into(), vec![], 4.0))
        );
        for bad in [
            "1bad 2",
            "hive_x{a=\"1\"",
            "hive_x{a=1} 2",
            "hive_x{a=\"1\",a=\"2\"} 2",
            "hive_x{a-b=\"1\"} 2",
            "hive_x nope",
            "hive_x",
        ] {
            assert_eq!(parse_sample(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_pages_families_are_taken_in_relabelled_and_nothing_else() {
        let text = "# HELP hive_turns_total x\n# TYPE hive_turns_total counter\n\
            hive_turns_total{kind=\"turn\",outcome=\"ok\",agent=\"mallory\"} 3\n\
            hive_evil_total{x=\"1\"} 9\n\
            hive_spend_usd{scope=\"agent\",per=\"day\"} 1\n\
            hive_unread 2\n\
            hive_turns_total{kind=\"turn\",outcome=\"ok\"} 1\n";
        let mut o = Expo::default();
        for f in FAMILIES {
            o.family(f);
        }
        take_in(&mut o, text, &[("agent", "ana"), ("pool", "p1")]);
        take_in(&mut o, "hive_unread 5\n", &[("agent", "bob")]);
        let out = o.text();
        assert!(
            out.contains(
                "hive_turns_total{agent=\"ana\",pool=\"p1\",kind=\"turn\",outcome=\"ok\"} 3\n"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "hive_unread{agent=\"ana\",pool=\"p1\"} 2\nhive_unread{agent=\"bob\"} 5\n"
            ),
            "{out}"
        );
        assert!(
            !out.contains("mallory") && !out.contains("hive_evil"),
            "{out}"
        );
        assert!(!out.contains("outcome=\"ok\"} 1"), "a series twice: {out}");
        assert!(!out.contains("hive_spend_usd{"), "{out}");
        assert_eq!(out.matches("# TYPE hive_unread gauge").count(), 1);
    }
}
