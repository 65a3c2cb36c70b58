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
        let stream = compressed::empty_stream(inner.as_str(), work_budget(limit) + 1000);
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
fn a_brotli_body_of_text_at_the_cap_fits_the_budget_and_of_base64_most_of_it() {
    // Its bytes read two units each, written one: text at the cap (compressed 5 times) fits;
    // base64 (6 bits a byte: 3/4 of its size in br) fits up to about 0.85 of the cap.
    let limit = 1 << 20;
    for data in [
        compressed::request_of_words(limit),
        compressed::request_of_base64(limit * 8 / 10),
    ] {
        let body = brotli(&data);
        assert_eq!(
            decode(&[Coding::Brotli], &body, 1 << 16, limit).unwrap(),
            data
        );
    }
    let body = brotli(&compressed::request_of_base64(limit));
    let e = decode(&[Coding::Brotli], &body, 1 << 16, limit).unwrap_err();
    assert!(over_budget(&e), "{e}");
    // Metadata blocks, which decode to nothing, up to the cap: read through.
    let body = compressed::brotli_metadata_blocks(limit);
    assert_eq!(
        decode(&[Coding::Brotli], &body, 1 << 16, limit).unwrap(),
        b""
    );
}

#[test]
fn what_a_brotli_header_makes_its_decoder_build_is_charged_before_it_is_built() {
    // The issue's shape: meta-blocks of one byte, each declaring 256 block types and trees
    // with full context maps. Before its tables were charged, the budget let 4 MiB of it
    // through (3.6 s); a sixteenth of that is over the budget now.
    let limit = 1 << 20;
    for (header, few) in [
        (compressed::BrotliHeader::BlockTypes, 4 << 10),
        (compressed::BrotliHeader::FullCodes, 12 << 10),
    ] {
        let body = compressed::brotli_headers(header, limit / 16);
        for piece in [1 << 16, body.len()] {
            let e = decode(&[Coding::Brotli], &body, piece, limit).unwrap_err();
            assert!(over_budget(&e), "{header:?}: {e}");
        }
        // A few of them fit: the decoder runs them (each decodes to one byte).
        let few = compressed::brotli_headers(header, few);
        let decoded = decode(&[Coding::Brotli], &few, 1 << 16, limit).unwrap();
        assert!(
            !decoded.is_empty() && decoded.iter().all(|b| *b == b'a'),
            "{header:?}"
        );
    }
    // A block switch before every symbol (its cost is in what it writes, which is charged
    // too): about five bytes written for each read.
    let body = compressed::brotli_switches(limit / 8);
    let decoded = decode(&[Coding::Brotli], &body, 1 << 16, limit).unwrap();
    assert!(decoded.len() > 4 * body.len(), "{}", decoded.len());
}

#[test]
fn each_deflate_block_is_charged_before_its_codes_are_built() {
    // Blocks of full codes (~30 bytes, ~4 µs each): the cap's worth was read through before,
    // and is over the budget now.
    let limit = 1 << 20;
    for (coding, body) in [
        (Coding::Gzip, compressed::gzip_full_code_blocks(limit)),
        (Coding::Deflate, compressed::deflate_full_code_blocks(limit)),
    ] {
        let e = decode(&[coding], &body, body.len(), limit).unwrap_err();
        assert!(over_budget(&e), "{coding:?}: {e}");
    }
    // Just under and just over: empty stored blocks (5 bytes) in raw deflate, each a call of
    // the decoder (its block) and its bytes; the last block ends the stream.
    let per_block = BLOCK_COST + 5;
    let fits = work_budget(limit) / per_block;
    let blocks = |n: usize| compressed::raw_empty_stored_blocks(n);
    let under = blocks(fits - 5);
    assert_eq!(
        decode(&[Coding::Deflate], &under, under.len(), limit).unwrap(),
        b""
    );
    let over = blocks(fits + 2);
    let e = decode(&[Coding::Deflate], &over, over.len(), limit).unwrap_err();
    assert!(over_budget(&e), "{e}");
    let far = blocks(4 * fits);
    let e = decode(&[Coding::Deflate], &far, 1 << 16, 4 * limit).unwrap_err();
    assert!(over_budget(&e), "{e}");
}

#[test]
fn bodies_of_nothing_decode_to_nothing_within_the_budget() {
    // Read in full, up to the encoded cap where their bytes are what is charged (zstd,
    // brotli), up to the budget where their blocks are (gzip, deflate: a block is a unit of
    // code building, [`BLOCK_COST`]): an empty body, which the exchange refuses as such.
    let limit = 1 << 20;
    let blocks = work_budget(limit) / (BLOCK_COST + 32);
    use compressed::EmptyBlock;
    for (coding, body) in [
        (
            Coding::Gzip,
            compressed::gzip_empty_members(20 * blocks / 4),
        ),
        (
            Coding::Gzip,
            compressed::gzip_empty_blocks(EmptyBlock::Dynamic, 12 * blocks),
        ),
        (
            Coding::Deflate,
            compressed::deflate_empty_blocks(EmptyBlock::Fixed, blocks + blocks / 4),
        ),
        (
            Coding::Deflate,
            compressed::deflate_empty_blocks(EmptyBlock::Stored, 5 * blocks),
        ),
        (Coding::Zstd, compressed::zstd_empty_frames(limit)),
        (Coding::Zstd, compressed::zstd_empty_blocks(limit)),
        (Coding::Zstd, compressed::zstd_skippable_frames(0, limit)),
        (Coding::Brotli, compressed::brotli_metadata_blocks(limit)),
    ] {
        assert_eq!(
            decode(&[coding], &body, 1 << 16, limit).unwrap(),
            b"",
            "{coding:?}"
        );
    }
    // The cap's worth of empty deflate blocks is over it.
    for (coding, body) in [
        (Coding::Gzip, compressed::gzip_empty_members(limit)),
        (
            Coding::Deflate,
            compressed::deflate_empty_blocks(EmptyBlock::Stored, limit),
        ),
    ] {
        let e = decode(&[coding], &body, 1 << 16, limit).unwrap_err();
        assert!(over_budget(&e), "{coding:?}: {e}");
    }
}

/// A small cap still lets a small body through in every coding: the work budget has a floor
/// (each deflate call alone is charged more than a 300-byte cap's twice).
#[test]
fn a_small_cap_still_decodes_a_small_body() {
    assert_eq!(work_budget(300), WORK_FLOOR);
    for coding in Coding::ALL {
        let body = encode(coding, JSON);
        assert_eq!(
            decode(&[coding], &body, body.len(), 300).unwrap(),
            JSON,
            "{coding:?}"
        );
    }
}
