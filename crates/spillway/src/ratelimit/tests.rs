use std::time::Duration;

use super::env::go_duration;
use super::*;

fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

fn run(list: &[(&str, &str)]) -> String {
    let e = entry(&vars(list)).unwrap_or_else(|e| panic!("{list:?} refused: {e}"));
    e.args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn refused(list: &[(&str, &str)]) -> Option<String> {
    entry(&vars(list)).err()
}

/// Envoy Gateway's environment for its limiter
/// (`internal/infrastructure/kubernetes/ratelimit/resource.go`).
const ENVOY_GATEWAY: &[(&str, &str)] = &[
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
    ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis-system.svc.cluster.local:6379"),
    ("USE_PROMETHEUS", "true"),
    ("PROMETHEUS_ADDR", ":19001"),
];

#[test]
fn envoy_gateways_environment_is_read() {
    let e = entry(&vars(ENVOY_GATEWAY)).unwrap();
    let args: Vec<String> = e
        .args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // No runtime directory with xDS; the admin listener at PROMETHEUS_ADDR.
    assert_eq!(
        args.join(" "),
        "ratelimit serve --config /etc/spillway/ratelimit.yaml --listen 0.0.0.0:8080 \
         --grpc-listen 0.0.0.0:8081 --admin-listen 0.0.0.0:19001"
    );
    let x = e.overlay.xds.unwrap();
    assert_eq!(x.server, "envoy-gateway:18001");
    assert_eq!(x.node_id, "envoy-ratelimit");
    assert!(!x.wait_initial);
    let tls = x.tls.unwrap();
    assert_eq!(tls.ca.unwrap().to_str(), Some("/certs/ca.crt"));
    assert_eq!(
        tls.client
            .map(|(c, k)| (c.display().to_string(), k.display().to_string())),
        Some(("/certs/tls.crt".into(), "/certs/tls.key".into()))
    );
    let r = e.overlay.redis.unwrap();
    assert_eq!(
        r.urls,
        ["redis://redis.redis-system.svc.cluster.local:6379"]
    );
    assert!(!r.cluster);
    assert_eq!(e.log_level, Some("info"));
}

#[test]
fn redis_variables_make_the_store_url() {
    let redis = |list: &[(&str, &str)]| {
        let mut all = vec![("REDIS_SOCKET_TYPE", "tcp")];
        all.extend_from_slice(list);
        entry(&vars(&all)).unwrap().overlay.redis.unwrap()
    };
    let r = redis(&[
        ("REDIS_URL", "r:6380"),
        ("REDIS_AUTH", "user:p@ss/w"),
        ("REDIS_TLS", "true"),
        ("REDIS_TIMEOUT", "1.5s"),
        ("REDIS_POOL_SIZE", "50"),
        ("REDIS_PIPELINE_WINDOW", "150us"),
        ("REDIS_PIPELINE_LIMIT", "8"),
    ]);
    assert_eq!(r.urls, ["rediss://user:p%40ss%2Fw@r:6380"]);
    assert_eq!(r.timeout, Some(Duration::from_millis(1500)));
    let r = redis(&[("REDIS_URL", "[::1]:6379"), ("REDIS_AUTH", "secret")]);
    assert_eq!(r.urls, ["redis://:secret@[::1]:6379"]);
    let r = redis(&[
        ("REDIS_TYPE", "CLUSTER"),
        ("REDIS_URL", "a:7000,b:7001, c:7002"),
    ]);
    assert!(r.cluster);
    assert_eq!(
        r.urls,
        ["redis://a:7000", "redis://b:7001", "redis://c:7002"]
    );
}

/// `REDIS_TYPE=sentinel`: the master's name, then the sentinels; each
/// login to its side.
#[test]
fn sentinel_variables_make_the_sentinel_store() {
    let e = entry(&vars(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster, s1:26379,[::1]:26380"),
        ("REDIS_AUTH", "app:pw"),
        ("REDIS_SENTINEL_AUTH", "spw"),
        ("REDIS_TLS", "true"),
    ]))
    .unwrap();
    let s = e.overlay.redis.unwrap().sentinel.unwrap();
    assert_eq!(s.master, "mymaster");
    assert_eq!(s.nodes, ["s1:26379", "[::1]:26380"]);
    assert_eq!(
        (s.username.as_deref(), s.password.as_deref()),
        (Some("app"), Some("pw"))
    );
    assert_eq!(
        (s.sentinel_username, s.sentinel_password.as_deref()),
        (None, Some("spw"))
    );
    assert!(s.tls);
}

