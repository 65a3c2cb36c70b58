//! An exchange's sealed items: `encrypted_content` sealed and opened with the operator's keys,
//! bound to the exchange's tenant ([`Tenant`], from the operator's tenant header), and the
//! errors a client gets when one cannot be.
//!
//! A leaf of `translate` beside `seal` (the blob format): the request side opens, the answer
//! side seals, `compaction` does both for its items.

use super::fields::bad_value;
use super::seal::{Purpose, SealError, Tenant};
use super::Options;
use crate::openresponses::{ApiError, ErrorCode};

/// The request may seal or open items: refused with 403 `missing_tenant` when the operator
/// binds them to a tenant and the request names none. Never an unbound seal in its place: the
/// header is Envoy's to set from the caller's identity (a JWT claim, the route), so its absence
/// means the caller has no identity the items could be bound to, which only the caller's
/// credentials (or the proxy's configuration) can change, not its body: not a 400, and not a
/// 401 either, since this server authenticates no one and has no challenge to send.
pub(crate) fn require_tenant(options: &Options) -> Result<(), ApiError> {
    if options.tenant != Tenant::Missing {
        return Ok(());
    }
    Err(ApiError::server(
        403,
        ErrorCode::MissingTenant,
        "This request seals or opens encrypted_content, which this server binds to a tenant, and it carries no tenant: the proxy sets the tenant header from the caller's identity (its credentials). Send the request with credentials that name a tenant.",
    ))
}

/// What a blob holds, as the client knows the items.
fn items(purpose: Purpose) -> &'static str {
    match purpose {
        Purpose::Reasoning => "reasoning items",
        Purpose::Compaction => "compaction items",
    }
}

/// Opens the `encrypted_content` at `path` of a `purpose` item for the exchange's tenant: 400
/// `invalid_encrypted_content` when it does not open (403 `missing_tenant` without a tenant).
pub(crate) fn open(
    purpose: Purpose,
    blob: &str,
    path: &str,
    options: &Options,
) -> Result<String, ApiError> {
    let keyring = options.keyring.as_ref().ok_or_else(|| {
        let message = match purpose {
            Purpose::Reasoning => format!("Invalid '{path}': this server has no reasoning keys to open it."),
            Purpose::Compaction => format!("Invalid '{path}': this server has no keys configured to open compaction items (--reasoning-keys-file or RESPONSES_EXTPROC_REASONING_KEYS)."),
        };
        bad_value(path, message).with_code(ErrorCode::InvalidEncryptedContent)
    })?;
    require_tenant(options)?;
    keyring
        .open_bound(purpose, &options.tenant, options.accept_unbound_seals, blob)
        .map_err(|e| {
            let tenant = match (&e, &options.tenant) {
                (SealError::Tampered, Tenant::Id(_)) => " (or it was sealed for another tenant)",
                _ => "",
            };
            let kind = items(purpose);
            bad_value(
                path,
                format!("Invalid '{path}': it cannot be opened ({e}{tenant}). Send {kind} back unchanged, to the server that produced them."),
            )
            .with_code(ErrorCode::InvalidEncryptedContent)
        })
}

/// `text` sealed for `purpose`, bound to the exchange's tenant, with `nonce` (`None` without
/// keys, or without a tenant where one is required: such requests were refused before).
pub(crate) fn seal(
    options: &Options,
    purpose: Purpose,
    text: &str,
    nonce: [u8; 24],
) -> Option<String> {
    let keyring = options.keyring.as_ref()?;
    (options.tenant != Tenant::Missing)
        .then(|| keyring.seal_bound(purpose, &options.tenant, text, nonce))
}
