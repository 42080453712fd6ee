use super::*;

fn load(yaml: &str, env: &[(&str, &str)]) -> (Option<TraceSettings>, Vec<String>) {
    let raw: Option<Spanned<RawTraces>> = if yaml.is_empty() {
        None
    } else {
        Some(serde_saphyr::from_str(yaml).unwrap())
    };
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (s, e) = super::load(raw.as_ref(), "rules.yaml", &|k| {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    });
    (s, e.iter().map(ToString::to_string).collect())
}

#[test]
fn off_unless_asked_for() {
    assert_eq!(load("", &[]), (None, vec![]));
    // Variables meant for others, with traces off: not read.
    assert_eq!(load("", &[("OTEL_TRACES_SAMPLER", "xray")]), (None, vec![]));
    let (s, e) = load(
        "",
        &[
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ],
    );
    assert!(s.is_none() && e.is_empty(), "{e:?}");
    let (s, _) = load(
        "endpoint: http://c:4318\n",
        &[("OTEL_SDK_DISABLED", "true")],
    );
    assert!(s.is_none());
    // An endpoint variable or a section turns them on.
    let (s, e) = load("", &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")]);
    assert!(e.is_empty(), "{e:?}");
    let s = s.unwrap();
    assert_eq!(s.endpoint, "http://c:4318/v1/traces");
    assert_eq!(s.protocol, Protocol::HttpProtobuf);
    assert_eq!(s.sampler, Sampler::default());
    assert_eq!(s.resource, vec![("service.name".into(), "spillway".into())]);
    let (s, _) = load("{}", &[]);
    assert_eq!(s.unwrap().endpoint, "http://localhost:4318/v1/traces");
    let (s, _) = load(
        "",
        &[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ],
    );
    assert_eq!(s.unwrap().endpoint, "http://localhost:4317/");
}

#[test]
fn the_environment_wins_over_the_file() {
    let file = "endpoint: http://file:4318\nprotocol: grpc\nsample_ratio: 0.5\nservice_name: from-file\nheaders: { x-token: abc }\n";
    let (s, e) = load(file, &[]);
    assert!(e.is_empty(), "{e:?}");
    let s = s.unwrap();
    assert_eq!(
        (s.protocol, s.endpoint.to_string()),
        (Protocol::Grpc, "http://file:4318/".into())
    );
    assert_eq!(
        s.sampler,
        Sampler {
            ratio: 0.5,
            parent_based: true
        }
    );
    assert_eq!(s.resource[0].1, "from-file");
    assert_eq!(s.headers[0].0, "x-token");
    let (s, e) = load(
        file,
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://env:9999/custom",
            ),
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_SERVICE_NAME", "from-env"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=ignored,deployment.environment=prod%2Ceu",
            ),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "Authorization=Bearer%20t , x-b=1",
            ),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "250"),
        ],
    );
    assert!(e.is_empty(), "{e:?}");
    let s = s.unwrap();
    assert_eq!(s.protocol, Protocol::HttpProtobuf);
    assert_eq!(s.endpoint, "http://env:9999/custom");
    assert_eq!(
        s.sampler,
        Sampler {
            ratio: 0.25,
            parent_based: false
        }
    );
    assert_eq!(
        s.resource,
        vec![
            ("service.name".into(), "from-env".into()),
            ("deployment.environment".into(), "prod,eu".into())
        ]
    );
    assert_eq!(s.headers.len(), 2);
    assert_eq!(s.headers[0].1, "Bearer t");
    assert_eq!(s.timeout, Duration::from_millis(250));
}