/// `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT` and `_KEY`: the files
/// the store's TLS is given (read when the overlay is laid).
#[test]
fn redis_tls_files_are_read_as_ratelimit_names_them() {
    let e = entry(&vars(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.svc:6380"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", "/certs/ca.crt"),
        ("REDIS_TLS_CLIENT_CERT", "/certs/tls.crt"),
        ("REDIS_TLS_CLIENT_KEY", "/certs/tls.key"),
    ]))
    .unwrap();
    let r = e.overlay.redis.unwrap();
    assert_eq!(r.urls, ["rediss://redis.svc:6380"]);
    assert_eq!(r.ca.as_deref(), Some(std::path::Path::new("/certs/ca.crt")));
    assert_eq!(
        r.client,
        Some(("/certs/tls.crt".into(), "/certs/tls.key".into()))
    );
}

/// `GRPC_SERVER_USE_TLS` and its files: the gRPC listener's own TLS,
/// with Envoy Gateway's CA variable read as ratelimit's.
#[test]
fn grpc_tls_variables_make_the_grpc_listeners_tls() {
    let base = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ];
    let t = entry(&vars(&base)).unwrap().overlay.grpc_tls.unwrap();
    assert_eq!(t.cert, std::path::Path::new("/certs/tls.crt"));
    assert_eq!((t.client_ca, t.client_san.len()), (None, 0));
    for ca in ["GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"] {
        let mut list = base.to_vec();
        list.extend([(ca, "/certs/ca.crt"), ("GRPC_CLIENT_TLS_SAN", "envoy")]);
        let t = entry(&vars(&list)).unwrap().overlay.grpc_tls.unwrap();
        assert_eq!(
            t.client_ca.as_deref(),
            Some(std::path::Path::new("/certs/ca.crt"))
        );
        assert_eq!(t.client_san, ["envoy"]);
    }
    assert!(
        entry(&vars(&[("GRPC_SERVER_USE_TLS", "false")]))
            .unwrap()
            .overlay
            .grpc_tls
            .is_none()
    );
}

/// ratelimit's `TRACING_*` become the `OTEL_*` variables the traces
/// read; an `OTEL_*` already set wins.
#[test]
fn tracing_variables_become_otel_variables() {
    let e = entry(&vars(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_SERVICE_NAME", "rl"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
    ]))
    .unwrap();
    let get = |k: &str| {
        e.tracing_env
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("OTEL_SERVICE_NAME"), Some("rl"));
    assert_eq!(get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), Some("grpc"));
    assert_eq!(get("OTEL_TRACES_EXPORTER"), Some("otlp"));
    assert_eq!(
        get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        None,
        "{:?}",
        e.tracing_env
    );
}

