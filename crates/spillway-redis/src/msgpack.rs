//! Reading the script's reply: a MessagePack array of numbers, as Redis's
//! `cmsgpack.pack` writes it (integers in the smallest form that holds them;
//! a Lua number with a fraction as a float).

/// The numbers of a MessagePack array, floats truncated towards zero.
///
/// # Errors
/// Input that is not one array of numbers, or has bytes after it.
pub(crate) fn unpack_numbers(b: &[u8]) -> Result<Vec<i64>, &'static str> {
    let mut r = Reader { b, at: 0 };
    let n = match r.byte()? {
        t @ 0x90..=0x9f => usize::from(t & 0x0f),
        0xdc => usize::from(u16::from_be_bytes(r.array()?)),
        0xdd => u32::from_be_bytes(r.array()?) as usize,
        _ => return Err("reply is not a MessagePack array"),
    };
    // Each number takes at least one byte: a length beyond the input is a lie.
    if n > b.len() {
        return Err("MessagePack array longer than the reply");
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(r.number()?);
    }
    if r.at != b.len() {
        return Err("bytes after the MessagePack array");
    }
    Ok(out)
}

/// Appends a MessagePack array header for `n` values.
pub(crate) fn push_array_len(out: &mut Vec<u8>, n: usize) {
    match n {
        0..=15 => out.push(0x90 | n as u8),
        16..=0xffff => {
            out.push(0xdc);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            out.push(0xdd);
            out.extend_from_slice(&(u32::try_from(n).unwrap_or(u32::MAX)).to_be_bytes());
        }
    }
}