#[test]
fn what_cannot_be_honoured_is_refused_with_where_it_came_from() {
    let (_, e) = load("", &[("OTEL_TRACES_EXPORTER", "zipkin")]);
    assert!(
        e.len() == 1 && e[0].contains("OTEL_TRACES_EXPORTER=\"zipkin\""),
        "{e:?}"
    );
    let on = ("OTEL_TRACES_EXPORTER", "otlp");
    for (var, value, says) in [
        (
            "OTEL_TRACES_SAMPLER",
            "jaeger_remote",
            "parentbased_traceidratio",
        ),
        ("OTEL_TRACES_SAMPLER_ARG", "1.5", "from 0 to 1"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "not supported"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317", "http://"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://c:4317", "https://"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s", "milliseconds"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0", "from 1"),
        ("OTEL_RESOURCE_ATTRIBUTES", "novalue", "key=value"),
    ] {
        let (s, e) = load("", &[on, (var, value)]);
        assert_eq!(e.len(), 1, "{var}={value}: {e:?}");
        assert!(e[0].contains(var) && e[0].contains(says), "{var}: {e:?}");
        if var.contains("ENDPOINT") {
            assert!(s.is_none());
        }
    }
    // A header's value is never shown: it is often a credential.
    let (_, e) = load(
        "",
        &[
            on,
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=sec%0Aret"),
        ],
    );
    assert!(e.len() == 1 && !e[0].contains("secret"), "{e:?}");
    let (_, e) = load("", &[on, ("OTEL_EXPORTER_OTLP_HEADERS", "nokeyvalue")]);
    assert!(e.len() == 1 && e[0].contains("entry 1"), "{e:?}");
    // The file's, by line and column.
    let (_, e) = load(
        "endpoint: ftp://x\nsample_ratio: 2\nprotocol: thrift\n",
        &[],
    );
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e.iter()
            .any(|m| m.starts_with("rules.yaml:1:") && m.contains("traces.endpoint"))
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("rules.yaml:2:") && m.contains("traces.sample_ratio"))
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("rules.yaml:3:") && m.contains("traces.protocol"))
    );
}

#[test]
fn samplers() {
    let on = ("OTEL_TRACES_EXPORTER", "otlp");
    for (name, arg, ratio, parent) in [
        ("always_on", None, 1.0, false),
        ("always_off", None, 0.0, false),
        ("traceidratio", Some("0.1"), 0.1, false),
        ("traceidratio", None, 1.0, false),
        ("parentbased_always_on", None, 1.0, true),
        ("parentbased_always_off", None, 0.0, true),
        ("parentbased_traceidratio", Some("0"), 0.0, true),
    ] {
        let mut env = vec![on, ("OTEL_TRACES_SAMPLER", name)];
        if let Some(a) = arg {
            env.push(("OTEL_TRACES_SAMPLER_ARG", a));
        }
        let (s, e) = load("", &env);
        assert!(e.is_empty(), "{name}: {e:?}");
        assert_eq!(
            s.unwrap().sampler,
            Sampler {
                ratio,
                parent_based: parent
            },
            "{name}"
        );
    }
}

#[test]
fn ratelimits_tracing_variables() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let got = ratelimit_tracing_env(&env(&[])).unwrap();
    assert_eq!(got, vec![("OTEL_TRACES_EXPORTER", "none".to_string())]);
    let got = ratelimit_tracing_env(&env(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_SERVICE_NAME", "rl"),
        ("TRACING_SERVICE_NAMESPACE", "edge ns"),
        ("TRACING_SERVICE_INSTANCE_ID", "pod-1"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("TRACING_SAMPLING_RATE", "0.3"),
        ("OTEL_SERVICE_NAME", "wins"),
    ]))
    .unwrap();
    let get = |k: &str| got.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("OTEL_TRACES_EXPORTER"), Some("otlp"));
    assert_eq!(
        get("OTEL_SERVICE_NAME"),
        None,
        "a variable already set wins"
    );
    assert_eq!(get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), Some("grpc"));
    assert_eq!(get("OTEL_TRACES_SAMPLER"), Some("parentbased_traceidratio"));
    assert_eq!(get("OTEL_TRACES_SAMPLER_ARG"), Some("0.3"));
    assert_eq!(
        get("OTEL_RESOURCE_ATTRIBUTES"),
        Some("service.namespace=edge%20ns,service.instance.id=pod-1")
    );
    // What it maps to reads back as settings.
    let (s, e) = load(
        "",
        &got.iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect::<Vec<_>>(),
    );
    assert!(e.is_empty(), "{e:?}");
    let s = s.unwrap();
    assert_eq!(s.protocol, Protocol::Grpc);
    assert!(
        s.resource
            .contains(&("service.namespace".into(), "edge ns".into()))
    );
    for (k, v, says) in [
        ("TRACING_ENABLED", "yes", "TRACING_ENABLED"),
        ("TRACING_EXPORTER_PROTOCOL", "thrift", "http or grpc"),
        ("TRACING_SAMPLING_RATE", "half", "a number"),
    ] {
        let vars: Vec<(String, String)> = vec![
            ("TRACING_ENABLED".into(), "true".into()),
            (k.into(), v.into()),
        ];
        let e = ratelimit_tracing_env(&|n: &str| {
            vars.iter()
                .rev()
                .find(|(x, _)| x == n)
                .map(|(_, v)| v.clone())
        })
        .unwrap_err();
        assert!(e.contains(says), "{k}: {e}");
    }
    // Rates past the ends keep all or none, as ratelimit's sampler does.
    let got = ratelimit_tracing_env(&env(&[
        ("TRACING_ENABLED", "1"),
        ("TRACING_SAMPLING_RATE", "5"),
    ]))
    .unwrap();
    assert!(got.contains(&("OTEL_TRACES_SAMPLER_ARG", "1".to_string())));
}

