//! An agent's page with scripts of its own (`web.script_pages`): a
//! `frontend.dist` or an overlay's games need their scripts to run, which the
//! hive's origin never allows (everything a page answers there carries
//! `Content-Security-Policy: sandbox`). Such a page gets a loopback listener
//! of its own, an origin apart from the hive's, where `hive up` passes every
//! request on to that one agent's page ([`super::pass_to_page`], the same
//! filtered relay as under `/agent/NAME/`, with the page's own policy). It
//! takes the hive's one login (the browser sends the hive's cookie to every
//! port of the host; `hive up` checks it here and never passes it on) or
//! that agent's own token, and nothing else: not the dashboard's API, not
//! another agent's page. A script there is another origin to the hive, so
//! the dashboard's Origin and `Sec-Fetch-Site` checks refuse its changes and
//! the browser keeps the dashboard's answers from it. `docs/fleet.md` says
//! how to use it, `docs/security.md` what it gives an agent.

use super::{agent_token, supervision_of, App};
use crate::http::guard::{Guard, Names};
use crate::http::server::{self, Access, Ctx, Handler, Method, Path, Route, Site, Timeouts};
use crate::http::{auth, Reply};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

/// One page's listener: which agent it serves, and the hive's dashboard
/// (its agents, tokens, live-stream places and login).
struct Own {
    name: String,
    dash: Arc<Site<App>>,
}

/// Binds each page's listener (before any agent starts, as the dashboard's
/// own): an address in use is a start error naming its key.
pub(super) fn bind(
    pages: &[(String, SocketAddr)],
    t: Timeouts,
) -> Result<Vec<(String, TcpListener, u16)>, String> {
    let mut out = Vec::with_capacity(pages.len());
    for (name, addr) in pages {
        let key = format!("web.script_pages.{name}");
        let hint = format!("set {key} to a free port");
        let listener =
            server::bind(*addr, t, &format!("{name}'s script page"), &hint).map_err(|e| {
                match TcpListener::bind(addr) {
                    Err(b) if b.kind() == std::io::ErrorKind::AddrInUse => format!(
                        "cannot listen on {addr} ({key} in the fleet file): it is in use \
                     (another hive up?); stop that process, or {hint}"
                    ),
                    _ => e,
                }
            })?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("cannot read the address of {key}: {e}"))?
            .port();
        out.push((name.clone(), listener, port));
    }
    Ok(out)
}

/// Starts the workers of each bound page listener.
pub(super) fn start(
    dash: &Arc<Site<App>>,
    bound: Vec<(String, TcpListener, u16)>,
) -> Result<Vec<server::Workers>, String> {
    let mut running = Vec::with_capacity(bound.len());
    for (name, listener, port) in bound {
        let ip = listener
            .local_addr()
            .map_err(|e| format!("cannot read the address of web.script_pages.{name}: {e}"))?
            .ip();
        let guard = Guard::new(
            Names {
                what: "an agent's page with scripts of its own",
                token_hint: "the hive's login, or that agent's own token",
                hosts_var: "web.script_pages (it answers on loopback only)",
            },
            ip,
            port,
            &[],
            dash.guard.token().map(str::to_string),
            dash.guard.cookie().to_string(),
        );
        let site = Arc::new(Site {
            app: Own {
                name: name.clone(),
                dash: dash.clone(),
            },
            guard,
            routes: ROUTES.to_vec(),
            body_time: dash.body_time,
            scoped: Some(own_token),
        });
        let switch = server::StopSwitch::new();
        running.push(server::start("script-page", listener, site, switch)?);
    }
    Ok(running)
}

/// Every path of the page's listener: `/login` sends the browser to the
/// hive's login (which returns to this page), anything else is the page's.
static ROUTES: &[Route<Own>] = &[
    Route {
        method: Method::Get,
        path: Path::Exact("/login"),
        access: Access::Login,
        handler: Handler::Reply(|own, _| login(own)),
    },
    Route {
        method: Method::Get,
        path: Path::Any,
        access: Access::Scoped,
        handler: Handler::Take(pass),
    },
    Route {
        method: Method::Post,
        path: Path::Any,
        access: Access::Scoped,
        handler: Handler::Take(pass),
    },
];

/// The hive's login, returning to this page (through the hive's
/// `/agent/NAME/own`, a path of the hive's origin, which `next` must be).
fn login(own: &Own) -> Reply {
    Reply::redirect(&format!(
        "{}login?next=/agent/{}/own",
        own.dash.app.base_url(),
        own.name
    ))
}

/// True when `token` is this page's agent's own token (any path here is
/// that agent's page).
fn own_token(own: &Own, _path: &str, token: &str) -> bool {
    let Ok(sup) = supervision_of(&own.dash.app, &own.name) else {
        return false;
    };
    agent_token(&own.dash.app, &own.name, Some(&sup))
        .is_some_and(|want| auth::ct_eq(want.as_bytes(), token.as_bytes()))
}

/// Passes the request on to the page, as the hive's origin does under
/// `/agent/NAME/`, but with the page's own policy.
fn pass(own: &Own, req: tiny_http::Request, c: &Ctx<'_>) {
    let sup = match supervision_of(&own.dash.app, &own.name) {
        Ok(s) => s,
        Err(e) => {
            let _ = req.respond(Reply::error(404, e).into_response());
            return;
        }
    };
    let what = c.path.trim_start_matches('/');
    super::pass_to_page(&own.dash.app, req, c, &sup, what, true);
}
