//! Sealing reasoning text into `encrypted_content`, for stateless multi-turn reasoning.
//!
//! With `include: ["reasoning.encrypted_content"]` a response's reasoning items carry their
//! text sealed with an operator key; when a later request sends such an item back in
//! `input`, the blob is opened and the text is given to the upstream again. Nothing is
//! stored between requests.
//!
//! Sans-IO like the rest of the core: the caller supplies the keys ([`Keyring`]) and the
//! randomness behind each nonce ([`nonce`]).
//!
//! # Blob format (versions 1 and 2)
//!
//! `encrypted_content` is URL-safe base64 without padding of:
//!
//! | bytes        | content                                                  |
//! |--------------|----------------------------------------------------------|
//! | 1            | version: `1` bound to no tenant, `2` bound to a tenant   |
//! | 1            | key id length `n`, 1..=32                                |
//! | `n`          | key id, ASCII `[A-Za-z0-9_-]`                             |
//! | 24           | XChaCha20 nonce                                          |
//! | rest (≥ 16)  | XChaCha20-Poly1305 ciphertext, then its tag              |
//!
//! The associated data is `"responses-extproc reasoning v1"` (reasoning) or
//! `"responses-extproc compaction v1"` (compaction summaries, [`Purpose`]) followed by the
//! header (version, key id length, key id) and, in a version 2 blob, the tenant id (the
//! operator's tenant header's value, [`Tenant`]; not in the blob itself), so neither the
//! header, the purpose nor the tenant can be changed without failing authentication: a blob
//! sealed for one tenant never opens for another, with the same keys.

use std::fmt;
use std::sync::Arc;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{Key, KeyInit, Tag, XChaCha20Poly1305, XNonce};

/// The version of a blob bound to no tenant.
const UNBOUND: u8 = 1;
/// The version of a blob bound to a tenant (the tenant id ends the associated data).
const BOUND: u8 = 2;
/// Binds every blob to this use, so a blob sealed for another purpose never opens here.
const PURPOSE: &[u8] = b"responses-extproc reasoning v1";

/// What a blob holds. Part of the associated data, so a blob sealed for one purpose never
/// opens as the other (a reasoning blob pasted into a `compaction` item fails
/// authentication), with the same keys and the same layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Reasoning text (`reasoning.encrypted_content`).
    Reasoning,
    /// A conversation summary (`compaction.encrypted_content`).
    Compaction,
}

impl Purpose {
    fn label(self) -> &'static [u8] {
        match self {
            Purpose::Reasoning => PURPOSE,
            Purpose::Compaction => b"responses-extproc compaction v1",
        }
    }
}
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
const MAX_KEY_ID_LEN: usize = 32;

/// Largest blob (in base64 characters) that [`Keyring::open`] decodes; longer ones are
/// [`SealError::Malformed`] without being decoded.
pub const MAX_BLOB_LEN: usize = 16 << 20;

/// Largest plaintext (in bytes) whose sealed blob is guaranteed to stay within
/// [`MAX_BLOB_LEN`], whatever the key id. Longer texts still seal but will not open.
pub const MAX_PLAINTEXT_LEN: usize =
    MAX_BLOB_LEN / 4 * 3 - (2 + MAX_KEY_ID_LEN + NONCE_LEN + TAG_LEN);

/// Key-file base64: padding optional, in the standard or the URL-safe alphabet.
const KEY_STANDARD: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
const KEY_URL_SAFE: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a keyring could not be built or a blob could not be opened.
///
/// Messages never contain key bytes or plaintext: a key id appears only once it has been
/// checked to be a well-formed id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealError {
    /// Not a blob of a version this module reads (bad base64, bad header, too short, too long).
    Malformed,
    /// A well-formed blob sealed with a key id this keyring does not hold.
    UnknownKey(String),
    /// A well-formed blob that fails authentication (altered, sealed under another key, or
    /// for another tenant).
    Tampered,
    /// A blob bound to a tenant, opened where no tenant binds blobs.
    Bound,
    /// A blob bound to no tenant, opened for a tenant that does not accept those.
    Unbound,
    /// The keyring text or key is invalid; the message says where, without key material.
    BadKeyring(String),
}

impl fmt::Display for SealError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SealError::Malformed => f.write_str("encrypted_content is malformed"),
            SealError::UnknownKey(id) => {
                write!(
                    f,
                    "encrypted_content was sealed with unknown key id \"{id}\""
                )
            }
            SealError::Tampered => f.write_str("encrypted_content failed authentication"),
            SealError::Bound => f.write_str(
                "encrypted_content was sealed for a tenant, and this server binds sealed items to none",
            ),
            SealError::Unbound => f.write_str(
                "encrypted_content was sealed before this server bound sealed items to tenants",
            ),
            SealError::BadKeyring(why) => write!(f, "invalid keyring: {why}"),
        }
    }
}

