//! Calendar dates, the one copy of the civil-date arithmetic spillway
//! uses: trace timestamps in `spillway simulate`, the admin plane's audit
//! times and `since=` filters, certificate expiry, and JSON log lines.
//!
//! Proleptic Gregorian, UTC, days counted from 1970-01-01. The year is
//! counted from March, so the leap day is the last day of its year and
//! every month's first day is a fixed formula of its index; 400 years (an
//! era) are always 146 097 days. Written here rather than taken from a
//! date crate: it is one function each way.
//!
//! # Examples
//! ```
//! use spillway_core::date;
//! assert_eq!(date::days_from_civil(1970, 1, 1), 0);
//! assert_eq!(date::civil_from_days(19_000), (2022, 1, 8));
//! assert_eq!(date::rfc3339_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
//! ```

/// Days from 1970-01-01 to the given date (negative before it). `month`
/// is 1 to 12 and `day` 1 to 31; a day past its month's end counts on
/// into the next (callers that read dates check with [`civil_from_days`]
/// that the date reads back as itself).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    // March = 0, ..., February = 11.
    let m = i64::from((month + 9) % 12);
    let day_of_year = (153 * m + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 719 468 days from 0000-03-01 to 1970-01-01.
    era * 146_097 + day_of_era - 719_468
}

/// The date `days` after 1970-01-01 as (year, month, day): the inverse of
/// [`days_from_civil`].
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let m = (5 * day_of_year + 2) / 153;
    // Both are in range by construction (day 1..=31, month 1..=12).
    let day = u32::try_from(day_of_year - (153 * m + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if m < 10 { m + 3 } else { m - 9 }).unwrap_or(1);
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Whether `year` has a 29 February.
pub fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// Days in `month` (1 to 12) of `year`.
pub fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `ms` milliseconds since the Unix epoch as RFC 3339, UTC, with
/// milliseconds: `2026-11-24T10:00:00.000Z`.
pub fn rfc3339_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2));
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Every day from 1600 to 9999 reads back as itself, and the days
        /// of a year add up to its length.
        #[test]
        fn days_and_dates_are_inverse(days in -135_140i64..2_932_896) {
            let (y, m, d) = civil_from_days(days);
            proptest::prop_assert!((1..=12).contains(&m));
            proptest::prop_assert!(d >= 1 && d <= days_in_month(y, m));
            proptest::prop_assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert!(is_leap(2000) && !is_leap(1900) && is_leap(2024) && !is_leap(2026));
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_999), "2000-02-29T00:00:00.999Z");
    }
}
