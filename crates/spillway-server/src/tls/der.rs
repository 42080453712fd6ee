//! Just enough DER to read a certificate's serial number and expiry
//! (RFC 5280: Certificate, TBSCertificate, Validity). Every length is
//! checked: a certificate that does not parse gives `None`s, not a panic.

use super::{CertInfo, Expiry};

/// One TLV: its tag, contents, and what follows it.
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = b.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &x| (acc << 8) | usize::from(x));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

pub(super) fn info(cert: &[u8]) -> CertInfo {
    parse(cert).unwrap_or_default()
}

fn parse(cert: &[u8]) -> Option<CertInfo> {
    let (SEQUENCE, cert, _) = tlv(cert)? else {
        return None;
    };
    let (SEQUENCE, mut tbs, _) = tlv(cert)? else {
        return None;
    };
    let (mut tag, mut value, mut rest) = tlv(tbs)?;
    if tag == VERSION {
        tbs = rest;
        (tag, value, rest) = tlv(tbs)?;
    }
    let serial = (tag == INTEGER).then(|| hex(value));
    // The signature algorithm, the issuer, then the validity.
    let (_, _, rest) = tlv(rest)?;
    let (_, _, rest) = tlv(rest)?;
    let (SEQUENCE, validity, _) = tlv(rest)? else {
        return Some(CertInfo {
            serial,
            not_after: None,
        });
    };
    let (_, _, validity) = tlv(validity)?;
    let (tag, text, _) = tlv(validity)?;
    Some(CertInfo {
        serial,
        not_after: time(tag, text),
    })
}

const EXTENSIONS: u8 = 0xa3;
const OID: u8 = 0x06;
const BOOLEAN: u8 = 0x01;
const OCTET_STRING: u8 = 0x04;
/// id-ce-subjectAltName, 2.5.29.17.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
/// GeneralName's `dNSName [2] IA5String` and
/// `uniformResourceIdentifier [6] IA5String`, implicitly tagged.
const DNS_NAME: u8 = 0x82;
const URI: u8 = 0x86;

/// A certificate's DNS and URI subject alternative names (RFC 5280
/// 4.2.1.6), as written; other kinds of name are left out. `None` when
/// the certificate does not parse.
pub(super) fn sans(cert: &[u8]) -> Option<Vec<String>> {
    let (SEQUENCE, cert, _) = tlv(cert)? else {
        return None;
    };
    let (SEQUENCE, mut tbs, _) = tlv(cert)? else {
        return None;
    };
    let mut out = Vec::new();
    while !tbs.is_empty() {
        let (tag, value, rest) = tlv(tbs)?;
        tbs = rest;
        if tag != EXTENSIONS {
            continue;
        }
        let (SEQUENCE, mut exts, _) = tlv(value)? else {
            return None;
        };
        while !exts.is_empty() {
            let (SEQUENCE, ext, rest) = tlv(exts)? else {
                return None;
            };
            exts = rest;
            let (OID, oid, mut rest) = tlv(ext)? else {
                return None;
            };
            if oid != SUBJECT_ALT_NAME {
                continue;
            }
            if let (BOOLEAN, _, after) = tlv(rest)? {
                rest = after;
            }
            let (OCTET_STRING, names, _) = tlv(rest)? else {
                return None;
            };
            let (SEQUENCE, mut names, _) = tlv(names)? else {
                return None;
            };
            while !names.is_empty() {
                let (tag, name, rest) = tlv(names)?;
                names = rest;
                if tag == DNS_NAME || tag == URI {
                    out.push(std::str::from_utf8(name).ok()?.to_string());
                }
            }
        }
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    // Leading zero bytes (one keeps the number positive) say nothing.
    let skip = bytes
        .iter()
        .take(bytes.len().saturating_sub(1))
        .take_while(|&&b| b == 0)
        .count();
    let bytes = &bytes[skip..];
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// An RFC 5280 time: UTCTime `YYMMDDHHMMSSZ` (years 1950 to 2049) or
/// GeneralizedTime `YYYYMMDDHHMMSSZ`.
pub(super) fn time(tag: u8, text: &[u8]) -> Option<Expiry> {
    let digits = match (tag, text) {
        (UTC_TIME, [d @ .., b'Z']) if d.len() == 12 => d,
        (GENERALIZED_TIME, [d @ .., b'Z']) if d.len() == 14 => d,
        _ => return None,
    };
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let num = |s: &[u8]| s.iter().fold(0i64, |a, &d| a * 10 + i64::from(d - b'0'));
    let (year, rest) = if tag == UTC_TIME {
        let yy = num(&digits[..2]);
        (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &digits[2..])
    } else {
        (num(&digits[..4]), &digits[4..])
    };
    let (month, day) = (num(&rest[0..2]), num(&rest[2..4]));
    let (h, m, s) = (num(&rest[4..6]), num(&rest[6..8]), num(&rest[8..10]));
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    let (m32, d32) = (u32::try_from(month).ok()?, u32::try_from(day).ok()?);
    let unix =
        spillway_core::date::days_from_civil(year, m32, d32) * 86_400 + h * 3600 + m * 60 + s;
    Some(Expiry {
        unix,
        rfc3339: format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_rfc_5280_says() {
        let t = time(UTC_TIME, b"700101000000Z").unwrap();
        assert_eq!((t.unix, t.rfc3339.as_str()), (0, "1970-01-01T00:00:00Z"));
        let t = time(UTC_TIME, b"491231235959Z").unwrap();
        assert_eq!(t.rfc3339, "2049-12-31T23:59:59Z");
        assert_eq!(t.unix, 2_524_607_999);
        let t = time(GENERALIZED_TIME, b"20240229120000Z").unwrap();
        assert_eq!(t.unix, 1_709_208_000);
        for bad in [
            &b"7001010000Z"[..],
            b"700101000000",
            b"70a101000000Z",
            b"701301000000Z",
        ] {
            assert_eq!(time(UTC_TIME, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn sans_are_the_dns_and_uri_names() {
        let mut params =
            rcgen::CertificateParams::new(vec!["a.example".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        params.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://cluster.local/ns/envoy-gateway-system/sa/envoy"
                .try_into()
                .unwrap(),
        ));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            sans(cert.der()).unwrap(),
            vec![
                "a.example".to_string(),
                "spiffe://cluster.local/ns/envoy-gateway-system/sa/envoy".to_string()
            ]
        );
        let none = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        assert_eq!(
            sans(none.self_signed(&key).unwrap().der()).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn garbage_gives_nothing_and_no_panic() {
        for bytes in [
            &[][..],
            &[0x30],
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
            &[0x30, 0x03, 0x30, 0x01],
            &[0x30, 0x02, 0x02, 0x00],
        ] {
            assert_eq!(info(bytes), CertInfo::default());
            assert_eq!(sans(bytes), None);
        }
    }
}