/// A setting passed over would limit otherwise than the operator
/// believes (per instance instead of shared in Redis, by other rules
/// than xDS's): the start stops, naming each.
#[test]
fn settings_it_cannot_honour_stop_the_start() {
    let tcp = ("REDIS_SOCKET_TYPE", "tcp");
    let url = ("REDIS_URL", "r:6379");
    for (list, name) in [
        (&[("REDIS_URL", "redis:6379")][..], "REDIS_SOCKET_TYPE"),
        (
            &[("REDIS_URL", "/tmp/r.sock"), ("REDIS_SOCKET_TYPE", "unix")],
            "REDIS_SOCKET_TYPE",
        ),
        (
            &[("REDIS_URL", "r:26379"), tcp, ("REDIS_TYPE", "sentinel")],
            "REDIS_URL",
        ),
        (
            &[url, tcp, ("REDIS_SENTINEL_AUTH", "s")],
            "REDIS_SENTINEL_AUTH",
        ),
        (&[url, tcp, ("REDIS_TYPE", "ring")], "REDIS_TYPE"),
        (
            &[url, tcp, ("REDIS_TLS_CLIENT_KEY", "/k")],
            "REDIS_TLS_CLIENT_KEY",
        ),
        (
            &[url, tcp, ("REDIS_TLS_CLIENT_CERT", "/c")],
            "REDIS_TLS_CLIENT_CERT",
        ),
        (
            &[url, tcp, ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true")],
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        ),
        (&[url, tcp, ("REDIS_PERSECOND", "true")], "REDIS_PERSECOND"),
        (&[url, tcp, ("REDIS_POOL_SIZE", "many")], "REDIS_POOL_SIZE"),
        (&[url, tcp, ("REDIS_TLS", "yes")], "REDIS_TLS"),
        (&[url, tcp, ("REDIS_FUTURE_KNOB", "1")], "REDIS_FUTURE_KNOB"),
        (&[("REDIS_URL", "a:1,b:2"), tcp], "REDIS_URL"),
        (&[("REDIS_AUTH", "x")], "REDIS_AUTH"),
        (&[("REDIS_TLS_CACERT", "/ca")], "REDIS_TLS_CACERT"),
        (&[("CONFIG_TYPE", "GRPC_XDS_DELTA")], "CONFIG_TYPE"),
        (
            &[("CONFIG_GRPC_XDS_SERVER_URL", "xds:18000")],
            "CONFIG_GRPC_XDS_SERVER_URL",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_URL", "grpc://x"),
            ],
            "CONFIG_GRPC_XDS_SERVER_URL",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca"),
            ],
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c"),
            ],
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue"),
            ],
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3"),
            ],
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        ),
        (
            &[("USE_PROMETHEUS", "true"), ("DEBUG_PORT", "6070")],
            "DEBUG_PORT",
        ),
        (
            &[("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", "/stats")],
            "PROMETHEUS_PATH",
        ),
        (
            &[
                ("USE_PROMETHEUS", "true"),
                ("PROMETHEUS_MAPPER_YAML", "/nonexistent/conf.yaml"),
            ],
            "PROMETHEUS_MAPPER_YAML",
        ),
        (&[("LOG_LEVEL", "loud")], "LOG_LEVEL"),
        (
            &[("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "maybe")],
            "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        ),
        (
            &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "2")],
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        ),
        (&[("USE_STATSD", "true")], "USE_STATSD"),
        (&[("TRACING_ENABLED", "maybe")], "TRACING_ENABLED"),
        (&[("GRPC_SERVER_USE_TLS", "true")], "GRPC_SERVER_TLS_CERT"),
        (&[("GRPC_SERVER_TLS_CERT", "/c")], "GRPC_SERVER_TLS_CERT"),
        (
            &[
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", "/c"),
                ("GRPC_SERVER_TLS_KEY", "/k"),
                ("GRPC_CLIENT_TLS_SAN", "envoy"),
            ],
            "GRPC_CLIENT_TLS_SAN",
        ),
        (
            &[
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", "/c"),
                ("GRPC_SERVER_TLS_KEY", "/k"),
                ("GRPC_CLIENT_TLS_CACERT", "/a"),
                ("GRPC_SERVER_TLS_CA_CERT", "/b"),
            ],
            "GRPC_SERVER_TLS_CA_CERT",
        ),
        (&[("BACKEND_TYPE", "memcache")], "BACKEND_TYPE"),
        (&[("MEMCACHE_HOST_PORT", "m:11211")], "MEMCACHE_HOST_PORT"),
    ] {
        let mut all = list.to_vec();
        all.push(("HOST", "0.0.0.0"));
        let why = refused(&all).unwrap_or_else(|| panic!("{list:?} passed"));
        assert!(
            why.contains(name) && !why.contains("\n  HOST:"),
            "{list:?}: {why}"
        );
    }
    let both = refused(&[("REDIS_URL", "r:1"), ("TRACING_ENABLED", "maybe")]).unwrap();
    assert!(
        both.contains("REDIS_SOCKET_TYPE") && both.contains("TRACING_ENABLED"),
        "{both}"
    );
}

