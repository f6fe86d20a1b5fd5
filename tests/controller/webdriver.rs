//! Just enough of the W3C WebDriver protocol to drive headless Chromium through Debian's
//! `chromedriver`: one session, navigation, elements, script, screenshots. Plain HTTP/1.1 on
//! loopback, so no crate is needed for it.
//!
//! Why not the `fantoccini` crate (0.22.1, the well-kept WebDriver client), measured on
//! 2026-11-27 against this lock file: even with `default-features = false` (no TLS at all,
//! which loopback needs none of) it adds **47 packages** to `Cargo.lock` — two generations of
//! ICU (`icu_segmenter` 1.5 through `webdriver` 0.53, `icu_normalizer` 2.4 through `url`/`idna`)
//! with their `zerovec`/`yoke`/`tinystr`/`litemap`/`writeable` families twice over, `http`
//! 0.2 beside `http` 1, `thiserror` 1 beside 2, two `cookie`s, `time` macros — for ~200 lines
//! of test code. Its clean build did not finish within 15 minutes of wall time on the shared
//! 2-core machine (load average 13–17 at the time), so no build figure better than that could
//! be taken; the package count alone is reason enough to keep this client: it has no
//! dependency beyond `serde_json`, which the tests already use, and the protocol it speaks
//! (W3C WebDriver over HTTP/1.1) is stable.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Whether the browser is installed; `Err` says what is missing.
pub fn available() -> Result<(), String> {
    for path in [CHROMIUM, CHROMEDRIVER] {
        if !Path::new(path).exists() {
            return Err(format!(
                "{path} is missing (apt-get install chromium chromium-driver)"
            ));
        }
    }
    Ok(())
}

/// A chromedriver process with one browser session; both end on drop.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    profile: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = request(
            self.port,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// One request to chromedriver: the `value` of its answer, or the WebDriver error.
fn request(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut stream =
        TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("chromedriver: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .and_then(|_| stream.write_all(body.as_bytes()))
        .map_err(|e| format!("chromedriver: {e}"))?;
    // chromedriver may keep the connection open: read the head, then the body it announces.
    let mut raw = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    let read = |stream: &mut TcpStream, raw: &mut Vec<u8>, chunk: &mut [u8]| {
        let n = stream
            .read(chunk)
            .map_err(|e| format!("chromedriver: {e}"))?;
        raw.extend_from_slice(&chunk[..n]);
        Ok::<usize, String>(n)
    };
    let split = loop {
        if let Some(p) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        if read(&mut stream, &mut raw, &mut chunk)? == 0 {
            return Err("chromedriver: connection closed before the answer".into());
        }
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let chunked = head.contains("transfer-encoding: chunked");
    loop {
        let body = &raw[split + 4..];
        let complete = match length {
            Some(n) => body.len() >= n,
            None if chunked => body.ends_with(b"0\r\n\r\n"),
            None => false,
        };
        if complete || read(&mut stream, &mut raw, &mut chunk)? == 0 {
            break;
        }
    }
    let mut payload = raw[split + 4..].to_vec();
    if chunked {
        payload = dechunk(&payload);
    }
    let value: Value =
        serde_json::from_slice(&payload).map_err(|e| format!("chromedriver answer: {e}"))?;
    let ok = head
        .split_whitespace()
        .nth(1)
        .is_some_and(|code| code.starts_with('2'));
    if ok {
        Ok(value["value"].clone())
    } else {
        Err(format!("{method} {path}: {}", value["value"]))
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = data.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&data[..end])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = end + 2;
        out.extend_from_slice(&data[start..(start + size).min(data.len())]);
        data = &data[(start + size + 2).min(data.len())..];
    }
    out
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in text.bytes().filter_map(value) {
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

impl Browser {
    /// Starts chromedriver and a headless Chromium (a fresh profile, loopback only).
    pub fn start(width: u32, height: u32) -> Result<Browser, String> {
        available()?;
        let port = super::support::free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {CHROMEDRIVER}: {e}"))?;
        let profile =
            std::env::temp_dir().join(format!("kipam-chromium-{}-{port}", std::process::id()));
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            profile,
        };
        let start = Instant::now();
        while request(port, "GET", "/status", None).is_err() {
            if start.elapsed() > Duration::from_secs(20) {
                return Err("chromedriver did not start within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            &format!("--user-data-dir={}", browser.profile.display()),
            &format!("--window-size={width},{height}"),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args}
        }}});
        let session = request(port, "POST", "/session", Some(&caps))?;
        browser.session = session["sessionId"]
            .as_str()
            .ok_or("no session id")?
            .to_string();
        Ok(browser)
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        request(
            self.port,
            method,
            &format!("/session/{}{path}", self.session),
            body,
        )
    }

    pub fn goto(&self, url: &str) -> Result<(), String> {
        self.call("POST", "/url", Some(&json!({"url": url})))
            .map(|_| ())
    }

    fn element(&self, css: &str) -> Result<String, String> {
        let v = self.call(
            "POST",
            "/element",
            Some(&json!({"using": "css selector", "value": css})),
        )?;
        v[ELEMENT]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("no element {css}: {v}"))
    }

    pub fn click(&self, css: &str) -> Result<(), String> {
        let id = self.element(css)?;
        self.call("POST", &format!("/element/{id}/click"), Some(&json!({})))
            .map(|_| ())
    }

    /// Types `text` into the element (after clearing it).
    pub fn type_into(&self, css: &str, text: &str) -> Result<(), String> {
        let id = self.element(css)?;
        self.call("POST", &format!("/element/{id}/clear"), Some(&json!({})))?;
        self.call(
            "POST",
            &format!("/element/{id}/value"),
            Some(&json!({"text": text})),
        )
        .map(|_| ())
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub fn eval(&self, script: &str) -> Result<Value, String> {
        self.call(
            "POST",
            "/execute/sync",
            Some(&json!({"script": script, "args": []})),
        )
    }

    /// The visible text of the first element matching `css` (empty when there is none).
    pub fn text(&self, css: &str) -> String {
        let script = format!(
            "var e = document.querySelector({}); return e ? e.innerText : '';",
            json!(css)
        );
        self.eval(&script)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// Waits until `check` holds on the page's state, or fails with `what` and the page text.
    pub async fn wait_for(&self, what: &str, mut check: impl FnMut(&Browser) -> bool) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if tokio::task::block_in_place(|| check(self)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "timed out waiting for: {what}\n--- page ---\n{}",
            self.text("body")
        );
    }

    /// A PNG of the window, written to `path`.
    pub fn screenshot(&self, path: &Path) -> Result<(), String> {
        let v = self.call("GET", "/screenshot", None)?;
        let png = base64_decode(v.as_str().ok_or("no screenshot")?);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        std::fs::write(path, png).map_err(|e| e.to_string())
    }
}
