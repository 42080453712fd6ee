//! Which JSON key or CSV column is which field of a record, and reading a
//! value into that field: what the JSON and CSV readers share.

use super::record::Record;
use super::{Bad, TsUnit, combined, time};

/// What a JSON key or CSV column can be read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Ts,
    Ip,
    User,
    Method,
    Path,
    Status,
    Cost,
    Api,
    Request,
    Headers,
}

impl Role {
    pub(super) const ALL: [Role; 10] = [
        Role::Ts,
        Role::Ip,
        Role::User,
        Role::Method,
        Role::Path,
        Role::Status,
        Role::Cost,
        Role::Api,
        Role::Request,
        Role::Headers,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Role::Ts => "ts",
            Role::Ip => "ip",
            Role::User => "user",
            Role::Method => "method",
            Role::Path => "path",
            Role::Status => "status",
            Role::Cost => "cost",
            Role::Api => "api",
            Role::Request => "request",
            Role::Headers => "headers",
        }
    }

    pub(super) fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// The JSON keys and CSV columns read as each field of a [`Record`]
/// (`--field NAME=KEY`); by default each is its own name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldNames {
    /// The timestamp (required): epoch number or RFC 3339 text.
    pub ts: String,
    /// The client IP.
    pub ip: String,
    /// The user.
    pub user: String,
    /// The request method.
    pub method: String,
    /// The request target.
    pub path: String,
    /// The response status.
    pub status: String,
    /// The request's cost.
    pub cost: String,
    /// `"METHOD /path"` (or `"/path"`), as the decision API takes it; read
    /// when `method` or `path` is absent.
    pub api: String,
    /// A request line, `"GET /x HTTP/1.1"` (nginx's `$request`); read when
    /// `method` or `path` is absent.
    pub request: String,
    /// An object of headers (JSON), or such an object as JSON text (CSV).
    pub headers: String,
    /// Keys read as one header each, `(lower-case header name, key)`:
    /// `--field header:user-agent=http_user_agent`.
    pub header_keys: Vec<(String, String)>,
}

impl Default for FieldNames {
    fn default() -> Self {
        FieldNames {
            ts: "ts".into(),
            ip: "ip".into(),
            user: "user".into(),
            method: "method".into(),
            path: "path".into(),
            status: "status".into(),
            cost: "cost".into(),
            api: "api".into(),
            request: "request".into(),
            headers: "headers".into(),
            header_keys: Vec::new(),
        }
    }
}

impl FieldNames {
    /// Applies one `--field` value, `NAME=KEY` (e.g. `ip=remote_addr`, or
    /// `header:x-api-key=http_x_api_key` to read a key as a header).
    ///
    /// # Errors
    ///
    /// When the value has no `=`, either side is empty, or `NAME` is not a
    /// field of a record: the message lists the valid names (and does not
    /// repeat `spec`, which the caller shows).
    pub fn set(&mut self, spec: &str) -> Result<(), String> {
        let Some((name, key)) = spec.split_once('=') else {
            return Err("expected NAME=KEY, e.g. ip=remote_addr".into());
        };
        let (name, key) = (name.trim(), key.trim());
        if key.is_empty() {
            return Err("the key after `=` is empty".into());
        }
        if let Some(header) = name.strip_prefix("header:") {
            if header.is_empty() {
                return Err("no header name after `header:`".into());
            }
            self.header_keys
                .push((header.to_ascii_lowercase(), key.to_string()));
            return Ok(());
        }
        let Some(role) = Role::ALL.iter().find(|r| r.name() == name) else {
            let valid: Vec<&str> = Role::ALL.iter().map(|r| r.name()).collect();
            return Err(format!(
                "unknown field {name:?}: expected one of {}, or header:NAME",
                valid.join(", ")
            ));
        };
        *self.slot(*role) = key.to_string();
        Ok(())
    }

    fn slot(&mut self, role: Role) -> &mut String {
        match role {
            Role::Ts => &mut self.ts,
            Role::Ip => &mut self.ip,
            Role::User => &mut self.user,
            Role::Method => &mut self.method,
            Role::Path => &mut self.path,
            Role::Status => &mut self.status,
            Role::Cost => &mut self.cost,
            Role::Api => &mut self.api,
            Role::Request => &mut self.request,
            Role::Headers => &mut self.headers,
        }
    }

    pub(super) fn get(&self, role: Role) -> &str {
        match role {
            Role::Ts => &self.ts,
            Role::Ip => &self.ip,
            Role::User => &self.user,
            Role::Method => &self.method,
            Role::Path => &self.path,
            Role::Status => &self.status,
            Role::Cost => &self.cost,
            Role::Api => &self.api,
            Role::Request => &self.request,
            Role::Headers => &self.headers,
        }
    }
}

