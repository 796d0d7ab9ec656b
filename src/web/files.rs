//! Files the web UI serves: the page embedded in the binary (or a whole
//! replacement dist from `HIVE_WEB_DIST`), the `HIVE_STATIC_DIR` overlay, and the
//! agent icon. A request path is decoded once and refused when it holds a `..`
//! segment, a NUL or a backslash; a file that resolves (through symlinks) outside
//! its root is refused too.

use crate::http::{percent_decode, Body, Reply};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The built-in page: one HTML file with its CSS and JS.
pub const PAGE: &str = include_str!("page.html");

/// The shared hive mark, for agents without an icon of their own.
pub const DEFAULT_ICON: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64"><path fill="#f2b632" d="M32 3l25 14.5v29L32 61 7 46.5v-29z"/><path fill="#1d232b" d="M32 14l15.6 9v18L32 50l-15.6-9V23z"/><path fill="#f2b632" d="M32 23l7.8 4.5v9L32 41l-7.8-4.5v-9z"/></svg>"##;

/// Why a path was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum PathError {
    /// Malformed escapes, `..`, NUL or backslash: a 400.
    Bad(&'static str),
}

/// The relative file path a decoded request path names.
pub fn relative_path(raw: &str) -> Result<PathBuf, PathError> {
    let path = percent_decode(raw, false).ok_or(PathError::Bad("malformed %-escape"))?;
    if path.contains('\0') {
        return Err(PathError::Bad("NUL in path"));
    }
    if path.contains('\\') {
        return Err(PathError::Bad("backslash in path"));
    }
    let mut rel = PathBuf::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => return Err(PathError::Bad("`..` in path")),
            s => rel.push(s),
        }
    }
    Ok(rel)
}

/// The file `rel` names under `root`, if it exists and stays inside `root` after
/// symlinks are resolved; a directory means its `index.html`.
pub fn resolve(root: &Path, rel: &Path) -> Option<PathBuf> {
    let root = root.canonicalize().ok()?;
    let mut file = root.join(rel).canonicalize().ok()?;
    if file.is_dir() {
        file = file.join("index.html").canonicalize().ok()?;
    }
    if !file.starts_with(&root) {
        log::warn!(
            "refused {}: it resolves outside {}",
            rel.display(),
            root.display()
        );
        return None;
    }
    file.is_file().then_some(file)
}

pub fn content_type(path: &Path) -> &'static str {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    match ext.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "ico" => "image/x-icon",
        "wasm" => "application/wasm",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "txt" | "md" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// Serves a file found on disk.
pub fn file_reply(path: &Path) -> Reply {
    match File::open(path).and_then(|f| Ok((f.metadata()?.len() as usize, f))) {
        Ok((len, f)) => Reply {
            status: 200,
            content_type: content_type(path).into(),
            body: Body::File(f, len),
            headers: vec![("Cache-Control", "no-cache".into())],
        },
        Err(e) => Reply::error(500, format!("cannot read {}: {e}", path.display())),
    }
}

/// A static path: from the replacement dist, else the embedded page at `/`,
/// else the overlay. None when nothing matches.
pub fn serve(dist: Option<&Path>, overlay: Option<&Path>, raw_path: &str) -> Option<Reply> {
    let rel = match relative_path(raw_path) {
        Ok(rel) => rel,
        Err(PathError::Bad(why)) => return Some(Reply::error(400, format!("refused path: {why}"))),
    };
    match dist {
        Some(dist) => {
            if let Some(f) = resolve(dist, &rel) {
                return Some(file_reply(&f));
            }
        }
        None => {
            if rel.as_os_str().is_empty() || rel == Path::new("index.html") {
                return Some(page());
            }
        }
    }
    overlay
        .and_then(|root| resolve(root, &rel))
        .map(|f| file_reply(&f))
}

pub fn page() -> Reply {
    Reply::new(200, "text/html; charset=utf-8", PAGE)
        .header("Cache-Control", "no-cache")
        .header("Content-Security-Policy", crate::http::page_csp(PAGE))
}

/// `GET /icon`: the configured SVG, or the built-in mark when none is set or it
/// cannot be read.
pub fn icon(configured: Option<&Path>) -> Reply {
    let svg = configured.and_then(|p| match std::fs::read(p) {
        Ok(b) => Some(b),
        Err(e) => {
            log::warn!(
                "cannot read HIVE_ICON {}: {e}; serving the built-in mark",
                p.display()
            );
            None
        }
    });
    Reply::new(
        200,
        "image/svg+xml",
        svg.unwrap_or_else(|| DEFAULT_ICON.as_bytes().to_vec()),
    )
    .header("Cache-Control", "max-age=300")
    .header(
        "Content-Security-Policy",
        "default-src 'none'; style-src 'unsafe-inline'",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        let ok = [
            ("/", ""),
            ("/a/b.js", "a/b.js"),
            ("/a//./b", "a/b"),
            ("/a%20b", "a b"),
        ];
        for (raw, want) in ok {
            assert_eq!(relative_path(raw).unwrap(), PathBuf::from(want), "{raw}");
        }
        for raw in [
            "/../etc/passwd",
            "/a/../../b",
            "/%2e%2e/x",
            "/%2E%2E%2fx",
            "/a%00b",
            "/a\\..\\b",
            "/%zz",
        ] {
            assert!(relative_path(raw).is_err(), "{raw} should be refused");
        }
    }

    #[test]
    fn symlinks_out_of_the_root_are_refused() {
        let dir = std::env::temp_dir().join(format!("hive-web-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(dir.join("secret"), "s").unwrap();
        std::fs::write(root.join("sub/index.html"), "i").unwrap();
        std::os::unix::fs::symlink(dir.join("secret"), root.join("leak")).unwrap();
        std::os::unix::fs::symlink(root.join("sub/index.html"), root.join("inside")).unwrap();
        assert_eq!(resolve(&root, Path::new("leak")), None);
        assert!(resolve(&root, Path::new("inside")).is_some());
        assert!(resolve(&root, Path::new("sub"))
            .unwrap()
            .ends_with("sub/index.html"));
        assert_eq!(resolve(&root, Path::new("missing")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_embedded_page_is_served_at_the_root_only_without_a_dist() {
        assert_eq!(serve(None, None, "/").unwrap().status, 200);
        assert!(serve(None, None, "/nope.js").is_none());
        assert_eq!(serve(None, None, "/%2e%2e/x").unwrap().status, 400);
    }
}
