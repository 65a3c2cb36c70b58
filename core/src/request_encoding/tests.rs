use std::io::Write;

use super::*;
use crate::openresponses::Code;

const JSON: &[u8] = br#"{"model":"m","input":"hello, hello, hello, hello"}"#;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn raw_deflate(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn brotli(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
        w.write_all(data).unwrap();
    }
    out
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(data, 3).unwrap()
}

fn encode(coding: Coding, data: &[u8]) -> Vec<u8> {
    match coding {
        Coding::Gzip => gzip(data),
        Coding::Deflate => zlib(data),
        Coding::Brotli => brotli(data),
        Coding::Zstd => zstd(data),
    }
}

/// Decodes `body` in pieces of `piece` bytes.
fn decode(
    codings: &[Coding],
    body: &[u8],
    piece: usize,
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    let mut d = Decoder::new(codings, limit);
    for chunk in body.chunks(piece.max(1)) {
        d.push(chunk)?;
    }
    d.finish()
}

fn code(e: &ApiError) -> (u16, Option<&str>) {
    (e.status, e.code.as_ref().map(Code::as_str))
}

#[test]
fn every_coding_is_read_in_any_pieces() {
    for coding in Coding::ALL {
        let body = encode(coding, JSON);
        for piece in [1, 7, body.len()] {
            assert_eq!(
                decode(&[coding], &body, piece, 1 << 20).unwrap(),
                JSON,
                "{coding:?} in pieces of {piece}"
            );
        }
    }
    // Raw deflate, as some browsers send `deflate`; several gzip members; several zstd frames.
    assert_eq!(
        decode(&[Coding::Deflate], &raw_deflate(JSON), 3, 1 << 20).unwrap(),
        JSON
    );
    let two = [gzip(b"{\"model\":"), gzip(b"\"m\"}")].concat();
    assert_eq!(
        decode(&[Coding::Gzip], &two, 5, 1 << 20).unwrap(),
        br#"{"model":"m"}"#
    );
    let two = [zstd(b"{\"model\":"), zstd(b"\"m\"}")].concat();
    assert_eq!(
        decode(&[Coding::Zstd], &two, 5, 1 << 20).unwrap(),
        br#"{"model":"m"}"#
    );
}

#[test]
fn stacked_codings_are_undone_last_first() {
    let listed = codings(Some("gzip, br")).unwrap();
    assert_eq!(listed, [Coding::Gzip, Coding::Brotli]);
    let body = brotli(&gzip(JSON));
    assert_eq!(decode(&listed, &body, 4, 1 << 20).unwrap(), JSON);
    let listed = codings(Some("zstd,deflate , gzip")).unwrap();
    let body = gzip(&zlib(&zstd(JSON)));
    assert_eq!(decode(&listed, &body, 11, 1 << 20).unwrap(), JSON);
}

#[test]
fn plain_bodies_have_no_codings_and_unknown_ones_are_a_415_naming_them() {
    for value in [
        None,
        Some(""),
        Some(" identity "),
        Some("IDENTITY, identity"),
    ] {
        assert_eq!(codings(value), Ok(Vec::new()), "{value:?}");
    }
    assert_eq!(codings(Some("X-GZIP")), Ok(vec![Coding::Gzip]));
    for (value, named) in [("compress", "compress"), ("gzip, x-custom", "x-custom")] {
        let e = codings(Some(value)).unwrap_err();
        assert_eq!(code(&e), (415, Some("unsupported_content_encoding")));
        assert!(e.message.contains(&format!("'{named}'")), "{}", e.message);
    }
}

#[test]
fn a_bomb_stops_at_the_cap() {
    let limit = 1 << 20;
    let zeros = vec![b' '; 64 << 20];
    for coding in Coding::ALL {
        let bomb = encode(coding, &zeros);
        assert!(bomb.len() < limit / 8, "{coding:?}: {} bytes", bomb.len());
        let e = decode(&[coding], &bomb, 16 << 10, limit).unwrap_err();
        assert_eq!(
            code(&e),
            (413, Some("request_too_large")),
            "{coding:?}: {e}"
        );
    }
}

#[test]
fn the_cap_is_on_the_decoded_size_exactly() {
    let limit = 10_000;
    for coding in Coding::ALL {
        let at = vec![b'a'; limit];
        assert_eq!(
            decode(&[coding], &encode(coding, &at), 100, limit)
                .unwrap()
                .len(),
            limit
        );
        let over = vec![b'a'; limit + 1];
        let e = decode(&[coding], &encode(coding, &over), 100, limit).unwrap_err();
        assert_eq!(code(&e), (413, Some("request_too_large")), "{coding:?}");
    }
    // The encoded bytes are bounded by the cap too.
    let noise: Vec<u8> = (0..3000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let e = decode(&[Coding::Gzip], &gzip(&noise), 100, 2000).unwrap_err();
    assert_eq!(code(&e), (413, Some("request_too_large")));
}

#[test]
fn a_body_cut_short_corrupt_or_with_more_after_its_end_is_a_400() {
    for coding in Coding::ALL {
        let body = encode(coding, JSON);
        let cut = &body[..body.len() - 3];
        let mut corrupt = body.clone();
        let middle = corrupt.len() / 2;
        corrupt[middle] ^= 0x55;
        corrupt[middle + 1] ^= 0xaa;
        let trailing = [&body[..], b"garbage"].concat();
        for (what, bad) in [
            ("cut", cut),
            ("corrupt", &corrupt[..]),
            ("trailing", &trailing[..]),
        ] {
            match decode(&[coding], bad, 5, 1 << 20) {
                Err(e) => assert_eq!(
                    code(&e),
                    (400, Some("invalid_encoded_body")),
                    "{coding:?} {what}: {e}"
                ),
                // Flipped bytes may still decode where the coding has no checksum (zlib
                // checks only at its end, zstd frames may have none): never to the original.
                Ok(out) => assert!(
                    what == "corrupt" && out != JSON,
                    "{coding:?} {what} decoded"
                ),
            }
        }
    }
    let e = decode(&[Coding::Gzip], b"not gzip at all", 4, 1 << 20).unwrap_err();
    assert_eq!(code(&e), (400, Some("invalid_encoded_body")));
    assert!(e.message.contains("(gzip)"), "{}", e.message);
}

#[test]
fn a_zstd_frame_asking_for_a_window_beyond_the_cap_is_refused() {
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    e.window_log(27).unwrap();
    e.write_all(JSON).unwrap();
    let wide = e.finish().unwrap();
    let e = decode(&[Coding::Zstd], &wide, 64, 1 << 20).unwrap_err();
    assert_eq!(code(&e), (400, Some("invalid_encoded_body")), "{e}");
    // A cap that large lets it through.
    assert_eq!(decode(&[Coding::Zstd], &wide, 64, 128 << 20).unwrap(), JSON);
}
