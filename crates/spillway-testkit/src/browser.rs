//! A real browser for tests: headless Chromium driven through
//! `chromedriver` over the WebDriver protocol (W3C, plain HTTP and JSON).
//!
//! [`Browser::start`] runs `chromedriver` on a free loopback port and opens
//! a session on `/usr/bin/chromium` with a throwaway profile; dropping the
//! [`Browser`] ends the session and kills `chromedriver` and every process
//! it started. The HTTP client is a small blocking HTTP/1.1 one over
//! [`TcpStream`] (one connection per command, `Connection: close`): a
//! WebDriver command is a request and an answer on loopback, so nothing
//! more is needed, and the fixture pulls in no HTTP client crate.
//!
//! Missing programs fail the test saying how to install them (Debian's
//! `chromium` and `chromium-driver` packages; `scripts/setup.sh` does it).
//!
//! ```no_run
//! use std::time::Duration;
//! use spillway_testkit::browser::Browser;
//!
//! let b = Browser::start();
//! b.navigate("http://127.0.0.1:9090/admin/").unwrap();
//! let title = b.wait_until("a heading", Duration::from_secs(10), |b| {
//!     b.find("h1").ok()?.text().ok()
//! });
//! assert_eq!(title, "spillway");
//! ```

use std::fmt;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{TempDir, free_port};

/// Where Debian's `chromium` package puts the browser.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Where Debian's `chromium-driver` package puts the driver.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// The WebDriver name of an element reference in JSON.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long one WebDriver command may take: a navigation waits for the
/// page's load event, which on two busy cores can take seconds.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// A failed WebDriver command.
#[derive(Debug, Clone)]
pub struct Error {
    /// The WebDriver error code (`no such element`, `javascript error`),
    /// or `transport` when the driver could not be reached or answered
    /// something that is not WebDriver JSON.
    pub code: String,
    /// The driver's message, or what went wrong on the way.
    pub message: String,
}

impl Error {
    fn transport(message: impl Into<String>) -> Error {
        Error {
            code: "transport".into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "webdriver: {}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

/// Fails the test unless Chromium and chromedriver are installed.
fn require_browser() {
    for p in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            Path::new(p).exists(),
            "{p} is missing: install with: apt-get install chromium chromium-driver (scripts/setup.sh does it)"
        );
    }
}

/// A headless Chromium session, ended (and its processes killed) on drop.
#[derive(Debug)]
pub struct Browser {
    driver: Option<Child>,
    port: u16,
    session: String,
    /// Holds the browser profile and the driver's log; removed on drop.
    dir: TempDir,
}

impl Browser {
    /// Starts `chromedriver` and a headless Chromium session, window
    /// 1400x1000.
    ///
    /// # Panics
    ///
    /// When `/usr/bin/chromium` or `/usr/bin/chromedriver` is missing, or
    /// the driver does not come up or refuses the session within 30 s (the
    /// message includes the driver's log).
    pub fn start() -> Browser {
        require_browser();
        let port = free_port();
        let dir = TempDir::new(&format!("chromium-{port}"));
        let log = std::fs::File::create(dir.0.join("chromedriver.log")).expect("driver log");
        let mut cmd = Command::new(CHROMEDRIVER);
        cmd.arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("driver log"))
            .stderr(log);
        // Its own process group: on drop the whole group (driver, browser
        // and the browser's helpers) is killed, even if the driver died.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let driver = cmd.spawn().expect("start chromedriver");
        let mut b = Browser {
            driver: Some(driver),
            port,
            session: String::new(),
            dir,
        };
        b.wait_driver(Duration::from_secs(30));
        let profile = b.dir.0.join("profile");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "pageLoadStrategy": "normal",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--window-size=1400,1000",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }}});
        match b.command("POST", "/session", Some(&caps)) {
            Ok(v) => {
                b.session = v["sessionId"].as_str().unwrap_or_default().to_string();
                assert!(!b.session.is_empty(), "no session id in {v}");
            }
            Err(e) => panic!(
                "chromedriver refused a Chromium session: {e}\nits log:\n{}",
                b.driver_log()
            ),
        }
        b
    }

