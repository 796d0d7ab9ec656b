//! History that outlives the harness, in headless Chromium at 390 px: a turn
//! with a unique word survives a `kill -9` of its agent's harness under `hive
//! up`, and after the restart a fresh load of the agent's page shows it (once)
//! and goes on live; scrolling up loads the older turns; the page's search box
//! and `/turn/ID` find and open it; `hive search` and the dashboard's search
//! box find it across the hive. Without chromium the test skips loudly, or
//! fails under `HIVE_REQUIRE_REAL_CLAUDE=1`.

mod common;

use common::browser::{artifacts, browser, Driver, T};
use common::hive::{ok, run_hive, wait_for};
use common::up::Up;
use serde_json::Value;
use std::io::Write;

const FLEET: &str = r#"{"agents": [{"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}]}"#;

fn send(up: &Up, body: &str) {
    ok(
        &mut up.host(),
        hyperhive::proto::cmd::Send {
            to: "ana".into(),
            body: body.into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
}

/// How many times `text` shows in the page's chat.
fn count_in_chat(d: &Driver, text: &str) -> u64 {
    let js = format!(
        "return [...document.querySelectorAll('#chat .wake')].filter((w) => w.textContent.includes({})).length",
        serde_json::to_string(text).unwrap()
    );
    d.js(&js).as_u64().unwrap_or(0)
}

#[test]
fn a_turn_survives_a_kill_9_and_is_found_on_the_page_and_across_the_hive() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let up = Up::start(FLEET, &["ana"]);
    for i in 0..24 {
        send(&up, &format!("filler-{i:02}"));
    }
    send(&up, "the xylophone-5150 plan");
    up.wait_prompt("ana", "xylophone-5150", 1);
    let sock = up.data().join("run/host.sock").display().to_string();
    let found = |word: &str| {
        let (code, out, err) = run_hive(&["search", "--json", word, "--socket", &sock], None, &[]);
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(out.trim()).unwrap();
        v["hits"].as_array().map_or(0, Vec::len)
    };
    wait_for(T, "the turn in the history", || {
        (found("xylophone-5150") == 1).then_some(())
    });

    // kill -9 of the agent's harness (its sandbox, whose PID namespace dies
    // with it); the supervisor starts it again.
    let pid = up.wait_running("ana");
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let new_pid = wait_for(T, "ana to run again", || {
        let p = up.wait_running("ana");
        (p != pid).then_some(p)
    });
    assert_ne!(new_pid, pid);
    assert_eq!(found("xylophone-5150"), 1, "hive search still finds it");

    // A fresh page load, through the dashboard's login: the turn is there
    // from the log, once, and the page is live.
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&up.login_link());
    wait_for(T, "the dashboard to go live", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    let dash = up.dashboard();
    d.goto(&format!("{}/agent/ana/open", dash.base));
    wait_for(T, "the page to go live", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    wait_for(T, "the turn from before the kill", || {
        (count_in_chat(&d, "xylophone-5150") == 1).then_some(())
    });
    let path = artifacts().join("history-page-390px.png");
    std::fs::write(&path, d.screenshot()).unwrap();
    let _ = writeln!(std::io::stderr(), "screenshot: {}", path.display());
    // Live after the history, with nothing twice.
    send(&up, "after the restart: yak-77");
    wait_for(T, "the live turn", || {
        (count_in_chat(&d, "yak-77") == 1).then_some(())
    });
    assert_eq!(count_in_chat(&d, "xylophone-5150"), 1);

    // Scrolling up loads the older turns, each once.
    assert_eq!(
        count_in_chat(&d, "filler-00"),
        0,
        "older than the first page"
    );
    wait_for(T, "the oldest filler after scrolling up", || {
        d.js("document.getElementById('scroller').scrollTop = 0; return 0");
        (count_in_chat(&d, "filler-00") == 1).then_some(())
    });
    for i in 0..24 {
        assert_eq!(
            count_in_chat(&d, &format!("filler-{i:02}")),
            1,
            "filler-{i:02}"
        );
    }

    // The page's own search box, then the hit's /turn/ID alone.
    d.type_into("#q", "xylophone-5150\u{E007}");
    let href = wait_for(T, "a search hit", || {
        let v = d.js("const a = document.querySelector('#results a.hit'); return a ? a.getAttribute('href') : null");
        v.as_str().map(str::to_string)
    });
    // On the page's own path: /agent/ana/ under hive up.
    assert!(href.starts_with("/agent/ana/turn/"), "{href}");
    let text = d.js("return document.querySelector('#results a.hit').textContent");
    assert!(text.as_str().unwrap().contains("xylophone"), "{text}");
    d.goto(&format!(
        "{}{href}",
        d.js("return location.origin").as_str().unwrap()
    ));
    wait_for(T, "the turn alone", || {
        let shown = d.js("return document.body.dataset.turn || ''");
        (shown.as_str() == href.strip_prefix("/agent/ana/turn/")).then_some(())
    });
    wait_for(T, "its message", || {
        (count_in_chat(&d, "xylophone-5150") == 1).then_some(())
    });
    assert_eq!(count_in_chat(&d, "filler-23"), 0, "only that turn");
    let sizes = d.js(
        "const e = document.documentElement; return [e.scrollWidth, e.clientWidth, window.innerWidth];",
    );
    let n = |i: usize| sizes[i].as_u64().unwrap();
    assert!(n(0) <= n(1), "the page scrolls sideways: {sizes}");

    // The dashboard's search box finds it too, and its link opens the turn.
    d.goto(&format!("{}/", dash.base));
    wait_for(T, "the dashboard", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    d.click("#tabs button[data-tab=search]");
    d.type_into("#search-q", "xylophone-5150\u{E007}");
    let link = wait_for(T, "a dashboard hit", || {
        let v = d.js("const a = document.querySelector('.hit[data-agent=ana] a'); return a ? a.getAttribute('href') : null");
        v.as_str().map(str::to_string)
    });
    assert!(link.starts_with("/agent/ana/turn/"), "{link}");
    let png = d.screenshot();
    let path = artifacts().join("history-search-390px.png");
    std::fs::write(&path, png).unwrap();
    let _ = writeln!(std::io::stderr(), "screenshot: {}", path.display());
    d.goto(&format!("{}{link}", dash.base));
    wait_for(T, "the turn on the agent's page", || {
        (count_in_chat(&d, "xylophone-5150") == 1
            && d.js("return !!document.body.dataset.turn") == true)
            .then_some(())
    });
}
