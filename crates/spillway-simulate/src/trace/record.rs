//! One request of a trace, filled in place line after line.

/// Name–value pairs whose strings are kept between records: `clear` only
/// forgets how many are in use, so a steady stream of lines allocates
/// nothing.
#[derive(Default)]
pub(super) struct Pairs {
    items: Vec<(String, String)>,
    len: usize,
}

impl Clone for Pairs {
    fn clone(&self) -> Self {
        Pairs {
            items: self.as_slice().to_vec(),
            len: self.len,
        }
    }
}

impl std::fmt::Debug for Pairs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.as_slice().iter().map(|(k, v)| (k, v)))
            .finish()
    }
}

impl Pairs {
    pub(super) fn clear(&mut self) {
        self.len = 0;
    }

    /// A fresh, empty pair at the end.
    pub(super) fn push(&mut self) -> (&mut String, &mut String) {
        if self.len == self.items.len() {
            self.items.push(Default::default());
        }
        let (k, v) = &mut self.items[self.len];
        self.len += 1;
        k.clear();
        v.clear();
        (k, v)
    }

    pub(super) fn as_slice(&self) -> &[(String, String)] {
        &self.items[..self.len]
    }

    /// Whether a pair is named `name` (ASCII case ignored if asked).
    pub(super) fn contains(&self, name: &str, ignore_case: bool) -> bool {
        self.as_slice().iter().any(|(k, _)| {
            if ignore_case {
                k.eq_ignore_ascii_case(name)
            } else {
                k == name
            }
        })
    }
}

impl PartialEq for Pairs {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Pairs {}

/// One request of a trace.
///
/// [`TraceReader::read`](super::TraceReader::read) fills one in place,
/// reusing its strings: keep one `Record` and read into it in a loop.
/// Empty strings mean "none" (the trace did not say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// 1-based line number in its file (for CSV the header is line 1; a
    /// record spanning lines has the number of its first).
    pub line: u64,
    /// Nanoseconds since the Unix epoch, UTC.
    pub ts_ns: u64,
    /// The request method as logged; `""` = none.
    pub method: String,
    /// The request target as logged (origin form, the query string kept;
    /// an absolute `http://host/x` target is reduced to `/x`, its host
    /// becoming the `host` header); `""` = none.
    pub path: String,
    /// The client IP (a `:port` suffix removed); `""` = none.
    pub ip: String,
    /// The user; `""` = none (a combined log's `-` is none).
    pub user: String,
    /// The response status; 0 = none.
    pub status: u16,
    /// The request's cost: 1 unless the trace gives one.
    pub cost: u64,
    /// Headers, names in lower case.
    pub(super) headers: Pairs,
    /// Every other named value of the line.
    pub(super) fields: Pairs,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            line: 0,
            ts_ns: 0,
            method: String::new(),
            path: String::new(),
            ip: String::new(),
            user: String::new(),
            status: 0,
            cost: 1,
            headers: Pairs::default(),
            fields: Pairs::default(),
        }
    }
}

impl Record {
    /// Empties the record (its strings keep their memory), as a reader
    /// does before each line.
    pub fn clear(&mut self) {
        self.line = 0;
        self.ts_ns = 0;
        self.method.clear();
        self.path.clear();
        self.ip.clear();
        self.user.clear();
        self.status = 0;
        self.cost = 1;
        self.headers.clear();
        self.fields.clear();
    }

    /// A header by name, ASCII case ignored.
    pub fn header(&self, lower_case_name: &str) -> Option<&str> {
        self.headers
            .as_slice()
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(lower_case_name))
            .map(|(_, v)| v.as_str())
    }

    /// Any other named value of the line: a JSON key or CSV column not
    /// mapped to one of the fields above (names compared exactly).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .as_slice()
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The headers, in the order of the line, names in lower case.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.headers
            .as_slice()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The other named values, in the order of the line.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &str)> {
        self.fields
            .as_slice()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Adds a header (its name lower-cased), for building records by hand
    /// (synthetic traffic, tests). Readers never produce two of one name.
    pub fn add_header(&mut self, name: &str, value: &str) {
        let (k, v) = self.headers.push();
        push_lower(k, name);
        v.push_str(value);
    }

    /// Adds a named value, for building records by hand.
    pub fn add_field(&mut self, name: &str, value: &str) {
        let (k, v) = self.fields.push();
        k.push_str(name);
        v.push_str(value);
    }

    /// What every reader does last: `-` as user or IP is none, a port is
    /// cut from the IP, and an absolute-form target loses its scheme and
    /// host (the host becoming the `host` header unless there is one).
    pub(super) fn finish(&mut self) {
        if self.user == "-" {
            self.user.clear();
        }
        if self.ip == "-" {
            self.ip.clear();
        }
        strip_port(&mut self.ip);
        self.origin_form();
    }

    fn origin_form(&mut self) {
        let b = self.path.as_bytes();
        let scheme = if b.len() >= 7 && b[..7].eq_ignore_ascii_case(b"http://") {
            7
        } else if b.len() >= 8 && b[..8].eq_ignore_ascii_case(b"https://") {
            8
        } else {
            return;
        };
        let host_end = b[scheme..]
            .iter()
            .position(|&c| matches!(c, b'/' | b'?' | b'#'))
            .map_or(b.len(), |i| scheme + i);
        if host_end > scheme && !self.headers.contains("host", true) {
            let (k, v) = self.headers.push();
            k.push_str("host");
            v.push_str(&self.path[scheme..host_end]);
        }
        self.path.replace_range(..host_end, "");
        if !self.path.starts_with('/') {
            self.path.insert(0, '/');
        }
    }
}

/// Cuts `:port` from `1.2.3.4:5678` and `[::1]:5678` (to `::1`); a bare
/// IPv6 address (several colons) is left as it is.
fn strip_port(ip: &mut String) {
    let b = ip.as_bytes();
    if b.first() == Some(&b'[') {
        if let Some(close) = b.iter().position(|&c| c == b']') {
            let rest = &b[close + 1..];
            let port_ok = rest.is_empty()
                || (rest.len() > 1 && rest[0] == b':' && rest[1..].iter().all(u8::is_ascii_digit));
            if port_ok {
                ip.truncate(close);
                ip.remove(0);
            }
        }
        return;
    }
    let mut colons = b.iter().enumerate().filter(|(_, c)| **c == b':');
    if let (Some((at, _)), None) = (colons.next(), colons.next()) {
        let port = &b[at + 1..];
        if at > 0 && !port.is_empty() && port.iter().all(u8::is_ascii_digit) {
            ip.truncate(at);
        }
    }
}

/// Appends `s` with ASCII letters in lower case.
pub(super) fn push_lower(out: &mut String, s: &str) {
    if s.bytes().any(|c| c.is_ascii_uppercase()) {
        out.extend(s.chars().map(|c| c.to_ascii_lowercase()));
    } else {
        out.push_str(s);
    }
}

impl spillway_core::Attributes for Record {
    fn user(&self) -> Option<&str> {
        Some(self.user.as_str()).filter(|s| !s.is_empty())
    }

    fn ip(&self) -> Option<&str> {
        Some(self.ip.as_str()).filter(|s| !s.is_empty())
    }

    fn header(&self, name: &str) -> Option<&str> {
        Record::header(self, name)
    }

    fn descriptor(&self, name: &str) -> Option<&str> {
        self.field(name).filter(|s| !s.is_empty())
    }
}
