//! The bodies of the fuzz targets, shared by the `cargo fuzz` binaries in
//! `tests/fuzz/fuzz_targets/` and by `tests/fuzz_regressions.rs`, which replays
//! the committed corpus seeds and crash reproducers under `make test`. Each body
//! must never panic on any input; where there is a property to hold (a parsed
//! request survives a round trip, no static path escapes its root) it asserts it.

#![allow(dead_code)]

use hyperhive::harness::classify::{ExitInfo, TurnObserver};
use hyperhive::harness::prompt::{filter_roles, render, PromptVars};
use hyperhive::mcp::jsonrpc::Message;
use hyperhive::mcp::{CallCtx, ServerInfo, ToolDef, ToolOutcome, Tools};
use hyperhive::proto::lines::read_line;
use hyperhive::proto::lines::Line;
use hyperhive::proto::Request;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The wire protocol: `Request::parse` on every line, and `read_line` with a
/// small limit over the raw bytes. A request that parses serialises to a line
/// that parses back to the same request.
pub fn wire(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for line in text.lines() {
        if let Ok(req) = Request::parse(line) {
            let again = serde_json::to_string(&req).expect("a request serialises");
            assert_eq!(Request::parse(&again).as_ref(), Ok(&req), "{again}");
        }
    }
    let mut r: &[u8] = data;
    let mut lines = 0;
    loop {
        match read_line(&mut r, 64) {
            Ok(Line::Eof) | Err(_) => break,
            Ok(Line::Text(t)) => assert!(t.len() <= 64 && !t.contains('\n')),
            Ok(Line::TooLong | Line::NotUtf8) => {}
        }
        lines += 1;
        assert!(lines <= data.len() + 1, "read_line does not advance");
    }
}

struct Echo;

impl Tools for Echo {
    fn list(&self) -> Vec<ToolDef> {
        vec![ToolDef {
            name: "echo",
            description: "echoes its arguments".into(),
            input_schema: serde_json::json!({"type":"object"}).into(),
        }]
    }
    fn call(&self, _name: &str, args: serde_json::Value, _ctx: &CallCtx) -> ToolOutcome {
        ToolOutcome::Ok(args.to_string())
    }
}

/// JSON-RPC framing (`Message::read`, `write`) and the MCP server's dispatch
/// over the whole input as its stdin, with one echo tool.
pub fn jsonrpc(data: &[u8]) {
    let mut r: &[u8] = data;
    while let Ok(Some(m)) = Message::read(&mut r) {
        let mut out = Vec::new();
        match m {
            Ok(m) => m.write(&mut out).expect("write to a Vec"),
            Err(resp) => Message::Response(resp)
                .write(&mut out)
                .expect("write to a Vec"),
        }
        let line = String::from_utf8(out).expect("UTF-8 out");
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "{line}"
        );
    }
    let info = ServerInfo {
        name: "fuzz".into(),
        version: "0".into(),
        instructions: None,
    };
    let _ = hyperhive::mcp::serve(
        info,
        Arc::new(Echo),
        std::io::Cursor::new(data.to_vec()),
        std::io::sink(),
        || Ok(crossbeam_channel::never()),
    );
}

/// The stream-json outcome classifier: lines to stdout (every seventh to
/// stderr), then `finish`.
pub fn classify(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut obs = if data.first() == Some(&b'c') {
        TurnObserver::compaction()
    } else {
        TurnObserver::new()
    };
    for (i, line) in text.lines().enumerate() {
        if i % 7 == 6 {
            obs.on_stderr_line(line);
        } else {
            obs.on_stdout_line(line);
        }
    }
    let exit = ExitInfo {
        code: Some(i32::from(data.len().is_multiple_of(3))),
        ..ExitInfo::default()
    };
    let _ = obs.finish(exit);
}