/// Reads one field's value into a record: what JSON and CSV share once a
/// key or column is known to be that field.
#[derive(Debug, Default)]
pub(super) struct Fill {
    unit: Option<TsUnit>,
    have_ts: bool,
    api: Option<String>,
    request: Option<String>,
}

impl Fill {
    pub(super) fn new(unit: Option<TsUnit>) -> Fill {
        Fill {
            unit,
            ..Fill::default()
        }
    }

    /// Before each line.
    pub(super) fn start(&mut self) {
        self.have_ts = false;
        if let Some(a) = &mut self.api {
            a.clear();
        }
        if let Some(r) = &mut self.request {
            r.clear();
        }
    }

    /// A text (or number, as written) value of `role` (not `Headers`).
    pub(super) fn text(&mut self, rec: &mut Record, role: Role, v: &str) -> Result<(), Bad> {
        let t = v.trim_matches(|c: char| c.is_ascii_whitespace());
        match role {
            Role::Ts => {
                rec.ts_ns = time::parse_ts_text(t, self.unit).map_err(|e| Bad::Role(role, e))?;
                self.have_ts = true;
            }
            Role::Ip => set(&mut rec.ip, t),
            Role::User => set(&mut rec.user, t),
            Role::Method => set(&mut rec.method, t),
            Role::Path => set(&mut rec.path, t),
            Role::Status => {
                rec.status = match t {
                    "" | "-" => 0,
                    _ => whole(t)
                        .and_then(|n| u16::try_from(n).ok())
                        .filter(|n| *n <= 999)
                        .ok_or(Bad::Role(role, "not a status code from 0 to 999"))?,
                }
            }
            Role::Cost => {
                rec.cost = match t {
                    "" => 1,
                    _ => whole(t).ok_or(Bad::Role(
                        role,
                        "not a whole number from 0 to 18446744073709551615",
                    ))?,
                }
            }
            Role::Api => set(self.api.get_or_insert_with(String::new), t),
            Role::Request => set(self.request.get_or_insert_with(String::new), t),
            Role::Headers => {}
        }
        Ok(())
    }

    /// After the line: the timestamp is required; method and path come
    /// from `api` or `request` when absent.
    pub(super) fn end(&mut self, rec: &mut Record) -> Result<(), Bad> {
        if !self.have_ts {
            return Err(Bad::NoTs);
        }
        if rec.method.is_empty() || rec.path.is_empty() {
            let from = match (self.api.as_deref(), self.request.as_deref()) {
                (Some(a), _) if !a.is_empty() => {
                    let (m, p) = spillway_core::rule::split_api(a);
                    Some((m.unwrap_or(""), p))
                }
                (_, Some(r)) if !r.is_empty() => combined::request_line(r),
                _ => None,
            };
            if let Some((m, p)) = from {
                if rec.method.is_empty() {
                    rec.method.push_str(m);
                }
                if rec.path.is_empty() {
                    rec.path.push_str(p);
                }
            }
        }
        rec.finish();
        Ok(())
    }
}

fn set(slot: &mut String, v: &str) {
    slot.clear();
    slot.push_str(v);
}

/// ASCII digits only, as a `u64`.
fn whole(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The JSON keys or CSV columns mapped to fields: one entry per distinct
/// name, with every field it fills.
#[derive(Debug, Clone, Default)]
pub(super) struct KeyMap {
    entries: Vec<KeyEntry>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct KeyEntry {
    pub(super) key: String,
    /// Bits of [`Role::bit`].
    pub(super) roles: u16,
    /// Headers this key is read as (lower case).
    pub(super) headers: Vec<String>,
}

impl KeyMap {
    pub(super) fn new(names: &FieldNames) -> KeyMap {
        let mut map = KeyMap::default();
        for role in Role::ALL {
            map.entry(names.get(role)).roles |= role.bit();
        }
        for (header, key) in &names.header_keys {
            map.entry(key).headers.push(header.clone());
        }
        map
    }

    fn entry(&mut self, key: &str) -> &mut KeyEntry {
        let i = match self.entries.iter().position(|e| e.key == key) {
            Some(i) => i,
            None => {
                self.entries.push(KeyEntry {
                    key: key.to_string(),
                    ..KeyEntry::default()
                });
                self.entries.len() - 1
            }
        };
        &mut self.entries[i]
    }

    /// The entry of `key`, with its index.
    pub(super) fn find(&self, key: &str) -> Option<(usize, &KeyEntry)> {
        self.entries.iter().enumerate().find(|(_, e)| e.key == key)
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}