    fn wait_driver(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(v) = self.command("GET", "/status", None)
                && v["ready"] == true
            {
                return;
            }
            if let Some(Ok(Some(status))) = self.driver.as_mut().map(Child::try_wait) {
                panic!(
                    "chromedriver exited ({status}); its log:\n{}",
                    self.driver_log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not answer on port {} within {timeout:?}; its log:\n{}",
                self.port,
                self.driver_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What `chromedriver` printed so far (for failure messages).
    pub fn driver_log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("chromedriver.log")).unwrap_or_default()
    }

    /// The directory holding the browser profile (removed on drop).
    pub fn dir(&self) -> &PathBuf {
        &self.dir.0
    }

    /// Sends one WebDriver command; `path` is relative to the driver's
    /// root. Answers the `value` of a successful reply.
    ///
    /// # Errors
    ///
    /// The driver's error (its code and message), or a transport error.
    pub fn command(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, Error> {
        let body = body.map(Value::to_string);
        let (status, text) = http(self.port, method, path, body.as_deref())?;
        let mut v: Value = serde_json::from_str(&text).map_err(|e| {
            Error::transport(format!(
                "{method} {path}: HTTP {status}, not JSON ({e}): {text:.200}"
            ))
        })?;
        let value = v["value"].take();
        if (200..300).contains(&status) {
            return Ok(value);
        }
        Err(Error {
            code: value["error"]
                .as_str()
                .unwrap_or("unknown error")
                .to_string(),
            message: value["message"].as_str().unwrap_or(&text).to_string(),
        })
    }

    /// A command on this session: `rest` follows `/session/{id}`.
    fn session_cmd(&self, method: &str, rest: &str, body: Option<&Value>) -> Result<Value, Error> {
        self.command(method, &format!("/session/{}{rest}", self.session), body)
    }

    /// Loads `url` and waits for its load event.
    ///
    /// # Errors
    ///
    /// When the page cannot be loaded.
    pub fn navigate(&self, url: &str) -> Result<(), Error> {
        self.session_cmd("POST", "/url", Some(&json!({ "url": url })))
            .map(drop)
    }

    /// The first element matching a CSS selector.
    ///
    /// # Errors
    ///
    /// `no such element` when none matches (yet).
    pub fn find(&self, css: &str) -> Result<Element<'_>, Error> {
        let v = self.session_cmd(
            "POST",
            "/element",
            Some(&json!({"using": "css selector", "value": css})),
        )?;
        Element::from_json(self, &v)
    }

    /// Every element matching a CSS selector, in document order.
    ///
    /// # Errors
    ///
    /// When the selector is invalid or the session is gone.
    pub fn find_all(&self, css: &str) -> Result<Vec<Element<'_>>, Error> {
        let v = self.session_cmd(
            "POST",
            "/elements",
            Some(&json!({"using": "css selector", "value": css})),
        )?;
        v.as_array()
            .ok_or_else(|| Error::transport(format!("elements: not a list: {v}")))?
            .iter()
            .map(|e| Element::from_json(self, e))
            .collect()
    }

    /// Runs `script` as the body of a function in the page (its arguments
    /// are `arguments[0]`...) and answers what it returns.
    ///
    /// # Errors
    ///
    /// `javascript error` when the script throws.
    pub fn execute(&self, script: &str, args: &[Value]) -> Result<Value, Error> {
        self.session_cmd(
            "POST",
            "/execute/sync",
            Some(&json!({"script": script, "args": args})),
        )
    }

    /// Makes the page's viewport exactly `width` x `height` CSS pixels
    /// (the window size includes the browser's own bars), through the
    /// DevTools protocol that chromedriver passes on.
    ///
    /// # Errors
    ///
    /// When the driver refuses the command.
    pub fn set_viewport(&self, width: u32, height: u32) -> Result<(), Error> {
        let params =
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false});
        self.session_cmd(
            "POST",
            "/goog/cdp/execute",
            Some(&json!({"cmd": "Emulation.setDeviceMetricsOverride", "params": params})),
        )
        .map(drop)
    }

    /// A PNG of the viewport.
    ///
    /// # Errors
    ///
    /// When the driver cannot take one or answers bad base64.
    pub fn screenshot(&self) -> Result<Vec<u8>, Error> {
        let v = self.session_cmd("GET", "/screenshot", None)?;
        let text = v
            .as_str()
            .ok_or_else(|| Error::transport(format!("screenshot: not a string: {v:.100}")))?;
        base64_decode(text).ok_or_else(|| Error::transport("screenshot: bad base64"))
    }

    /// Polls `check` (every 100 ms) until it answers `Some`, and answers
    /// that.
    ///
    /// # Panics
    ///
    /// When `timeout` passes first; the message names `what` and includes
    /// the page's visible text, to show what the page showed instead.
    pub fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Browser) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(t) = check(self) {
                return t;
            }
            if Instant::now() >= deadline {
                let page = self
                    .find("body")
                    .and_then(|b| b.text())
                    .unwrap_or_else(|e| format!("(no page text: {e})"));
                panic!("waited {timeout:?} for {what}; the page shows:\n{page}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Browser {
    /// Waits until an element matches `css`, and answers it.
    ///
    /// # Panics
    ///
    /// When none does within `timeout` (the message shows the page's text).
    pub fn wait_for(&self, css: &str, timeout: Duration) -> Element<'_> {
        let what = format!("an element matching {css}");
        let id = self.wait_until(&what, timeout, |b| b.find(css).ok().map(|e| e.id));
        Element { browser: self, id }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            // Ends the session: the driver closes Chromium cleanly.
            let _ = self.command("DELETE", &format!("/session/{}", self.session), None);
        }
        if let Some(mut c) = self.driver.take() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", c.id())])
                .stderr(Stdio::null())
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An element of the page, valid while the page holds it.
#[derive(Debug, Clone)]
pub struct Element<'b> {
    browser: &'b Browser,
    id: String,
}

