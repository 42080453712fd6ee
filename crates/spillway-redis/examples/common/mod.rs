//! What the Redis examples share.

/// Script calls so far and the microseconds Redis spent in them (INFO
/// commandstats: `cmdstat_evalsha:calls=N,usec=M,...`).
pub fn script_stats(url: &str) -> (f64, f64) {
    let client = redis::Client::open(url).expect("url");
    let mut c = client.get_connection().expect("connect");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .expect("INFO");
    let (mut calls, mut usec) = (0.0, 0.0);
    for line in info.lines() {
        let Some(rest) = line
            .strip_prefix("cmdstat_evalsha:")
            .or_else(|| line.strip_prefix("cmdstat_eval:"))
        else {
            continue;
        };
        for kv in rest.split(',') {
            match kv.split_once('=') {
                Some(("calls", v)) => calls += v.trim().parse::<f64>().unwrap_or(0.0),
                Some(("usec", v)) => usec += v.trim().parse::<f64>().unwrap_or(0.0),
                _ => {}
            }
        }
    }
    (calls, usec)
}
