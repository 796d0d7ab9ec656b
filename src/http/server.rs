//! The HTTP core both of hive's web servers share — the agent page of
//! `hive serve` (`web::start`) and the operator dashboard of `hive up`
//! (`fleet::dashboard`): the listening socket with its read and send timeouts,
//! the patched tiny_http server with bounded request heads, the named worker
//! threads, and [`dispatch`], the one function every request goes through. A
//! server is a [`Site`]: its state, its [`Guard`] and its route table.
//! A handler is reachable only through a route, and `dispatch` runs the guard
//! (host, token, same-origin) before it looks at a route's handler, so an
//! endpoint added to a table cannot skip the guard. No body is read before the
//! guard (and for the login form, the throttle) has passed the request's
//! head, and a body still on the socket is read on a thread of its own
//! (`http-body`) under a size and a time bound, the handler then running
//! there: a client that stalls its body costs one connection, never one of
//! the few workers. `HEAD` is answered wherever `GET` is, without the body.

use super::guard::{Client, Guard};
use crate::http::{self, Reply};
use crate::sys::env::Env;
use crate::sys::fd::set_socket_timeouts;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiny_http::{Limits, Request, Server};

/// The variable `hive up` names an agent page's inherited listening socket
/// in (a descriptor number): the page then answers on that unix socket only.
pub const INHERITED_FD_VAR: &str = "HIVE_WEB_FD";

/// The `Host` `hive up` sends a page it reaches through its socket.
pub const SOCKET_HOST: &str = "localhost";

/// Socket timeouts of a server; accepted connections inherit them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeouts {
    /// `HIVE_WEB_READ_TIMEOUT_SECS`: a read that waits this long fails. An idle
    /// keep-alive connection is closed after it, a request whose head or body
    /// stalls is refused; the whole body must also arrive within it.
    pub read: Duration,
    /// `HIVE_WEB_SEND_TIMEOUT_SECS`: a write to a client that makes no progress
    /// for this long fails, which drops that client.
    pub send: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            read: Duration::from_secs(10),
            send: Duration::from_secs(30),
        }
    }
}

impl Timeouts {
    /// `HIVE_WEB_READ_TIMEOUT_SECS` and `HIVE_WEB_SEND_TIMEOUT_SECS` (at least 1 s).
    pub fn read(env: &Env) -> Result<Timeouts, String> {
        let d = Timeouts::default();
        let one = Duration::from_secs(1);
        Ok(Timeouts {
            read: env
                .secs("HIVE_WEB_READ_TIMEOUT_SECS", d.read.as_secs())?
                .max(one),
            send: env
                .secs("HIVE_WEB_SEND_TIMEOUT_SECS", d.send.as_secs())?
                .max(one),
        })
    }
}

/// Binds `addr` with both socket timeouts set on the listener: Linux copies
/// socket options to accepted sockets, and tiny_http sets none. `what` names
/// the server and `hint` says how to pick another port, for the error.
pub fn bind(addr: SocketAddr, t: Timeouts, what: &str, hint: &str) -> Result<TcpListener, String> {
    let l = TcpListener::bind(addr)
        .map_err(|e| format!("cannot listen on {addr} for {what}: {e} ({hint})"))?;
    set_socket_timeouts(&l, t.send, t.read)
        .map_err(|e| format!("cannot set the socket timeouts of {what}: {e}"))?;
    Ok(l)
}

/// The methods a route answers (`Get` answers `HEAD` too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

