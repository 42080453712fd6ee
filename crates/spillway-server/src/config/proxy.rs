//! `proxy:`: the upstream, who the client is, timeouts, upgrades, body
//! buffering and the in-flight limit (`proxy.concurrency`).

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) fn proxy_config(
    errs: &mut Collector<'_>,
    p: &Spanned<RawProxy>,
) -> crate::proxy::Settings {
    let raw = &p.value;
    let mut cfg = crate::proxy::Settings::default();
    if let Some(u) = &raw.upstream {
        let mut url =
            |errs: &mut Collector<'_>, at: &dyn Fn(&mut Collector<'_>, String), s: &str| {
                match UpstreamUrl::parse(s) {
                    Ok(url) => cfg.upstream = Some(url),
                    Err(e) => at(errs, format!("proxy.upstream: {e}")),
                }
            };
        match &u.value {
            raw::RawUpstream::Url(s) => url(errs, &|errs, m| errs.at(u, m), s),
            raw::RawUpstream::Map(m) => {
                match &m.url {
                    Some(s) => url(errs, &|errs, msg| errs.at(s, msg), &s.value),
                    None => errs.at(u, "proxy.upstream: a map needs `url:`"),
                }
                if let Some(n) = &m.max_connections
                    && let Some(n) = count(errs, n, "proxy.upstream.max_connections")
                {
                    cfg.max_connections = Some(usize::try_from(n).unwrap_or(usize::MAX));
                }
            }
        }
    }
    if let Some(u) = &raw.user {
        match UserSource::parse(&u.value) {
            Ok(src) => cfg.user = Some(src),
            Err(e) => errs.at(u, format!("proxy.user: {e}")),
        }
    }
    if let Some(t) = &raw.trusted_proxies {
        for n in &t.value {
            match IpNet::parse(n) {
                Ok(net) => cfg.trusted_proxies.push(net),
                Err(e) => errs.at(t, format!("proxy.trusted_proxies: {e}")),
            }
        }
    }
    if let Some(t) = &raw.timeout
        && let Some(d) = duration(errs, t, "proxy.timeout", false)
    {
        cfg.timeout = d.into();
    }
    if let Some(u) = &raw.upgrades {
        cfg.upgrades.clear();
        for p in &u.value {
            let p = p.trim().to_ascii_lowercase();
            if p == "h2c" {
                errs.at(
                    u,
                    "proxy.upgrades: h2c is never passed through (its requests would escape the limits)",
                );
            } else if p.is_empty() || !p.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
                errs.at(u, format!("proxy.upgrades: {p:?} is not a protocol name"));
            } else {
                cfg.upgrades.push(p);
            }
        }
    }
    if let Some(c) = &raw.concurrency {
        cfg.concurrency = concurrency(errs, c);
    }
    if let Some(b) = &raw.buffer_body {
        match size(&b.value) {
            Ok(n) if n <= crate::proxy::MOST_BUFFERED => cfg.buffer_body = n,
            Ok(n) => errs.at(
                b,
                format!(
                    "proxy.buffer_body: at most {} bytes (16 MiB), not {n}",
                    crate::proxy::MOST_BUFFERED
                ),
            ),
            Err(e) => errs.at(b, format!("proxy.buffer_body: {e}")),
        }
    }
    cfg.listen = raw
        .listen
        .as_ref()
        .and_then(|l| address(errs, l, "proxy.listen", 8080));
    cfg.admin_listen = raw
        .admin_listen
        .as_ref()
        .and_then(|l| address(errs, l, "proxy.admin_listen", 9090));
    cfg
}

/// A size in bytes: a whole number, or one with a unit (`B`, `KiB`, `MiB`;
/// `kB` and `MB` are 1,000 and 1,000,000).
pub(super) fn size(s: &raw::RawSize) -> Result<usize, String> {
    let text = match s {
        raw::RawSize::Bytes(n) => {
            return usize::try_from(*n).map_err(|_| format!("{n} is not a size"));
        }
        raw::RawSize::Text(t) => t.trim(),
    };
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let n: u64 = text[..digits]
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 64KiB"))?;
    let unit: u64 = match text[digits..].trim() {
        "" | "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        "kB" | "KB" => 1000,
        "MB" => 1_000_000,
        other => return Err(format!("{other:?} is not a unit: B, KiB or MiB")),
    };
    n.checked_mul(unit)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// `proxy.concurrency`: exactly one of `adaptive: { min, max }` and
/// `limit: N`, and an optional queue.
pub(super) fn concurrency(
    errs: &mut Collector<'_>,
    c: &Spanned<raw::RawConcurrency>,
) -> Option<crate::proxy::concurrency::ConcurrencySettings> {
    use crate::proxy::concurrency::LimitKind;
    /// The most in flight a limit may allow.
    const MOST: i64 = 1_000_000;
    let raw = &c.value;
    let mut size = |n: &Spanned<i64>, what: &str| -> Option<u32> {
        if (1..=MOST).contains(&n.value) {
            u32::try_from(n.value).ok()
        } else {
            errs.at(n, format!("{what}: from 1 to {MOST}, not {}", n.value));
            None
        }
    };
    let limit = match (&raw.adaptive, &raw.limit) {
        (Some(_), Some(l)) => {
            errs.at(
                l,
                "proxy.concurrency: give adaptive: { min, max } or limit: N, not both",
            );
            None
        }
        (None, None) => {
            errs.at(
                c,
                "proxy.concurrency needs adaptive: { min: N, max: N } or limit: N",
            );
            None
        }
        (None, Some(l)) => size(l, "proxy.concurrency.limit").map(LimitKind::Fixed),
        (Some(a), None) => {
            let min = size(&a.value.min, "proxy.concurrency.adaptive.min");
            let max = size(&a.value.max, "proxy.concurrency.adaptive.max");
            match (min, max) {
                (Some(min), Some(max)) if min <= max => Some(LimitKind::Adaptive { min, max }),
                (Some(_), Some(_)) => {
                    errs.at(a, "proxy.concurrency.adaptive: min must not be above max");
                    None
                }
                _ => None,
            }
        }
    };
    let mut out = crate::proxy::concurrency::ConcurrencySettings {
        limit: limit?,
        max_wait: std::time::Duration::from_millis(500),
        max_queued: 1024,
    };
    if let Some(q) = &raw.queue {
        if let Some(w) = &q.value.max_wait
            && let Some(d) = duration(errs, w, "proxy.concurrency.queue.max_wait", true)
        {
            out.max_wait = d.into();
        }
        if let Some(n) = &q.value.max_queued {
            if (0..=MOST).contains(&n.value) {
                out.max_queued = usize::try_from(n.value).unwrap_or(0);
            } else {
                errs.at(
                    n,
                    format!(
                        "proxy.concurrency.queue.max_queued: from 0 to {MOST}, not {}",
                        n.value
                    ),
                );
            }
        }
    }
    Some(out)
}