#[test]
fn off_values_defaults_and_what_is_honoured_pass() {
    for list in [
        &[("USE_STATSD", "false"), ("USE_PROMETHEUS", "false")][..],
        &[("CONFIG_TYPE", "FILE"), ("BACKEND_TYPE", "redis")],
        &[
            ("RUNTIME_ROOT", "/data"),
            ("LOG_FORMAT", "json"),
            ("REDIS_URL", ""),
        ],
        &[
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "false"),
            ("REDIS_PERSECOND_URL", "unused:1"),
            ("GRPC_MAX_CONNECTION_AGE", ""),
        ],
    ] {
        assert_eq!(refused(list), None, "{list:?}");
    }
    let e = entry(&vars(&[("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "1")])).unwrap();
    assert!(e.overlay.healthy_needs_domains);
    let x = entry(&vars(&[
        ("CONFIG_TYPE", "grpc_xds_sotw"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,team=edge"),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "X-Tenant:blue,authorization:Bearer t",
        ),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "250ms"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1m30s"),
        ("XDS_CLIENT_BACKOFF_JITTER", "false"),
    ]))
    .unwrap()
    .overlay
    .xds
    .unwrap();
    assert_eq!(x.server, "localhost:18000");
    assert_eq!(x.node_id, "default");
    assert!(x.wait_initial && !x.jitter && x.tls.is_none());
    assert_eq!(
        x.node_metadata,
        [("zone".into(), "a".into()), ("team".into(), "edge".into())]
    );
    assert_eq!(x.headers[0], ("x-tenant".into(), "blue".into()));
    assert_eq!(x.connect_retry, Duration::from_millis(250));
    assert_eq!(x.backoff_max, Duration::from_secs(90));
}

#[test]
fn defaults_are_ratelimits_ports_and_directory() {
    assert_eq!(
        run(&[]),
        "ratelimit serve --config /etc/spillway/ratelimit.yaml --listen 0.0.0.0:8080 \
         --grpc-listen 0.0.0.0:8081 --admin-listen 0.0.0.0:6070 \
         --envoy-config /srv/runtime_data/current/config"
    );
}

#[test]
fn the_file_variables_are_read() {
    assert_eq!(
        run(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("GRPC_PORT", "18081"),
            ("HOST", "::"),
            ("LOG_FORMAT", "json"),
            ("SPILLWAY_CONFIG", "/etc/r.yaml"),
        ]),
        "ratelimit --log-format json serve --config /etc/r.yaml --listen [::]:8080 \
         --grpc-listen 0.0.0.0:18081 --admin-listen 0.0.0.0:6070 \
         --envoy-config /data/ratelimit/config"
    );
}

#[test]
fn durations_are_read_as_go_reads_them() {
    for (s, d) in [
        ("0", Duration::ZERO),
        ("3s", Duration::from_secs(3)),
        ("1h30m", Duration::from_secs(5400)),
        ("1.5s", Duration::from_millis(1500)),
        ("150us", Duration::from_micros(150)),
        ("10ms", Duration::from_millis(10)),
    ] {
        assert_eq!(go_duration(s), Ok(d), "{s}");
    }
    for bad in ["", "3", "s", "1d", "-1s", "1.2.3s"] {
        assert!(go_duration(bad).is_err(), "{bad}");
    }
}