/// Which request paths a route takes.
#[derive(Debug, Clone, Copy)]
pub enum Path {
    Exact(&'static str),
    /// Every path that starts with this.
    Prefix(&'static str),
    /// Every path (the agent page's static files); list it last.
    Any,
}

impl Path {
    fn matches(&self, path: &str) -> bool {
        match self {
            Path::Exact(p) => path == *p,
            Path::Prefix(p) => path.starts_with(p),
            Path::Any => true,
        }
    }
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Only a request with the server's token (unless the operator turned it
    /// off).
    Token,
    /// Anyone: the login page. Its form post is the one that need not be JSON,
    /// and its attempts are throttled (per peer and in all).
    Login,
    /// The server's token, or a token the site accepts for this path alone
    /// ([`Site::scoped`]: under `hive up`, an agent's own token for
    /// `/agent/NAME/…`), sent in a header.
    Scoped,
}

/// What a request gets once the guard let it through.
pub struct Ctx<'a> {
    /// The server's guard (the login page compares its token).
    pub guard: &'a Guard,
    pub path: &'a str,
    pub query: &'a str,
    /// The `Host` header as sent (it names this server).
    pub host: &'a str,
    pub peer: Option<SocketAddr>,
    /// Who the request comes from (its login session, else its address).
    pub client: &'a Client,
    /// The request is a `HEAD`: the answer's body is not sent.
    pub head: bool,
    /// The body of a POST (JSON, or the login form), read whole; empty for GET.
    pub body: Vec<u8>,
}

/// A route's code.
pub enum Handler<A: 'static> {
    /// Answers with a reply.
    Reply(fn(&A, &Ctx<'_>) -> Reply),
    /// Takes the connection (the live streams); a `HEAD` gets the stream's
    /// headers instead.
    Stream(fn(&A, Request, &Ctx<'_>)),
    /// Takes the connection, whatever the method (`HEAD` too), and answers
    /// it itself: a request `hive up` passes on to an agent's page.
    Take(fn(&A, Request, &Ctx<'_>)),
}

pub struct Route<A: 'static> {
    pub method: Method,
    pub path: Path,
    pub access: Access,
    pub handler: Handler<A>,
}

// By hand: a derive would want `A: Clone`, but a route only holds fn pointers.
impl<A> Clone for Handler<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Handler<A> {}

impl<A> Clone for Route<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Route<A> {}

/// One server: its state, its guard and its route table.
pub struct Site<A: 'static> {
    pub app: A,
    pub guard: Guard,
    pub routes: Vec<Route<A>>,
    /// The time a whole request body may take to arrive.
    pub body_time: Duration,
    /// For [`Access::Scoped`] routes: whether a token (not the server's)
    /// opens this path.
    pub scoped: Option<fn(&A, &str, &str) -> bool>,
}

/// The largest body the login form may have.
const LOGIN_BODY: usize = 4096;
/// The longest the login form's body may take to arrive (at most the site's
/// `body_time`).
const LOGIN_BODY_TIME: Duration = Duration::from_secs(2);

/// What stops a server: its sender is never used, only dropped, which
/// disconnects every receiver [`StopSwitch::watch`] handed out (the live
/// streams, the server's own helper threads) at once.
pub struct StopSwitch {
    tx: Option<crossbeam_channel::Sender<()>>,
    rx: crossbeam_channel::Receiver<()>,
}

impl StopSwitch {
    pub fn new() -> StopSwitch {
        let (tx, rx) = crossbeam_channel::bounded(0);
        StopSwitch { tx: Some(tx), rx }
    }

    /// A receiver that disconnects when the server stops.
    pub fn watch(&self) -> crossbeam_channel::Receiver<()> {
        self.rx.clone()
    }

    fn flip(&mut self) {
        self.tx = None;
    }
}

impl Default for StopSwitch {
    fn default() -> StopSwitch {
        StopSwitch::new()
    }
}

/// The stack of every thread that answers a request (`NAME-conn`, and
/// `http-body`): a handler parses a JSON body of up to [`http::MAX_BODY`],
/// nested to serde_json's recursion limit (128) at most, and renders a page.
/// A test parses such a body on a thread of this size.
pub const CONN_STACK: usize = 512 * 1024;

/// A running server: its accept thread (`http-accept`) and the connection
/// threads it starts (`NAME-conn`, one per open connection, each answering
/// that connection's requests itself through [`dispatch`] and ending a few
/// seconds after it closes), so an idle server holds the accept thread alone.
/// [`Workers::stop`] (or dropping it) stops accepting and ends everything
/// that watches its [`StopSwitch`].
pub struct Workers {
    server: Option<Server>,
    switch: StopSwitch,
}

impl Workers {
    /// Flips the stop switch (every live stream ends) and closes the
    /// listener (the accept thread ends). A request being answered is
    /// answered.
    pub fn stop(&mut self) {
        self.switch.flip();
        self.server.take();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts the server that answers `site`'s requests on its connection
/// threads, named `NAME-conn`, until [`Workers::stop`]. The tiny_http server
/// (and its listener) goes with the returned [`Workers`].
pub fn start<A: Send + Sync + 'static>(
    name: &str,
    listener: impl Into<tiny_http::Listener>,
    site: Arc<Site<A>>,
    switch: StopSwitch,
) -> Result<Workers, String> {
    let serve: tiny_http::Serve = Arc::new(move |req| dispatch(&site, req));
    let conn_name = format!("{name}-conn");
    let server =
        Server::from_listener_serving(listener, Limits::default(), serve, CONN_STACK, conn_name)
            .map_err(|e| format!("cannot start the {name} server: {e}"))?;
    Ok(Workers {
        server: Some(server),
        switch,
    })
}

/// Answers one request: the guard, then the route table, then the body (see
/// the module's note on bodies), then the handler.
pub fn dispatch<A: Send + Sync + 'static>(site: &Arc<Site<A>>, mut req: Request) {
    let url = req.url().to_string();
    let (path, query) = http::split_url(&url);
    let method = req.method().as_str().to_ascii_uppercase();
    let guard = &site.guard;

    let host = match guard.host(&req) {
        Ok(h) => h,
        Err(r) => return respond(req, r),
    };
    // A path a route names is that route's alone; `Path::Any` takes the rest.
    let named: Vec<&Route<A>> = site
        .routes
        .iter()
        .filter(|r| !matches!(r.path, Path::Any) && r.path.matches(path))
        .collect();
    let on_path = if named.is_empty() {
        site.routes
            .iter()
            .filter(|r| matches!(r.path, Path::Any))
            .collect()
    } else {
        named
    };
    let login = on_path.iter().any(|r| r.access == Access::Login);
    let scoped = on_path.iter().any(|r| r.access == Access::Scoped);
    let client = match guard.client(&req) {
        Some(c) => c,
        None if login => Client::peer(&req),
        None if scoped && scoped_token(site, &req, path) => Client::peer(&req),
        None => {
            let r = guard.unauthorized(&req, path);
            return respond(req, r);
        }
    };
    let wanted = match method.as_str() {
        "GET" | "HEAD" => Some(Method::Get),
        "POST" => Some(Method::Post),
        _ => None,
    };
    let Some(route) = on_path
        .iter()
        .find(|r| Some(r.method) == wanted)
        .map(|r| **r)
    else {
        let r = if on_path.is_empty() {
            Reply::not_found()
        } else {
            let mut allowed = Vec::new();
            for r in &on_path {
                match r.method {
                    Method::Get => allowed.extend(["GET", "HEAD"]),
                    Method::Post => allowed.push("POST"),
                }
            }
            allowed.dedup();
            Reply::method_not_allowed(&allowed)
        };
        return respond(req, r);
    };
    let post = route.method == Method::Post;
    if post {
        if let Err(r) = guard.same_origin(&req, &host, login) {
            return respond(req, r);
        }
    }
    if login && (post || !query.is_empty()) {
        if let Err(r) = guard.login_attempt(req.remote_addr().map(|a| a.ip())) {
            return respond(req, r);
        }
    }
    let head = Head {
        path: path.to_string(),
        query: query.to_string(),
        host,
        client,
        head: method == "HEAD",
    };
    if !post {
        return run(site, &route, req, &head, Vec::new());
    }
    let (max, time) = if login {
        (LOGIN_BODY, LOGIN_BODY_TIME.min(site.body_time))
    } else {
        (http::MAX_BODY, site.body_time)
    };
    if !req.body_pending() {
        // In memory already: reading it cannot wait on the client.
        return match http::read_body(&mut req, max, Instant::now() + time) {
            Ok(body) => run(site, &route, req, &head, body),
            Err(r) => respond(req, r),
        };
    }
    // The request goes to the thread once it runs, so a thread that cannot
    // start leaves it here to be answered.
    let (tx, rx) = crossbeam_channel::bounded::<Request>(1);
    let s = site.clone();
    let reader = std::thread::Builder::new()
        .name("http-body".into())
        .stack_size(CONN_STACK)
        .spawn(move || {
            let Ok(mut req) = rx.recv() else { return };
            match http::read_body(&mut req, max, Instant::now() + time) {
                Ok(body) => run(&s, &route, req, &head, body),
                Err(r) => respond(req, r),
            }
        });
    match reader {
        Ok(_) => {
            let _ = tx.send(req);
        }
        Err(e) => {
            log::warn!("cannot start a thread to read a request body: {e}");
            let r = Reply::error(503, "the server is out of threads; try again")
                .header("Retry-After", "1");
            respond(req, r)
        }
    }
}

/// True when `req` sends, in a header, a token `site` accepts for `path`
/// alone (never a cookie: a browser logs in to the whole server).
fn scoped_token<A>(site: &Site<A>, req: &Request, path: &str) -> bool {
    let Some(accepts) = site.scoped else {
        return false;
    };
    match super::auth::presented(req, "") {
        Some(super::auth::Presented::Header(t)) => !t.is_empty() && accepts(&site.app, path, &t),
        _ => false,
    }
}

/// What the guard learnt of a request's head, for its handler.
struct Head {
    path: String,
    query: String,
    host: String,
    client: Client,
    head: bool,
}

/// Runs `route`'s handler on `req` (whose `body` has been read).
fn run<A>(site: &Site<A>, route: &Route<A>, req: Request, head: &Head, body: Vec<u8>) {
    let ctx = Ctx {
        guard: &site.guard,
        path: &head.path,
        query: &head.query,
        host: &head.host,
        peer: req.remote_addr().copied(),
        client: &head.client,
        head: head.head,
        body,
    };
    match route.handler {
        Handler::Reply(f) => {
            let r = f(&site.app, &ctx);
            respond(req, r)
        }
        Handler::Stream(_) if ctx.head => {
            let r = Reply::new(200, "text/event-stream; charset=utf-8", "")
                .header("Cache-Control", "no-store");
            respond(req, r)
        }
        Handler::Stream(f) | Handler::Take(f) => f(&site.app, req, &ctx),
    }
}

/// Sends `reply`. (A body left unread closes the connection after the answer,
/// which then says `Connection: close`: see the vendored tiny_http.)
fn respond(req: Request, reply: Reply) {
    let (method, url) = (req.method().to_string(), req.url().to_string());
    if let Err(e) = req.respond(reply.into_response()) {
        let path = http::split_url(&url).0;
        log::debug!("{method} {path}: the client went away: {e}");
    }
}
