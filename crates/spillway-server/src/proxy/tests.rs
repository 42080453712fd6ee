use super::*;

#[test]
fn hosts_are_checked() {
    for ok in [
        "a",
        "example.com",
        "example.com:80",
        "127.0.0.1:9",
        "[::1]",
        "[::1]:80",
    ] {
        assert!(valid_host(ok.as_bytes()), "{ok}");
    }
    for bad in [
        "", "a b", "a/b", "[::1", "[zz]", "a:b", "a:123456", "a@b", "[::1]x",
    ] {
        assert!(!valid_host(bad.as_bytes()), "{bad}");
    }
}

#[test]
fn absolute_form_targets_are_their_origin_form_or_refused() {
    let http = Some("http");
    for (scheme, authority, pq, want) in [
        (http, Some("x"), Some("/a?b=c"), ("x", "/a?b=c")),
        (Some("HTTPS"), Some("x:8080"), Some("/a"), ("x:8080", "/a")),
        (http, Some("[::1]:80"), None, ("[::1]:80", "/")),
        (http, Some("x"), Some(""), ("x", "/")),
    ] {
        assert_eq!(absolute_form(scheme, authority, pq), Ok(want), "{want:?}");
    }
    for (scheme, authority, pq) in [
        (None, Some("x"), Some("/a")),
        (Some("ftp"), Some("x"), Some("/a")),
        (Some("ws"), Some("x"), Some("/a")),
        (Some("file"), None, Some("/etc/passwd")),
        (http, None, Some("/a")),
        (http, Some(""), Some("/a")),
        (http, Some("u:p@x"), Some("/a")),
        (http, Some("x@evil"), Some("/a")),
        (http, Some("x:99999999"), Some("/a")),
        (http, Some("x y"), Some("/a")),
        (http, Some("x"), Some("?q")),
        (http, Some("x"), Some("/a|b")),
    ] {
        assert!(
            absolute_form(scheme, authority, pq).is_err(),
            "{scheme:?} {authority:?} {pq:?}"
        );
    }
}

#[test]
fn upstream_urls_are_parsed_once() {
    let u = UpstreamUrl::parse("http://127.0.0.1:9000").unwrap();
    assert_eq!((u.authority(), u.base()), ("127.0.0.1:9000", ""));
    let u = UpstreamUrl::parse("http://example.com/api/").unwrap();
    assert_eq!((u.authority(), u.base()), ("example.com:80", "/api"));
    let u = UpstreamUrl::parse("http://[::1]:9000/x").unwrap();
    assert_eq!((u.authority(), u.base()), ("[::1]:9000", "/x"));
    for bad in ["https://x", "x:1", "http:///a", "http://x/?q=1", "ftp://x"] {
        assert!(UpstreamUrl::parse(bad).is_err(), "{bad}");
    }
}