impl std::error::Error for SealError {}

/// Whom an exchange's blobs are bound to: the value of the operator's tenant header
/// (`seal_tenant_header`), which Envoy sets from the caller's identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Tenant {
    /// No tenant header is configured: blobs are sealed bound to no tenant (version 1), and
    /// only such blobs open.
    #[default]
    Unbound,
    /// Blobs are sealed for this tenant (version 2), and only blobs sealed for it open (and,
    /// with `seal_accept_unbound`, blobs bound to no tenant).
    Id(Arc<str>),
    /// A tenant header is configured but the request has none (or an empty one): nothing may
    /// be sealed or opened.
    Missing,
}

impl Tenant {
    /// The tenant id blobs are bound to (`None`: unbound).
    fn id(&self) -> Option<&str> {
        match self {
            Tenant::Id(id) => Some(id),
            Tenant::Unbound | Tenant::Missing => None,
        }
    }
}

/// A set of keys: the active one seals, all of them open — so keys can be rotated by
/// putting a new key first and keeping the old ones until their blobs have aged out.
///
/// Key bytes live only inside the ciphers, which wipe them when dropped; `Debug` shows the
/// key ids only.
#[derive(Clone)]
pub struct Keyring {
    /// Never empty; the first is the active key.
    keys: Vec<(String, XChaCha20Poly1305)>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("active", &self.active_id())
            .field(
                "key_ids",
                &self
                    .keys
                    .iter()
                    .map(|(id, _)| id.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

const KEY_ID_RULE: &str = "key id must be 1 to 32 characters of A-Z a-z 0-9 _ -";

fn valid_key_id(id: &[u8]) -> bool {
    (1..=MAX_KEY_ID_LEN).contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
}

/// Overwrites a buffer that held key bytes, in a way the optimiser must keep.
fn wipe(buf: &mut [u8]) {
    buf.fill(0);
    std::hint::black_box(buf);
}

impl Keyring {
    /// Parses a keyring: one key per line `KEY_ID:BASE64_32_BYTES` (standard or URL-safe
    /// base64, padding optional), `#` comment lines and blank lines ignored; the first key
    /// is the active one. Duplicate ids, malformed lines, keys that are not 32 bytes and a
    /// keyring without keys are [`SealError::BadKeyring`].
    pub fn parse(text: &str) -> Result<Self, SealError> {
        let mut keys: Vec<(String, XChaCha20Poly1305)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let n = n + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // The line is never echoed: it may be a key pasted without its id.
            let bad = |why: String| SealError::BadKeyring(format!("line {n}: {why}"));
            let Some((id, b64)) = line.split_once(':') else {
                return Err(bad("expected KEY_ID:BASE64_KEY".to_owned()));
            };
            let (id, b64) = (id.trim(), b64.trim());
            if !valid_key_id(id.as_bytes()) {
                return Err(bad(KEY_ID_RULE.to_owned()));
            }
            if keys.iter().any(|(known, _)| known == id) {
                return Err(bad(format!("duplicate key id \"{id}\"")));
            }
            let mut buf = [0u8; 64];
            let decoded = KEY_STANDARD
                .decode_slice(b64, &mut buf)
                .or_else(|_| KEY_URL_SAFE.decode_slice(b64, &mut buf));
            let cipher = match decoded {
                Ok(32) => Some(XChaCha20Poly1305::new(Key::from_slice(&buf[..32]))),
                _ => None,
            };
            wipe(&mut buf);
            let Some(cipher) = cipher else {
                return Err(bad(format!(
                    "key \"{id}\" must be 32 bytes in standard or URL-safe base64"
                )));
            };
            keys.push((id.to_owned(), cipher));
        }
        if keys.is_empty() {
            return Err(SealError::BadKeyring("no keys".to_owned()));
        }
        Ok(Keyring { keys })
    }

    /// A keyring of one key (e.g. an ephemeral key generated by the caller at startup).
    pub fn single(id: &str, key: [u8; 32]) -> Result<Self, SealError> {
        let mut key = key;
        let cipher = XChaCha20Poly1305::new(Key::from_slice(&key));
        wipe(&mut key);
        if !valid_key_id(id.as_bytes()) {
            return Err(SealError::BadKeyring(KEY_ID_RULE.to_owned()));
        }
        Ok(Keyring {
            keys: vec![(id.to_owned(), cipher)],
        })
    }

    /// The id of the key that seals.
    pub fn active_id(&self) -> &str {
        &self.keys[0].0
    }

    /// Seals `plaintext` with the active key.
    ///
    /// `nonce` must be unique per seal under one key: derive it with [`nonce`] from 128
    /// random bits per response and the item index. The result is URL-safe base64 without
    /// padding (see the [module docs](self) for the layout). Texts longer than
    /// [`MAX_PLAINTEXT_LEN`] seal but will not open.
    pub fn seal(&self, plaintext: &str, nonce: [u8; 24]) -> String {
        self.seal_for(Purpose::Reasoning, plaintext, nonce)
    }

    /// [`seal`](Self::seal) for a given purpose.
    pub fn seal_for(&self, purpose: Purpose, plaintext: &str, nonce: [u8; 24]) -> String {
        self.seal_bound(purpose, &Tenant::Unbound, plaintext, nonce)
    }

    /// [`seal_for`](Self::seal_for), bound to `tenant`: a [`Tenant::Id`] seals a version 2
    /// blob that opens only for that tenant; [`Tenant::Unbound`] (and [`Tenant::Missing`],
    /// which callers refuse before sealing) a version 1 blob.
    pub fn seal_bound(
        &self,
        purpose: Purpose,
        tenant: &Tenant,
        plaintext: &str,
        nonce: [u8; 24],
    ) -> String {
        let (id, cipher) = &self.keys[0];
        let header_len = 2 + id.len();
        let body_start = header_len + NONCE_LEN;
        let mut buf = Vec::with_capacity(body_start + plaintext.len() + TAG_LEN);
        let tenant = tenant.id();
        buf.push(if tenant.is_some() { BOUND } else { UNBOUND });
        buf.push(id.len() as u8); // ids are at most 32 bytes, checked on construction
        buf.extend_from_slice(id.as_bytes());
        buf.extend_from_slice(&nonce);
        buf.extend_from_slice(plaintext.as_bytes());
        let (head, body) = buf.split_at_mut(body_start);
        let aad = associated_data(purpose, &head[..header_len], tenant);
        let tag = cipher
            .encrypt_in_place_detached(XNonce::from_slice(&nonce), &aad, body)
            .expect("XChaCha20-Poly1305 seals any in-memory string");
        buf.extend_from_slice(&tag);
        URL_SAFE_NO_PAD.encode(&buf)
    }

    /// Opens a blob sealed by any key of the ring.
    ///
    /// Never panics. Bad base64, a bad header, a blob too short or longer than
    /// [`MAX_BLOB_LEN`] → [`SealError::Malformed`]; a key id not in the ring →
    /// [`SealError::UnknownKey`]; failed authentication or non-UTF-8 plaintext →
    /// [`SealError::Tampered`].
    pub fn open(&self, blob: &str) -> Result<String, SealError> {
        self.open_for(Purpose::Reasoning, blob)
    }

    /// [`open`](Self::open) for a given purpose: a blob sealed for another purpose is
    /// [`SealError::Tampered`]; a blob bound to a tenant is [`SealError::Bound`].
    pub fn open_for(&self, purpose: Purpose, blob: &str) -> Result<String, SealError> {
        self.open_bound(purpose, &Tenant::Unbound, false, blob)
    }

    /// [`open_for`](Self::open_for) for `tenant`. [`Tenant::Unbound`] opens version 1 blobs
    /// only (a version 2 blob is [`SealError::Bound`]); a [`Tenant::Id`] opens the version 2
    /// blobs sealed for it (sealed for another: [`SealError::Tampered`]), and version 1 blobs
    /// only with `accept_unbound` (else [`SealError::Unbound`]); [`Tenant::Missing`] opens
    /// nothing (callers refuse it first): as `Unbound` without `accept_unbound`.
    pub fn open_bound(
        &self,
        purpose: Purpose,
        tenant: &Tenant,
        accept_unbound: bool,
        blob: &str,
    ) -> Result<String, SealError> {
        if blob.len() > MAX_BLOB_LEN {
            return Err(SealError::Malformed);
        }
        let mut buf = URL_SAFE_NO_PAD
            .decode(blob)
            .map_err(|_| SealError::Malformed)?;
        let (&version, rest) = buf.split_first().ok_or(SealError::Malformed)?;
        if version != UNBOUND && version != BOUND {
            return Err(SealError::Malformed);
        }
        let (&id_len, rest) = rest.split_first().ok_or(SealError::Malformed)?;
        let id_len = usize::from(id_len);
        if rest.len() < id_len + NONCE_LEN + TAG_LEN {
            return Err(SealError::Malformed);
        }
        let id = &rest[..id_len];
        if !valid_key_id(id) {
            return Err(SealError::Malformed);
        }
        // Checked ASCII above, so this is both lossless and safe to show.
        let id = String::from_utf8_lossy(id).into_owned();
        let cipher = self
            .keys
            .iter()
            .find(|(known, _)| *known == id)
            .map(|(_, cipher)| cipher)
            .ok_or(SealError::UnknownKey(id))?;

        let bound_to = match (version, tenant) {
            (BOUND, Tenant::Id(id)) => Some(&**id),
            (BOUND, Tenant::Unbound | Tenant::Missing) => return Err(SealError::Bound),
            (_, Tenant::Id(_)) if !accept_unbound => return Err(SealError::Unbound),
            (_, Tenant::Missing) => return Err(SealError::Unbound),
            _ => None,
        };
        let header_len = 2 + id_len;
        let body_start = header_len + NONCE_LEN;
        let tag_start = buf.len() - TAG_LEN;
        let tag = *Tag::from_slice(&buf[tag_start..]);
        let nonce = *XNonce::from_slice(&buf[header_len..body_start]);
        let aad = associated_data(purpose, &buf[..header_len], bound_to);
        cipher
            .decrypt_in_place_detached(&nonce, &aad, &mut buf[body_start..tag_start], &tag)
            .map_err(|_| SealError::Tampered)?;
        buf.truncate(tag_start);
        buf.drain(..body_start);
        String::from_utf8(buf).map_err(|_| SealError::Tampered)
    }
}

/// The AEAD associated data: the purpose label, the blob header, then the tenant id of a
/// bound blob. The header ends where its key id does and names the version, so the tenant id
/// runs to the end unambiguously.
fn associated_data(purpose: Purpose, header: &[u8], tenant: Option<&str>) -> Vec<u8> {
    let label = purpose.label();
    let tenant = tenant.unwrap_or_default().as_bytes();
    let mut aad = Vec::with_capacity(label.len() + header.len() + tenant.len());
    aad.extend_from_slice(label);
    aad.extend_from_slice(header);
    aad.extend_from_slice(tenant);
    aad
}

/// A nonce from a per-response seed and the item index: the seed's 16 bytes then the
/// index's 8 bytes, big-endian — distinct for distinct pairs, so unique as long as seeds
/// are random.
pub fn nonce(seed: u128, index: u64) -> [u8; 24] {
    let mut out = [0u8; 24];
    out[..16].copy_from_slice(&seed.to_be_bytes());
    out[16..].copy_from_slice(&index.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    use proptest::prelude::*;

    const KEY_A: [u8; 32] = [0x11; 32];
    const KEY_B: [u8; 32] = [0x22; 32];

    fn key_line(id: &str, key: &[u8; 32]) -> String {
        format!("{id}:{}\n", STANDARD.encode(key))
    }

    fn ring_a() -> Keyring {
        Keyring::single("a", KEY_A).unwrap()
    }

    fn tenant(id: &str) -> Tenant {
        Tenant::Id(id.into())
    }

    /// A blob sealed for one tenant opens for that tenant only: never for another (even one
    /// whose id extends it), nor unbound; an unbound blob opens for a tenant only in the
    /// migration window (`accept_unbound`); a missing tenant opens nothing.
    #[test]
    fn tenants_do_not_open_each_others_blobs() {
        let ring = ring_a();
        for purpose in [Purpose::Reasoning, Purpose::Compaction] {
            let a = ring.seal_bound(purpose, &tenant("team-a"), "a's plan", nonce(1, 0));
            assert_eq!(decode(&a)[0], 2, "a bound blob is version 2");
            for accept_unbound in [false, true] {
                let open = |t: &Tenant| ring.open_bound(purpose, t, accept_unbound, &a);
                assert_eq!(open(&tenant("team-a")).as_deref(), Ok("a's plan"));
                for other in ["team-b", "team-a ", "team-ab", "team-", "TEAM-A", ""] {
                    assert_eq!(open(&tenant(other)), Err(SealError::Tampered), "{other:?}");
                }
                assert_eq!(open(&Tenant::Unbound), Err(SealError::Bound));
                assert_eq!(open(&Tenant::Missing), Err(SealError::Bound));
            }
            assert_eq!(ring.open_for(purpose, &a), Err(SealError::Bound));

            let unbound = ring.seal_for(purpose, "old plan", nonce(1, 1));
            assert_eq!(decode(&unbound)[0], 1, "an unbound blob is version 1");
            assert_eq!(
                ring.open_bound(purpose, &tenant("team-a"), false, &unbound),
                Err(SealError::Unbound)
            );
            for t in ["team-a", "team-b"] {
                assert_eq!(
                    ring.open_bound(purpose, &tenant(t), true, &unbound)
                        .as_deref(),
                    Ok("old plan")
                );
            }
            assert_eq!(
                ring.open_bound(purpose, &Tenant::Missing, true, &unbound),
                Err(SealError::Unbound)
            );
            assert_eq!(
                ring.open_bound(purpose, &Tenant::Unbound, false, &unbound)
                    .as_deref(),
                Ok("old plan")
            );
        }
        // A bound blob relabelled as unbound (its version byte) fails authentication: the
        // version is in the associated data.
        let a = ring.seal_bound(Purpose::Reasoning, &tenant("team-a"), "x", nonce(2, 0));
        let mut relabelled = decode(&a);
        relabelled[0] = 1;
        assert_eq!(
            ring.open_bound(
                Purpose::Reasoning,
                &tenant("team-a"),
                true,
                &encode(&relabelled)
            ),
            Err(SealError::Tampered)
        );
        assert_eq!(ring.open(&encode(&relabelled)), Err(SealError::Tampered));
        // The purposes stay apart for one tenant too.
        let c = ring.seal_bound(Purpose::Compaction, &tenant("team-a"), "s", nonce(2, 1));
        assert_eq!(
            ring.open_bound(Purpose::Reasoning, &tenant("team-a"), false, &c),
            Err(SealError::Tampered)
        );
    }

    #[test]
    fn purposes_do_not_open_each_other() {
        let ring = ring_a();
        let summary = ring.seal_for(Purpose::Compaction, "the summary", nonce(1, 0));
        assert_eq!(
            ring.open_for(Purpose::Compaction, &summary).as_deref(),
            Ok("the summary")
        );
        assert_eq!(ring.open(&summary), Err(SealError::Tampered));
        let reasoning = ring.seal("thoughts", nonce(1, 1));
        assert_eq!(
            ring.open_for(Purpose::Compaction, &reasoning),
            Err(SealError::Tampered)
        );
    }

    /// Re-encodes decoded blob bytes, the way a client would send them.
    fn encode(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn decode(blob: &str) -> Vec<u8> {
        URL_SAFE_NO_PAD.decode(blob).unwrap()
    }

    #[test]
    fn round_trips() {
        let ring = ring_a();
        let big: String = "reasoning… 🤔 "
            .repeat(1 << 17)
            .chars()
            .take(1 << 20)
            .collect();
        for (i, text) in ["", "x", "héllo wörld — ∀x. 🦀\u{0}\n\t", big.as_str()]
            .into_iter()
            .enumerate()
        {
            let blob = ring.seal(text, nonce(7, i as u64));
            assert_eq!(ring.open(&blob).as_deref(), Ok(text));
        }
        let mb = "a".repeat(1_000_000);
        let blob = ring.seal(&mb, nonce(8, 0));
        assert_eq!(ring.open(&blob), Ok(mb));
    }

    #[test]
    fn blob_layout() {
        let ring = Keyring::single("key-1", KEY_A).unwrap();
        let n = nonce(0x0102, 3);
        let blob = ring.seal("hi", n);
        assert!(blob
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        let bytes = decode(&blob);
        assert_eq!(bytes[0], 1);
        assert_eq!(bytes[1], 5);
        assert_eq!(&bytes[2..7], b"key-1");
        assert_eq!(&bytes[7..31], &n);
        assert_eq!(bytes.len(), 31 + 2 + 16);
    }

    #[test]
    fn nonce_layout_is_injective() {
        assert_eq!(
            nonce(0x0102030405060708090a0b0c0d0e0f10, 0x1112131415161718),
            [
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0x11, 0x12, 0x13, 0x14,
                0x15, 0x16, 0x17, 0x18
            ]
        );
        assert_ne!(nonce(1, 0), nonce(0, 1));
        assert_ne!(nonce(u128::MAX, 0), nonce(u128::MAX, 1));
    }

    #[test]
    fn rotation_opens_blobs_of_old_keys() {
        let old = Keyring::parse(&key_line("old", &KEY_A)).unwrap();
        assert_eq!(old.active_id(), "old");
        let blob = old.seal("thinking about it", nonce(1, 0));

        let rotated = Keyring::parse(&format!(
            "{}{}",
            key_line("new", &KEY_B),
            key_line("old", &KEY_A)
        ))
        .unwrap();
        assert_eq!(rotated.active_id(), "new");
        assert_eq!(rotated.open(&blob).as_deref(), Ok("thinking about it"));

        // New blobs use the new key, which the old ring does not know.
        let fresh = rotated.seal("next turn", nonce(2, 0));
        assert_eq!(&decode(&fresh)[2..5], b"new");
        assert_eq!(old.open(&fresh), Err(SealError::UnknownKey("new".into())));
        assert_eq!(rotated.open(&fresh).as_deref(), Ok("next turn"));
    }

    #[test]
    fn unknown_key_id() {
        let blob = Keyring::single("gone", KEY_A)
            .unwrap()
            .seal("x", nonce(1, 0));
        let ring = Keyring::single("other", KEY_A).unwrap();
        let err = ring.open(&blob).unwrap_err();
        assert_eq!(err, SealError::UnknownKey("gone".into()));
        assert!(err.to_string().contains("gone"));
    }

    #[test]
    fn same_id_different_key_is_tampered() {
        let blob = Keyring::single("k", KEY_A).unwrap().seal("x", nonce(1, 0));
        let other = Keyring::single("k", KEY_B).unwrap();
        assert_eq!(other.open(&blob), Err(SealError::Tampered));
    }

    /// Re-labelling a blob with another key id of the ring (same or different id length)
    /// fails authentication, even when that other id maps to the very same key bytes.
    #[test]
    fn key_id_cannot_be_swapped() {
        let ring = Keyring::parse(&format!(
            "{}{}{}",
            key_line("a", &KEY_A),
            key_line("b", &KEY_B),
            key_line("same-bytes", &KEY_A)
        ))
        .unwrap();
        let blob = ring.seal("secret plan", nonce(9, 9));
        let bytes = decode(&blob);
        assert_eq!(&bytes[..3], &[1, 1, b'a']);
        let body = &bytes[3..];
        for id in ["b", "same-bytes"] {
            let mut relabelled = vec![1, id.len() as u8];
            relabelled.extend_from_slice(id.as_bytes());
            relabelled.extend_from_slice(body);
            assert_eq!(
                ring.open(&encode(&relabelled)),
                Err(SealError::Tampered),
                "{id}"
            );
        }
        assert_eq!(ring.open(&blob).as_deref(), Ok("secret plan"));
    }

    /// Every single-bit flip: never Ok, never a panic. A flip in the nonce, the ciphertext
    /// or the tag is Tampered; a flip in the header is Malformed, or UnknownKey when it
    /// turns the key id into another well-formed id that the ring does not hold.
    #[test]
    fn every_bit_flip_is_rejected() {
        let ring = Keyring::single("k1", KEY_A).unwrap();
        let bytes = decode(&ring.seal("the quick brown fox", nonce(3, 1)));
        let header_len = 2 + 2;
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let result = ring.open(&encode(&flipped));
            if bit / 8 >= header_len {
                assert_eq!(result, Err(SealError::Tampered), "bit {bit}");
            } else {
                assert!(
                    matches!(result, Err(SealError::Malformed | SealError::UnknownKey(_))),
                    "bit {bit}: {result:?}"
                );
            }
        }
    }

    #[test]
    fn every_truncation_is_rejected() {
        let ring = ring_a();
        let blob = ring.seal("a reasonably long reasoning text", nonce(4, 2));
        for len in 0..blob.len() {
            assert!(ring.open(&blob[..len]).is_err(), "text prefix {len}");
        }
        let bytes = decode(&blob);
        for len in 0..bytes.len() {
            let result = ring.open(&encode(&bytes[..len]));
            assert!(
                matches!(result, Err(SealError::Malformed | SealError::Tampered)),
                "byte prefix {len}: {result:?}"
            );
        }
        assert_eq!(ring.open(""), Err(SealError::Malformed));
    }

    #[test]
    fn non_canonical_encodings_are_malformed() {
        let ring = ring_a();
        let blob = ring.seal("text", nonce(5, 0));
        let bytes = decode(&blob);
        // Padding, the standard alphabet, whitespace: not what seal writes.
        let padded = URL_SAFE.encode(&bytes);
        if padded != blob {
            assert_eq!(ring.open(&padded), Err(SealError::Malformed));
        }
        assert_eq!(ring.open(&format!(" {blob}")), Err(SealError::Malformed));
        assert_eq!(ring.open(&format!("{blob}\n")), Err(SealError::Malformed));
        assert_eq!(ring.open("!!!!"), Err(SealError::Malformed));
    }

    #[test]
    fn bad_headers_are_malformed() {
        let ring = ring_a();
        let bytes = decode(&ring.seal("text", nonce(5, 1)));
        for version in [0, 3, 0x81, 0xff] {
            let mut other = bytes.clone();
            other[0] = version;
            assert_eq!(ring.open(&encode(&other)), Err(SealError::Malformed));
        }
        // Version 2 is a blob bound to a tenant: not one this unbound opening reads.
        let mut v2 = bytes.clone();
        v2[0] = 2;
        assert_eq!(ring.open(&encode(&v2)), Err(SealError::Bound));
        let mut no_id = bytes.clone();
        no_id[1] = 0;
        assert_eq!(ring.open(&encode(&no_id)), Err(SealError::Malformed));
        let mut long_id = vec![1, 33];
        long_id.extend_from_slice(&[b'a'; 33]);
        long_id.extend_from_slice(&[0; 64]);
        assert_eq!(ring.open(&encode(&long_id)), Err(SealError::Malformed));
        let mut bad_char = bytes;
        bad_char[2] = b'.';
        assert_eq!(ring.open(&encode(&bad_char)), Err(SealError::Malformed));
    }

    #[test]
    fn huge_blob_is_malformed_before_decoding() {
        let ring = ring_a();
        let huge = "A".repeat(MAX_BLOB_LEN + 1);
        assert_eq!(ring.open(&huge), Err(SealError::Malformed));
    }

    #[test]
    fn non_utf8_plaintext_is_tampered() {
        // Seal raw bytes by hand with the same construction to reach the UTF-8 check.
        let ring = ring_a();
        let n = nonce(6, 0);
        let mut buf = vec![1, 1, b'a'];
        buf.extend_from_slice(&n);
        let mut body = vec![0xff, 0xfe, 0x80];
        let aad = associated_data(Purpose::Reasoning, &buf[..3], None);
        let cipher = XChaCha20Poly1305::new(Key::from_slice(&KEY_A));
        let tag = cipher
            .encrypt_in_place_detached(XNonce::from_slice(&n), &aad, &mut body)
            .unwrap();
        buf.extend_from_slice(&body);
        buf.extend_from_slice(&tag);
        assert_eq!(ring.open(&encode(&buf)), Err(SealError::Tampered));
    }

    #[test]
    fn purpose_label_is_bound() {
        /// The blob `seal` would write, but with `label` in place of the purpose label.
        fn seal_with_label(label: &[u8], text: &str) -> String {
            let n = nonce(6, 1);
            let mut buf = vec![1, 1, b'a'];
            buf.extend_from_slice(&n);
            let mut body = text.as_bytes().to_vec();
            let mut aad = label.to_vec();
            aad.extend_from_slice(&buf[..3]);
            let cipher = XChaCha20Poly1305::new(Key::from_slice(&KEY_A));
            let tag = cipher
                .encrypt_in_place_detached(XNonce::from_slice(&n), &aad, &mut body)
                .unwrap();
            buf.extend_from_slice(&body);
            buf.extend_from_slice(&tag);
            encode(&buf)
        }
        let ring = ring_a();
        // The hand-built construction matches `seal` with the real label...
        assert_eq!(
            seal_with_label(PURPOSE, "hello"),
            ring.seal("hello", nonce(6, 1))
        );
        // ...and no other label (none at all, another purpose, another version) opens.
        for label in [
            &b""[..],
            b"some other purpose",
            b"responses-extproc reasoning v2",
        ] {
            let blob = seal_with_label(label, "hello");
            assert_eq!(ring.open(&blob), Err(SealError::Tampered), "{label:?}");
        }
    }

    #[test]
    fn different_nonces_give_different_blobs() {
        let ring = ring_a();
        let a = ring.seal("same text", nonce(1, 0));
        let b = ring.seal("same text", nonce(1, 1));
        let c = ring.seal("same text", nonce(2, 0));
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
        // Deterministic for a given nonce (sans-IO).
        assert_eq!(a, ring.seal("same text", nonce(1, 0)));
    }

    #[test]
    fn plaintext_does_not_appear_in_blob() {
        let ring = ring_a();
        let text =
            "The user wants a haiku about Rust; I should count syllables carefully. ".repeat(20);
        let blob = ring.seal(&text, nonce(10, 0));
        let bytes = decode(&blob);
        let needle = &text.as_bytes()[..64];
        assert!(!bytes.windows(needle.len()).any(|w| w == needle));
        assert!(!blob.contains("haiku"));
    }

    #[test]
    fn parses_keyrings() {
        let url_safe_no_pad = URL_SAFE_NO_PAD.encode([0xfb; 32]);
        let text = format!(
            "# rotated 2024-06\n\n  \t\nnew_2:{}\r\n# the old one\n  old-1 : {url_safe_no_pad}  \n",
            STANDARD.encode([0xfb; 32])
        );
        let ring = Keyring::parse(&text).unwrap();
        assert_eq!(ring.active_id(), "new_2");
        // Both lines decode to the same bytes, so each opens the other's blobs.
        let blob = ring.seal("x", nonce(1, 0));
        let old_only = Keyring::parse(&format!("old-1:{url_safe_no_pad}")).unwrap();
        assert_eq!(
            old_only.open(&blob),
            Err(SealError::UnknownKey("new_2".into()))
        );
        let max_id = "A".repeat(32);
        assert!(Keyring::parse(&key_line(&max_id, &KEY_A)).is_ok());
    }

    #[test]
    fn rejects_bad_keyrings() {
        let good = STANDARD.encode(KEY_A);
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "no keys"),
            ("# only a comment\n\n".into(), "no keys"),
            (good.clone(), "line 1: expected KEY_ID:BASE64_KEY"),
            (format!(":{good}"), "line 1: key id"),
            (format!("{}:{good}", "a".repeat(33)), "line 1: key id"),
            (format!("bad.id:{good}"), "line 1: key id"),
            (format!("bad id:{good}"), "line 1: key id"),
            (format!("ключ:{good}"), "line 1: key id"),
            (
                format!("a:{good}\na:{}", STANDARD.encode(KEY_B)),
                "line 2: duplicate key id \"a\"",
            ),
            ("a:".into(), "line 1: key \"a\" must be 32 bytes"),
            (
                "a:not base64!!".into(),
                "line 1: key \"a\" must be 32 bytes",
            ),
            (
                format!("a:{}", STANDARD.encode([1u8; 31])),
                "must be 32 bytes",
            ),
            (
                format!("a:{}", STANDARD.encode([1u8; 33])),
                "must be 32 bytes",
            ),
            (
                format!("a:{}", STANDARD.encode([1u8; 100])),
                "must be 32 bytes",
            ),
            (format!("# c\nk:{good}\nk2:{good}x"), "line 3: key \"k2\""),
        ];
        for (text, expected) in cases {
            match Keyring::parse(&text) {
                Err(SealError::BadKeyring(why)) => {
                    assert!(why.contains(expected), "{text:?}: {why}");
                    assert!(!why.contains(&good), "{text:?}: message leaks the key");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        assert!(matches!(
            Keyring::single("", KEY_A),
            Err(SealError::BadKeyring(_))
        ));
        assert!(matches!(
            Keyring::single(&"x".repeat(33), KEY_A),
            Err(SealError::BadKeyring(_))
        ));
        assert!(matches!(
            Keyring::single("a/b", KEY_A),
            Err(SealError::BadKeyring(_))
        ));
    }

    #[test]
    fn debug_and_display_show_no_secrets() {
        let key = [0xab; 32];
        let ring = Keyring::parse(&format!(
            "{}{}",
            key_line("k1", &key),
            key_line("k2", &KEY_B)
        ))
        .unwrap();
        let debug = format!("{ring:?} {ring:#?}");
        assert!(debug.contains("k1") && debug.contains("k2"), "{debug}");
        for secret in [STANDARD.encode(key), STANDARD.encode(KEY_B)] {
            assert!(!debug.contains(&secret));
        }
        for needle in ["171", "0xab", "ab, ab", "[171", "34, 34", "key:"] {
            assert!(
                !debug.to_lowercase().contains(needle),
                "{needle} in {debug}"
            );
        }
        let blob = ring.seal("private thoughts", nonce(1, 0));
        let mut flipped = decode(&blob);
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let errors = [
            ring.open(&encode(&flipped)).unwrap_err(),
            ring.open("garbage!").unwrap_err(),
            Keyring::single("zz", key).unwrap().open(&blob).unwrap_err(),
        ];
        for err in errors {
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("private"), "{shown}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn prop_bit_flips_never_open(text in ".{0,200}", seed: u128, pos: prop::sample::Index) {
            let ring = Keyring::parse(&format!(
                "{}{}", key_line("k1", &KEY_A), key_line("k2", &KEY_B)
            )).unwrap();
            let bytes = decode(&ring.seal(&text, nonce(seed, 0)));
            let bit = pos.index(bytes.len() * 8);
            let mut flipped = bytes;
            flipped[bit / 8] ^= 1 << (bit % 8);
            let result = ring.open(&encode(&flipped));
            prop_assert!(
                matches!(result, Err(SealError::Tampered | SealError::Malformed | SealError::UnknownKey(_))),
                "bit {}: {:?}", bit, result
            );
            if bit / 8 >= 4 {
                prop_assert_eq!(result, Err(SealError::Tampered));
            }
        }

        #[test]
        fn prop_round_trip(text in any::<String>(), seed: u128, index: u64) {
            let ring = ring_a();
            let blob = ring.seal(&text, nonce(seed, index));
            prop_assert_eq!(ring.open(&blob), Ok(text));
        }

        #[test]
        fn prop_bound_blobs_open_for_their_tenant_only(
            text in ".{0,64}", a in ".{0,40}", b in ".{0,40}", seed: u128,
        ) {
            let ring = ring_a();
            let blob = ring.seal_bound(Purpose::Reasoning, &tenant(&a), &text, nonce(seed, 0));
            prop_assert_eq!(
                ring.open_bound(Purpose::Reasoning, &tenant(&a), false, &blob),
                Ok(text)
            );
            if a != b {
                prop_assert_eq!(
                    ring.open_bound(Purpose::Reasoning, &tenant(&b), true, &blob),
                    Err(SealError::Tampered)
                );
            }
        }

        #[test]
        fn prop_random_strings_never_open(blob in any::<String>()) {
            prop_assert!(ring_a().open(&blob).is_err());
        }

        #[test]
        fn prop_random_base64_never_opens(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            prop_assert!(ring_a().open(&encode(&bytes)).is_err());
        }

        /// Random bodies behind a valid header for a known key: always Tampered (or Malformed
        /// when too short), never Ok.
        #[test]
        fn prop_random_bodies_never_open(body in prop::collection::vec(any::<u8>(), 0..300)) {
            let mut bytes = vec![1, 1, b'a'];
            bytes.extend_from_slice(&body);
            let result = ring_a().open(&encode(&bytes));
            let expected = if body.len() < NONCE_LEN + TAG_LEN {
                SealError::Malformed
            } else {
                SealError::Tampered
            };
            prop_assert_eq!(result, Err(expected));
        }

        #[test]
        fn prop_random_keyrings_never_panic(text in any::<String>()) {
            let _ = Keyring::parse(&text);
        }
    }
}
