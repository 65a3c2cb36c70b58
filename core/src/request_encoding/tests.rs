use std::io::Write;

use super::*;
use crate::openresponses::Code;

// The hostile shapes, shared with the end-to-end suite and the benchmark.
#[path = "../../../tests/common/compressed.rs"]
mod compressed;

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
fn two_codings_stack_in_any_order_and_a_third_is_a_415() {
    for first in Coding::ALL {
        for second in Coding::ALL {
            let listed = [first, second];
            let body = encode(second, &encode(first, JSON));
            assert_eq!(
                decode(&listed, &body, 9, 1 << 20).unwrap(),
                JSON,
                "{listed:?}"
            );
        }
    }
    for value in [
        "gzip, gzip, gzip",
        "zstd, br, gzip",
        "deflate,identity,br,zstd",
    ] {
        let e = codings(Some(value)).unwrap_err();
        assert_eq!(
            code(&e),
            (415, Some("unsupported_content_encoding")),
            "{value}"
        );
        assert!(e.message.contains("at most 2"), "{}", e.message);
    }
    // `identity` is no layer.
    assert_eq!(
        codings(Some("gzip, identity, br")),
        Ok(vec![Coding::Gzip, Coding::Brotli])
    );
}

#[test]
fn stacked_codings_are_undone_last_first() {
    let listed = codings(Some("gzip, br")).unwrap();
    assert_eq!(listed, [Coding::Gzip, Coding::Brotli]);
    let body = brotli(&gzip(JSON));
    assert_eq!(decode(&listed, &body, 4, 1 << 20).unwrap(), JSON);
    let listed = codings(Some("zstd , gzip")).unwrap();
    let body = gzip(&zstd(JSON));
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

/// The 413 of the work budget.
fn over_budget(e: &ApiError) -> bool {
    code(e) == (413, Some("request_too_large")) && e.message.contains("more decoding")
}

#[test]
fn a_layer_between_two_decoders_counts_against_the_work_budget() {
    let limit = 1 << 20;
    // Each inner coding's stream of nothing, larger than the budget, in each outer coding:
    // the outer decoder makes it from little, the inner one reads it and yields nothing.
    for inner in Coding::ALL {
        let stream = compressed::empty_stream(inner.as_str(), WORK_PER_CAP * limit + 1000);
        for outer in Coding::ALL {
            let body = encode(outer, &stream);
            assert!(body.len() < limit, "{inner:?} in {outer:?}: {}", body.len());
            let e = decode(&[inner, outer], &body, 1 << 14, limit).unwrap_err();
            assert!(over_budget(&e), "{inner:?} in {outer:?}: {e}");
            // Whole, as the ext_proc adapter gives it.
            let e = decode(&[inner, outer], &body, body.len(), limit).unwrap_err();
            assert!(over_budget(&e), "{inner:?} in {outer:?}, whole: {e}");
        }
    }
    // The issue's bomb: zstd of a skippable frame of 4 GiB (only its first 8 MiB written: no
    // decoder gets further).
    let bomb = compressed::zstd_of_skippable(8 << 20);
    let e = decode(&[Coding::Zstd, Coding::Zstd], &bomb, 4096, limit).unwrap_err();
    assert!(over_budget(&e), "{e}");
}

#[test]
fn two_layers_at_the_cap_fit_the_budget() {
    // Incompressible: each layer is about the decoded size, which is the cap.
    let limit = 1 << 20;
    let noise = compressed::noise(limit - 1000);
    for (inner, outer) in [
        (Coding::Gzip, Coding::Zstd),
        (Coding::Zstd, Coding::Deflate),
    ] {
        let body = encode(outer, &encode(inner, &noise));
        assert!(body.len() > limit - 1000, "{}", body.len());
        assert_eq!(
            decode(&[inner, outer], &body, 1 << 16, limit).unwrap(),
            noise,
            "{inner:?} {outer:?}"
        );
    }
}

#[test]
fn a_br_byte_counts_eight_so_a_br_layer_is_at_most_a_quarter_of_the_cap() {
    let limit = 1 << 20;
    let at = limit * WORK_PER_CAP / Coding::Brotli.cost();
    assert_eq!(at, limit / 4);
    // Metadata blocks of exactly that size decode to nothing.
    let body = compressed::brotli_metadata_blocks(at);
    assert_eq!(body.len(), at);
    assert_eq!(decode(&[Coding::Brotli], &body, 1000, limit).unwrap(), b"");
    assert_eq!(decode(&[Coding::Brotli], &body, at, limit).unwrap(), b"");
    let body = compressed::brotli_metadata_blocks(at + 1);
    let e = decode(&[Coding::Brotli], &body, 1000, limit).unwrap_err();
    assert!(over_budget(&e), "{e}");
    let e = decode(&[Coding::Brotli], &body, at + 1, limit).unwrap_err();
    assert!(over_budget(&e), "{e}");
}

#[test]
fn bodies_of_nothing_at_the_cap_decode_to_nothing() {
    // Read in full (the work is bounded by the encoded cap): an empty body, which the
    // exchange refuses as such.
    let limit = 1 << 20;
    use compressed::EmptyBlock;
    for (coding, body) in [
        (Coding::Gzip, compressed::gzip_empty_members(limit)),
        (
            Coding::Gzip,
            compressed::gzip_empty_blocks(EmptyBlock::Dynamic, limit),
        ),
        (
            Coding::Deflate,
            compressed::deflate_empty_blocks(EmptyBlock::Fixed, limit),
        ),
        (
            Coding::Deflate,
            compressed::deflate_empty_blocks(EmptyBlock::Stored, limit),
        ),
        (Coding::Zstd, compressed::zstd_empty_frames(limit)),
        (Coding::Zstd, compressed::zstd_empty_blocks(limit)),
        (Coding::Zstd, compressed::zstd_skippable_frames(0, limit)),
    ] {
        assert!(body.len() > limit - 64 && body.len() <= limit, "{coding:?}");
        assert_eq!(
            decode(&[coding], &body, 1 << 16, limit).unwrap(),
            b"",
            "{coding:?}"
        );
    }
}