/// The system-prompt renderer and role filter on the input as a template.
pub fn prompt(data: &[u8]) {
    let template = String::from_utf8_lossy(data);
    let vars = PromptVars {
        label: "ana".into(),
        qualified_label: "ana@pr1ma".into(),
        operator_pronouns: "they/them".into(),
        hive_name: Some("pr1ma".into()),
        swarm_name: None,
    };
    let _ = render(&template, &vars);
    for role in ["agent", "manager", ""] {
        let _ = filter_roles(&template, role);
    }
}

/// What lies outside the web server's static root; no answer may contain it.
const OUTSIDE: &str = "OUTSIDE-THE-STATIC-ROOT";
const TOKEN: &str = "fuzz-token";

/// Two in-process web servers (authentication off; token `fuzz-token`),
/// started once.
fn web_ports() -> (u16, u16) {
    static PORTS: OnceLock<(u16, u16)> = OnceLock::new();
    *PORTS.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("hv-fuzz-web-{}", std::process::id()));
        let start = |tag: &str, token: Option<&str>| -> u16 {
            use hyperhive::harness::settings::Settings;
            let dir = base.join(tag);
            let state = dir.join("state");
            let root = dir.join("static");
            std::fs::create_dir_all(&state).unwrap();
            std::fs::create_dir_all(root.join("games")).unwrap();
            std::fs::write(dir.join("secret.txt"), OUTSIDE).unwrap();
            std::fs::write(root.join("games/index.html"), "inside").unwrap();
            let _ = std::os::unix::fs::symlink(dir.join("secret.txt"), root.join("leak.txt"));
            let _ = std::os::unix::fs::symlink(&dir, root.join("up"));
            let mut s = Settings::resolve(&state, &dir.join("run")).expect("settings");
            s.label = "ana".into();
            s.model_file = state.join("hyperhive-model");
            s.socket = dir.join("no-broker.sock");
            s.claude_config_dir = dir.join("claude");
            let bus = hyperhive::harness::bus::Bus::new("ana", "ana@hive", "haiku", 200_000);
            let (tx, rx) = crossbeam_channel::unbounded();
            std::thread::spawn(move || for _ in rx {});
            let shared = hyperhive::harness::control::Shared::new(bus, tx, Arc::new(s));
            // The seeds say `Host: x`; the open server has authentication off.
            let cfg = hyperhive::web::WebConfig {
                port: 0,
                token: token.map(str::to_string),
                auth: token.is_some(),
                hosts: vec!["x".into()],
                static_dir: Some(root),
                sse_ping: Duration::from_millis(200),
                timeouts: hyperhive::http::server::Timeouts {
                    read: Duration::from_millis(500),
                    send: Duration::from_millis(500),
                },
                ..hyperhive::web::WebConfig::default()
            };
            let handle = hyperhive::web::start(shared, cfg).expect("web::start");
            let port = handle.port();
            std::mem::forget(handle);
            port
        };
        (start("open", None), start("token", Some(TOKEN)))
    })
}

/// The web API's request handling: the input is sent as raw HTTP to a running
/// `web::start` (the first byte picks the server with or without a token). No
/// answer may carry a file from outside the static root, and the token server
/// answers nothing but 401 (or the login page) to a request without the token.
pub fn web(data: &[u8]) {
    let (open, guarded) = web_ports();
    let Some((&pick, req)) = data.split_first() else {
        return;
    };
    let req = &req[..req.len().min(64 * 1024)];
    let port = if pick & 1 == 0 { open } else { guarded };
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let _ = s.set_write_timeout(Some(Duration::from_millis(300)));
    if s.write_all(req).is_err() {
        return;
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    while buf.len() < 1 << 20 {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&buf);
    assert!(
        !text.contains(OUTSIDE),
        "a file outside the static root was served"
    );
    let sent = String::from_utf8_lossy(req);
    if port == guarded && !sent.contains(TOKEN) && !sent.contains("/login") {
        let status = text.split_whitespace().nth(1).unwrap_or("");
        assert!(
            !status.starts_with('2'),
            "answered {status} without the token"
        );
    }
}