impl<'b> Element<'b> {
    fn from_json(browser: &'b Browser, v: &Value) -> Result<Element<'b>, Error> {
        let id = v[ELEMENT_KEY]
            .as_str()
            .ok_or_else(|| Error::transport(format!("not an element reference: {v}")))?;
        Ok(Element {
            browser,
            id: id.to_string(),
        })
    }

    fn cmd(&self, method: &str, rest: &str, body: Option<&Value>) -> Result<Value, Error> {
        self.browser
            .session_cmd(method, &format!("/element/{}{rest}", self.id), body)
    }

    /// Types `text` into the element (appending to what is there).
    ///
    /// # Errors
    ///
    /// When the element is gone or cannot take keys.
    pub fn send_keys(&self, text: &str) -> Result<(), Error> {
        self.cmd("POST", "/value", Some(&json!({ "text": text })))
            .map(drop)
    }

    /// Empties an input or text area.
    ///
    /// # Errors
    ///
    /// When the element is gone or not editable.
    pub fn clear(&self) -> Result<(), Error> {
        self.cmd("POST", "/clear", Some(&json!({}))).map(drop)
    }

    /// Clicks the element's centre.
    ///
    /// # Errors
    ///
    /// When the element is gone, hidden or covered.
    pub fn click(&self) -> Result<(), Error> {
        self.cmd("POST", "/click", Some(&json!({}))).map(drop)
    }

    /// The element's rendered text.
    ///
    /// # Errors
    ///
    /// When the element is gone.
    pub fn text(&self) -> Result<String, Error> {
        Ok(self
            .cmd("GET", "/text", None)?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// An attribute's value, `None` when the element has no such attribute.
    ///
    /// # Errors
    ///
    /// When the element is gone.
    pub fn attribute(&self, name: &str) -> Result<Option<String>, Error> {
        Ok(self
            .cmd("GET", &format!("/attribute/{name}"), None)?
            .as_str()
            .map(str::to_string))
    }

    /// A DOM property (`value` of an input, `checked` of a box).
    ///
    /// # Errors
    ///
    /// When the element is gone.
    pub fn property(&self, name: &str) -> Result<Value, Error> {
        self.cmd("GET", &format!("/property/{name}"), None)
    }

    /// Elements inside this one matching a CSS selector.
    ///
    /// # Errors
    ///
    /// When the element is gone or the selector is invalid.
    pub fn find_all(&self, css: &str) -> Result<Vec<Element<'b>>, Error> {
        let v = self.cmd(
            "POST",
            "/elements",
            Some(&json!({"using": "css selector", "value": css})),
        )?;
        v.as_array()
            .ok_or_else(|| Error::transport(format!("elements: not a list: {v}")))?
            .iter()
            .map(|e| Element::from_json(self.browser, e))
            .collect()
    }
}

/// One HTTP/1.1 exchange with the driver on 127.0.0.1; answers the status
/// and the body.
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String), Error> {
    let fail = |e: std::io::Error| Error::transport(format!("{method} {path}: {e}"));
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(fail)?;
    s.set_read_timeout(Some(COMMAND_TIMEOUT)).map_err(fail)?;
    let body = body.unwrap_or("");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).map_err(fail)?;
    s.write_all(body.as_bytes()).map_err(fail)?;
    // The driver keeps the connection open whatever it is told: the answer
    // ends where its length says, not at EOF.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = s.read(&mut buf).map_err(fail)?;
        raw.extend_from_slice(&buf[..n]);
        let eof = n == 0;
        match parse_response(&raw, eof) {
            Ok(Some(answer)) => return Ok(answer),
            Ok(None) if !eof => {}
            Ok(None) => {
                return Err(Error::transport(format!("{method} {path}: closed early")));
            }
            Err(m) => return Err(Error::transport(format!("{method} {path}: {m}"))),
        }
    }
}

