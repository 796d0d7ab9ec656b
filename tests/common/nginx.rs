//! Test kit for a real nginx (Debian's package) in front of a hive web server:
//! each [`Nginx`] runs its own `nginx` in the foreground (one process, no
//! master) from a config
//! generated into a temp dir (pid, logs and temp files there too), bound to
//! 127.0.0.1 on a free port, with nginx's default proxy settings (HTTP/1.0 to
//! the upstream, `Connection: close`, buffering on unless the answer says
//! `X-Accel-Buffering: no`) — the config `docs/fleet.md` shows as the tested
//! one. Without nginx a test skips loudly, or fails under
//! `HIVE_REQUIRE_REAL_CLAUDE=1`. The process is killed on drop.

use super::hive::{wait_for, TempDir};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `location` block of the tested reverse-proxy config: everything to
/// the hive server at `upstream`, the `Host` the browser sent passed on (the
/// server must list it: `HIVE_WEB_HOSTS`, `HIVE_DASHBOARD_HOSTS`), and
/// nothing else changed.
pub fn location(upstream: u16) -> String {
    format!(
        "        location / {{\n            proxy_pass http://127.0.0.1:{upstream};\n            \
         proxy_set_header Host $http_host;\n        }}\n"
    )
}

/// nginx's binary, or None after a loud SKIPPED line.
pub fn nginx() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file());
    if found.is_none() {
        let msg = "nginx is not installed (run: apt-get install -y nginx; .ci/run does)";
        if std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() == Ok("1") {
            panic!("HIVE_REQUIRE_REAL_CLAUDE=1 but {msg}");
        }
        let _ = writeln!(std::io::stderr(), "SKIPPED: {msg}");
    }
    found
}

/// A free port on 127.0.0.1 (free when asked; nginx binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One running nginx.
pub struct Nginx {
    pub port: u16,
    dir: TempDir,
    child: Child,
}

impl Nginx {
    /// Starts `bin` on `port` (from [`free_port`]) proxying to `upstream`, and
    /// waits until it accepts connections.
    pub fn start(bin: &Path, port: u16, upstream: u16) -> Nginx {
        let dir = TempDir::new("nginx");
        let d = dir.path().display().to_string();
        let conf = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n    access_log {d}/access.log;\n    client_body_temp_path {d}/body;\n    \
             proxy_temp_path {d}/proxy;\n    fastcgi_temp_path {d}/fastcgi;\n    \
             uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n    \
             server {{\n        listen 127.0.0.1:{port};\n{}    }}\n}}\n",
            location(upstream)
        );
        let file = dir.path().join("nginx.conf");
        std::fs::write(&file, conf).unwrap();
        let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
        let child = Command::new(bin)
            .arg("-c")
            .arg(&file)
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nginx");
        let mut n = Nginx { port, dir, child };
        wait_for(Duration::from_secs(20), "nginx to listen", || {
            if let Ok(Some(st)) = n.child.try_wait() {
                panic!("nginx exited with {st}: {}", n.log());
            }
            TcpStream::connect(("127.0.0.1", port)).ok().map(|_| ())
        });
        n
    }

    /// `http://127.0.0.1:PORT`
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its error log and what it printed.
    pub fn log(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        format!("{}{}", read("stderr.log"), read("error.log"))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