/// Appends `v` in the shortest MessagePack form.
pub(crate) fn push_uint(out: &mut Vec<u8>, v: u64) {
    match v {
        0..=0x7f => out.push(v as u8),
        0x80..=0xff => out.extend_from_slice(&[0xcc, v as u8]),
        0x100..=0xffff => {
            out.push(0xcd);
            out.extend_from_slice(&(v as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(0xce);
            out.extend_from_slice(&(v as u32).to_be_bytes());
        }
        _ => {
            out.push(0xcf);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// Appends `s` as a MessagePack string (raw bytes: Lua strings are bytes).
pub(crate) fn push_str(out: &mut Vec<u8>, s: &[u8]) {
    match s.len() {
        0..=31 => out.push(0xa0 | s.len() as u8),
        32..=0xff => out.extend_from_slice(&[0xd9, s.len() as u8]),
        n @ 0x100..=0xffff => {
            out.push(0xda);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0xdb);
            out.extend_from_slice(&(u32::try_from(n).unwrap_or(u32::MAX)).to_be_bytes());
        }
    }
    out.extend_from_slice(s);
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, &'static str> {
        let v = *self.b.get(self.at).ok_or("MessagePack reply cut short")?;
        self.at += 1;
        Ok(v)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], &'static str> {
        let s = self
            .b
            .get(self.at..self.at + N)
            .ok_or("MessagePack reply cut short")?;
        self.at += N;
        Ok(s.try_into().unwrap_or([0; N]))
    }

    fn number(&mut self) -> Result<i64, &'static str> {
        let t = self.byte()?;
        Ok(match t {
            0x00..=0x7f => i64::from(t),
            0xe0..=0xff => i64::from(t as i8),
            0xcc => i64::from(self.byte()?),
            0xcd => i64::from(u16::from_be_bytes(self.array()?)),
            0xce => i64::from(u32::from_be_bytes(self.array()?)),
            0xcf => i64::try_from(u64::from_be_bytes(self.array()?)).unwrap_or(i64::MAX),
            0xd0 => i64::from(self.byte()? as i8),
            0xd1 => i64::from(i16::from_be_bytes(self.array()?)),
            0xd2 => i64::from(i32::from_be_bytes(self.array()?)),
            0xd3 => i64::from_be_bytes(self.array()?),
            // `as` saturates, and takes NaN to 0.
            0xca => f32::from_be_bytes(self.array()?) as i64,
            0xcb => f64::from_be_bytes(self.array()?) as i64,
            _ => return Err("a MessagePack value that is not a number"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every number form, after `header`.
    fn numbers(header: &[u8]) -> Vec<u8> {
        let mut b = header.to_vec();
        b.extend_from_slice(&[0x00, 0x7f, 0xff, 0xe0]);
        b.extend_from_slice(&[0xcc, 200, 0xcd, 0x12, 0x34, 0xce, 0, 1, 0, 0]);
        b.extend_from_slice(&[0xcf, 0, 6, 0x60, 0xd8, 0x5a, 0xb6, 0xd2, 0x24]);
        b.extend_from_slice(&[0xd0, 0x80, 0xd1, 0xff, 0x7f, 0xd2, 0x80, 0, 0, 0]);
        b.extend_from_slice(&[0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]);
        b.extend_from_slice(&[0xca, 0x40, 0x60, 0, 0]);
        b.push(0xcb);
        b.extend_from_slice(&(-2.75f64).to_be_bytes());
        b
    }

    const EXPECTED: [i64; 14] = [
        0,
        127,
        -1,
        -32,
        200,
        0x1234,
        65_536,
        1_795_332_211_397_156,
        -128,
        -129,
        -2_147_483_648,
        -2,
        3,
        -2,
    ];

    #[test]
    fn reads_every_number_form_in_every_array_form() {
        for header in [&[0x9e][..], &[0xdc, 0, 14], &[0xdd, 0, 0, 0, 14]] {
            assert_eq!(unpack_numbers(&numbers(header)).unwrap(), EXPECTED);
        }
        assert_eq!(unpack_numbers(&[0x90]).unwrap(), Vec::<i64>::new());
    }

    #[test]
    fn agrees_with_a_real_redis_both_ways() {
        // Numbers of every size the script and the client exchange (times in
        // microseconds, "never" = -1), through Redis's own cmsgpack: packed
        // there and read here, packed here and read there.
        let signed: [i64; 21] = [
            0,
            1,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            4_294_967_295,
            4_294_967_296,
            1_795_332_211_397_156,
            9_007_199_254_740_992,
            -1,
            -32,
            -33,
            -128,
            -129,
            -32_768,
            -32_769,
            -2_147_483_648,
            -2_147_483_649,
        ];
        let server = spillway_testkit::RedisServer::start();
        let client = redis::Client::open(server.url()).unwrap();
        let mut c = client.get_connection().unwrap();

        let list: Vec<String> = signed.iter().map(i64::to_string).collect();
        // A fraction is truncated.
        let script = format!("return cmsgpack.pack({{{}, 2.5}})", list.join(", "));
        let packed: Vec<u8> = redis::cmd("EVAL").arg(script).arg(0).query(&mut c).unwrap();
        let mut expected = signed.to_vec();
        expected.push(2);
        assert_eq!(unpack_numbers(&packed).unwrap(), expected);

        let unsigned: Vec<u64> = signed
            .iter()
            .filter_map(|&n| u64::try_from(n).ok())
            .collect();
        let strings: [&[u8]; 4] = [b"", b"\x00\x01tag\xff", &[b'x'; 40], &[b'y'; 300]];
        let mut blob = Vec::new();
        push_array_len(&mut blob, unsigned.len() + strings.len());
        for &n in &unsigned {
            push_uint(&mut blob, n);
        }
        for s in strings {
            push_str(&mut blob, s);
        }
        let script = "local t = cmsgpack.unpack(ARGV[1]) \
             local out = {} \
             for i = 1, #t do \
               if type(t[i]) == 'number' then out[i] = string.format('%.0f', t[i]) \
               else out[i] = t[i] end \
             end \
             return out";
        let back: Vec<Vec<u8>> = redis::cmd("EVAL")
            .arg(script)
            .arg(0)
            .arg(blob)
            .query(&mut c)
            .unwrap();
        let mut expected: Vec<Vec<u8>> = unsigned
            .iter()
            .map(|n| n.to_string().into_bytes())
            .collect();
        expected.extend(strings.iter().map(|s| s.to_vec()));
        assert_eq!(back, expected);
        let mut big = Vec::new();
        push_array_len(&mut big, 70_000);
        assert_eq!(big, [0xdd, 0, 1, 0x11, 0x70]);
    }

    #[test]
    fn rejects_what_is_not_one_array_of_numbers() {
        let whole = numbers(&[0x9e]);
        for cut in 0..whole.len() {
            assert!(unpack_numbers(&whole[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = whole.clone();
        longer.push(0x01);
        assert!(unpack_numbers(&longer).is_err());
        // A string, a map, nil; an array declaring 2^32 - 1 numbers.
        assert!(unpack_numbers(&[0x91, 0xa1, b'x']).is_err());
        assert!(unpack_numbers(&[0x80]).is_err());
        assert!(unpack_numbers(&[0x91, 0xc0]).is_err());
        assert!(unpack_numbers(&[0xdd, 0xff, 0xff, 0xff, 0xff, 1]).is_err());
    }
}