/// Splits an HTTP/1.1 answer into status and body, honouring
/// `Content-Length` or chunked transfer coding, else reading to EOF.
/// `Ok(None)`: more bytes are needed (never when `eof`).
fn parse_response(raw: &[u8], eof: bool) -> Result<Option<(u16, String)>, String> {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if eof {
            Err("connection closed before the end of headers".into())
        } else {
            Ok(None)
        };
    };
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line in {head:.100}"))?;
    let mut length = None;
    let mut chunked = false;
    for l in lines {
        let Some((name, value)) = l.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<usize>().map_err(|_| "bad Content-Length")?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)
    } else if let Some(n) = length {
        rest.get(..n).map(<[u8]>::to_vec)
    } else if eof {
        Some(rest.to_vec())
    } else {
        None
    };
    match body {
        Some(body) => {
            let body = String::from_utf8(body).map_err(|_| "body is not UTF-8")?;
            Ok(Some((status, body)))
        }
        None if eof => Err("connection closed before the end of the body".into()),
        None => Ok(None),
    }
}

/// The body of a chunked answer, `None` until its last chunk has come.
fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&rest[..eol]).ok()?;
        let size = size.split(';').next()?.trim();
        let n = usize::from_str_radix(size, 16).ok()?;
        rest = &rest[eol + 2..];
        if n == 0 {
            return Some(out);
        }
        out.extend_from_slice(rest.get(..n)?);
        rest = rest.get(n + 2..)?;
    }
}

/// Standard base64 (with or without padding; whitespace ignored), `None`
/// on any other byte.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_known_values() {
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("Zg==").unwrap(), b"f");
        assert_eq!(base64_decode("Zm8=").unwrap(), b"fo");
        assert_eq!(base64_decode("Zm9v").unwrap(), b"foo");
        assert_eq!(base64_decode("Zm9vYmFy").unwrap(), b"foobar");
        assert_eq!(base64_decode("iVBO\nRw0K").unwrap(), b"\x89PNG\r\n");
        assert!(base64_decode("Zm9v!").is_none());
    }

    #[test]
    fn responses_with_length_chunks_or_neither() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}junk";
        assert_eq!(parse_response(r, false).unwrap(), Some((200, "{}".into())));
        let r = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert_eq!(parse_response(r, false).unwrap(), Some((404, "{}".into())));
        let r = b"HTTP/1.1 500 X\r\n\r\n{\"a\":1}";
        assert_eq!(parse_response(r, false).unwrap(), None);
        assert_eq!(
            parse_response(r, true).unwrap(),
            Some((500, "{\"a\":1}".into()))
        );
        // Incomplete: wait for more, or fail at EOF.
        for part in [
            &b"HTTP/1.1 200 OK\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}",
        ] {
            assert_eq!(parse_response(part, false).unwrap(), None);
            assert!(parse_response(part, true).is_err());
        }
        let r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{";
        assert_eq!(parse_response(r, false).unwrap(), None);
        assert!(parse_response(b"nonsense\r\n\r\n", false).is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", false).is_err());
    }

    /// The driver end to end on a page given as a data URL: typing,
    /// clicking, reading, scripts, errors and a screenshot.
    #[test]
    fn drives_a_real_chromium() {
        let b = Browser::start();
        let page = "data:text/html,<title>t</title><input id=i><button id=b \
                    onclick=\"document.getElementById('o').textContent='got '+\
                    document.getElementById('i').value\">go</button><p id=o data-x=1></p>";
        b.navigate(page).unwrap();
        b.find("#i").unwrap().send_keys("a<b>&").unwrap();
        b.find("#b").unwrap().click().unwrap();
        let got = b.wait_until("the click's effect", Duration::from_secs(20), |b| {
            let t = b.find("#o").ok()?.text().ok()?;
            (!t.is_empty()).then_some(t)
        });
        assert_eq!(got, "got a<b>&");
        let o = b.find("#o").unwrap();
        assert_eq!(o.attribute("data-x").unwrap().as_deref(), Some("1"));
        assert_eq!(o.attribute("data-y").unwrap(), None);
        assert_eq!(b.find("#i").unwrap().property("value").unwrap(), "a<b>&");
        assert_eq!(b.find_all("p, input").unwrap().len(), 2);
        let v = b.execute("return arguments[0] + 1", &[json!(41)]).unwrap();
        assert_eq!(v, 42);
        let e = b.execute("throw new Error('boom')", &[]).unwrap_err();
        assert_eq!(e.code, "javascript error", "{e}");
        let e = b.find("#nothing").unwrap_err();
        assert_eq!(e.code, "no such element", "{e}");
        b.set_viewport(640, 480).unwrap();
        let size = b.execute("return [innerWidth, innerHeight]", &[]).unwrap();
        assert_eq!(size, json!([640, 480]));
        let png = b.screenshot().unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        // The IHDR chunk: width and height, big-endian, at bytes 16..24.
        assert_eq!(png[16..24], [0, 0, 2, 128, 0, 0, 1, 224]);
    }
}
