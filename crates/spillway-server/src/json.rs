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
