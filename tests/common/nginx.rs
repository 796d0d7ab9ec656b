//! Test kit for a real nginx (Debian's package) in front of a hive web server:
//! each [`Nginx`] runs its own `nginx` in the foreground (one process, no
//! master) from a config
//! generated into a temp dir (pid, logs and temp files there too), bound to
//! 127.0.0.1 on a free port, with nginx's default proxy settings (HTTP/1.0 to
//! the upstream, `Connection: close`, buffering on unless the answer says
//! `X-Accel-Buffering: no`) — the config `docs/fleet.md` shows as the tested
//! one, in plain HTTP or with TLS ([`Nginx::start_tls`], a self-signed
//! certificate for 127.0.0.1 that [`SelfSigned::agent`]'s clients trust).
//! Without nginx or openssl a test skips loudly, or fails under
//! `HIVE_REQUIRE_REAL_CLAUDE=1`. The process is killed on drop.

use super::hive::{wait_for, TempDir};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
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

/// The `server` block of the tested config (inside `http`, indented by four):
/// the `listen` lines ([`listen`] or [`tls_listen`]) and the [`location`]
/// to `upstream`. `docs/fleet.md` shows it without the indent.
pub fn server(listen: &str, upstream: u16) -> String {
    format!("    server {{\n{listen}{}    }}\n", location(upstream))
}

/// The `server` line of the tested plain-HTTP config before its `location`.
pub fn listen(port: u16) -> String {
    format!("        listen 127.0.0.1:{port};\n")
}

/// The `server` lines of the tested TLS config before its `location`: nginx
/// listens on `port` with TLS, with the certificate and key at those paths.
pub fn tls_listen(port: u16, cert: &Path, key: &Path) -> String {
    format!(
        "        listen 127.0.0.1:{port} ssl;\n        ssl_certificate {};\n        \
         ssl_certificate_key {};\n",
        cert.display(),
        key.display()
    )
}

/// The binary `name` on `PATH` or in `/usr/sbin`, or None after a loud
/// SKIPPED line (a panic under `HIVE_REQUIRE_REAL_CLAUDE=1`) saying that
/// `package` installs it.
fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        let msg =
            format!("{name} is not installed (run: apt-get install -y {package}; .ci/run does)");
        if std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() == Ok("1") {
            panic!("HIVE_REQUIRE_REAL_CLAUDE=1 but {msg}");
        }
        let _ = writeln!(std::io::stderr(), "SKIPPED: {msg}");
    }
    found
}

/// nginx's binary, or None after a loud SKIPPED line.
pub fn nginx() -> Option<PathBuf> {
    tool("nginx", "nginx")
}

/// A self-signed certificate for `127.0.0.1` (`subjectAltName=IP:127.0.0.1`,
/// not a CA) and its key, made by `openssl req -x509` in a temp dir.
pub struct SelfSigned {
    pub cert: PathBuf,
    pub key: PathBuf,
    _dir: TempDir,
}

impl SelfSigned {
    /// A new one, or None after a loud SKIPPED line when openssl is missing.
    pub fn make() -> Option<SelfSigned> {
        let openssl = tool("openssl", "openssl")?;
        let dir = TempDir::new("tls");
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        let out = Command::new(openssl)
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=127.0.0.1"])
            .args(["-addext", "subjectAltName=IP:127.0.0.1"])
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdin(Stdio::null())
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl req: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(SelfSigned {
            cert,
            key,
            _dir: dir,
        })
    }

    /// A ureq agent that trusts this certificate alone (and checks that it
    /// names the host it connects to), follows no redirect, and times out.
    pub fn agent(&self) -> ureq::Agent {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let pem = std::fs::read(&self.cert).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(&pem).expect("a PEM certificate"))
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        ureq::AgentBuilder::new()
            .tls_config(Arc::new(config))
            .timeout_connect(Duration::from_secs(10))
            .timeout_read(Duration::from_secs(30))
            .redirects(0)
            .build()
    }
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
        Nginx::run(bin, port, &listen(port), upstream)
    }

    /// The same with TLS: the tested config's [`tls_listen`] lines, with
    /// `tls`'s certificate.
    pub fn start_tls(bin: &Path, port: u16, upstream: u16, tls: &SelfSigned) -> Nginx {
        Nginx::run(bin, port, &tls_listen(port, &tls.cert, &tls.key), upstream)
    }

    fn run(bin: &Path, port: u16, listen: &str, upstream: u16) -> Nginx {
        let dir = TempDir::new("nginx");
        let d = dir.path().display().to_string();
        let conf = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n    access_log {d}/access.log;\n    client_body_temp_path {d}/body;\n    \
             proxy_temp_path {d}/proxy;\n    fastcgi_temp_path {d}/fastcgi;\n    \
             uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n{}}}\n",
            server(listen, upstream)
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

    /// `https://127.0.0.1:PORT`, for one started with TLS.
    pub fn https(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
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
