use super::*;

#[test]
fn segments_decode_or_are_refused() {
    assert_eq!(decode("a%2Fb%20c").as_deref(), Some("a/b c"));
    assert_eq!(decode("%zz"), None);
    assert_eq!(decode("%2"), None);
    assert_eq!(decode("%ff"), None);
    assert_eq!(decode("%+f"), None);
    assert_eq!(decode("plain").as_deref(), Some("plain"));
}

proptest::proptest! {
    #[test]
    fn any_segment_decodes_or_is_refused(s in "\\PC{0,30}") {
        let _ = decode(&s);
    }
}