/// A self-signed certificate and its key, as PEM files in a fresh folder.
fn pem_files(tag: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("spillway-traces-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["collector".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let c = dir.join("cert.pem");
    let k = dir.join("key.pem");
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (dir, c, k)
}

#[test]
fn https_collectors_take_a_ca_and_a_client_certificate() {
    let (dir, cert, key) = pem_files("tls");
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let on = ("OTEL_TRACES_EXPORTER", "otlp");
    // https, no files: the system's bundle.
    let (s, e) = load("", &[on, ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318")]);
    assert!(e.is_empty(), "{e:?}");
    let s = s.unwrap();
    assert_eq!(s.endpoint, "https://c:4318/v1/traces");
    let tls = s.tls.unwrap();
    assert_eq!((tls.ca, tls.client), (None, None));
    // The variables: a CA, a client certificate and its key.
    let (s, e) = load(
        "",
        &[
            on,
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", c),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", c),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", k),
        ],
    );
    assert!(e.is_empty(), "{e:?}");
    let tls = s.unwrap().tls.unwrap();
    assert_eq!(tls.ca.as_deref(), Some(cert.as_path()));
    assert_eq!(tls.client, Some((cert.clone(), key.clone())));
    assert!(tls.config.alpn_protocols.is_empty());
    // The file's section, and a variable over it.
    let yaml = format!("endpoint: https://c:4318\ntls: {{ ca: {c}, cert: {c}, key: {k} }}\n");
    let (s, e) = load(&yaml, &[]);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(
        s.unwrap().tls.unwrap().client,
        Some((cert.clone(), key.clone()))
    );
    let (_, e) = load(&yaml, &[("OTEL_EXPORTER_OTLP_CERTIFICATE", k)]);
    assert!(
        e.len() == 1 && e[0].contains("OTEL_EXPORTER_OTLP_CERTIFICATE"),
        "a key is no CA: {e:?}"
    );
    // What cannot be honoured stops the start.
    for (env, says) in [
        (
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", c),
            ],
            "endpoint is http://",
        ),
        (
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318"),
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", c),
            ],
            "needs its key",
        ),
        (
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318"),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/no/such/ca.pem"),
            ],
            "cannot read",
        ),
    ] {
        let mut all = vec![on];
        all.extend(env.iter().copied());
        let (_, e) = load("", &all);
        assert!(e.len() == 1 && e[0].contains(says), "{env:?}: {e:?}");
    }
    // The general variables are every signal's: with traces over http://
    // they are another signal's, and not an error.
    let (s, e) = load(
        "",
        &[
            on,
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://agent:4318/v1/traces",
            ),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", c),
        ],
    );
    assert!(e.is_empty(), "{e:?}");
    assert!(s.unwrap().tls.is_none());
    // The file's section with an http:// endpoint: told at its line.
    let (_, e) = load(
        &format!("endpoint: http://c:4318\ntls: {{ ca: {c} }}\n"),
        &[],
    );
    assert!(
        e.len() == 1 && e[0].starts_with("rules.yaml:2:") && e[0].contains("traces.tls"),
        "{e:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
