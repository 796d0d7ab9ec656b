//! The agent page of a running `hive serve`, reached the way a script would:
//! the port from `STATE/hyperhive-port` and, when the page generated one, the
//! token from `STATE/web-token` (sent as `X-Hive-Token`). The turn-loop tests
//! read `/api/state`, `/metrics` and post to the page only through here, so how
//! a test reaches a page (and with which credentials) is decided in this one
//! place. Every wait has a timeout.

use super::hive::{wait_for, Harness};
use super::web::{call, Resp};
use serde_json::Value;
use std::time::Duration;

/// How long a page may take to show what a test waits for.
const T: Duration = Duration::from_secs(20);

pub struct AgentPage {
    pub port: u16,
    pub token: Option<String>,
}

impl AgentPage {
    /// Waits for the page of `h` to be up.
    pub fn of(h: &Harness) -> AgentPage {
        let f = h.state_dir().join("hyperhive-port");
        let port = wait_for(T, "the agent page's port file", || {
            std::fs::read_to_string(&f).ok()?.trim().parse().ok()
        });
        let token = std::fs::read_to_string(h.state_dir().join("web-token"))
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        AgentPage { port, token }
    }

    /// `headers` plus the page's token, when it has one.
    fn headers<'a>(&'a self, headers: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut h = headers.to_vec();
        if let Some(t) = &self.token {
            h.push(("X-Hive-Token", t.as_str()));
        }
        h
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn get(&self, path: &str) -> Resp {
        call("GET", &self.url(path), &self.headers(&[]), None)
    }

    pub fn post(&self, path: &str, body: &str) -> Resp {
        let headers = self.headers(&[("Content-Type", "application/json")]);
        call("POST", &self.url(path), &headers, Some(body))
    }

    /// `/api/state`.
    pub fn state(&self) -> Value {
        let r = self.get("/api/state");
        assert_eq!(r.status, 200, "/api/state: {}", r.body);
        r.json()
    }

    /// `/metrics`.
    pub fn metrics(&self) -> String {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200, "/metrics: {}", r.body);
        r.body
    }

    /// Polls `/api/state` until `pred` holds; returns that state.
    pub fn wait_state(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        wait_for(T, what, || Some(self.state()).filter(|s| pred(s)))
    }

    /// Waits until the page shows the broker's budget pause, and checks its
    /// detail holds `detail`; the state.
    pub fn wait_budget_pause(&self, detail: &str) -> Value {
        let s = self.wait_state("the budget pause", |s| s["paused"]["reason"] == "budget");
        assert!(
            s["paused"]["detail"]
                .as_str()
                .unwrap_or_default()
                .contains(detail),
            "{s}"
        );
        s
    }
}
