//! JSON bodies read as docs/openapi.yaml describes them, for every way in
//! that takes one.

use serde::Deserialize;

/// For `#[serde(default, deserialize_with = "present")]`: a field that is
/// given is given as its type says. `null` is refused (the description
/// never allows it: leave the field out), never read as absent.
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// A listener's refusal before any way in reads the request (a head too
/// large, a budget full): a problem body, and the connection closed. What
/// [`spillway_wire::Handler::refuse`] writes for the listeners whose ways
/// in have no body of their own (the routed ones, gRPC).
pub(crate) fn refuse_problem(status: http::StatusCode, detail: &str, out: &mut Vec<u8>) {
    let json = spillway_tower::render::Problem::new(status, detail).to_json();
    spillway_wire::write::answer(
        out,
        status,
        spillway_tower::render::PROBLEM_JSON,
        json.as_bytes(),
        true,
        false,
        |_| {},
    );
}
