//! Sealed items bound to a tenant (`--seal-tenant-header`), the Envoy side as
//! docs/compaction.md describes it: the tenant header set by Envoy's `jwt_authn` filter from a
//! verified token's `tenant` claim, and a client's own removed by an early header mutation.
//! Tokens are HS256 (a shared secret in the bootstrap's local JWKS), made here.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::{json, Value};

/// The request header the tests bind sealed items to.
pub const HEADER: &str = "x-tenant";

/// The HMAC secret of the tokens (its JWKS `k` is its base64url).
const SECRET: &[u8] = b"the tenant tests' token secret, 32+ bytes long";

/// A token Envoy accepts, with these claims (`{"tenant": "team-a"}`), as an `authorization`
/// header value.
pub fn bearer(claims: Value) -> String {
    let mut claims = claims;
    claims["iss"] = json!("tenants.test");
    let header = URL_SAFE_NO_PAD.encode(json!({"alg": "HS256", "typ": "JWT"}).to_string());
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{payload}");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET);
    let tag = ring::hmac::sign(&key, signed.as_bytes());
    format!("Bearer {signed}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// A bearer token for `tenant`.
pub fn of(tenant: &str) -> String {
    bearer(json!({"tenant": tenant}))
}

/// Edits either mode's bootstrap (`envoy/envoy.yaml`, `envoy/envoy-module.yaml`): the
/// client's own tenant header removed before anything reads it, then `jwt_authn` first among
/// the HTTP filters, setting it from a valid token's `tenant` claim (a request without a token
/// passes without one; a bad token is Envoy's 401); in ext_proc mode the header is added to
/// what Envoy forwards to the processor.
pub fn from_jwt(config: String) -> String {
    let once = |config: String, anchor: &str, with: &str| {
        assert_eq!(config.matches(anchor).count(), 1, "{anchor:?} once");
        config.replace(anchor, &format!("{anchor}{with}"))
    };
    let config = once(
        config,
        "              - remove: x-responses-upstream-model\n",
        &format!("              - remove: {HEADER}\n"),
    );
    let jwks =
        json!({"keys": [{"kty": "oct", "alg": "HS256", "k": URL_SAFE_NO_PAD.encode(SECRET)}]});
    // The public listener's filters, the first list (module mode's internal listener, where
    // the filter's own requests enter with the client's credentials, shares it).
    let config = super::examples::after_first_line(
        config,
        "          http_filters:",
        &format!(
            r#"          - name: envoy.filters.http.jwt_authn
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
              providers:
                tenants:
                  issuer: tenants.test
                  local_jwks:
                    inline_string: '{jwks}'
                  claim_to_headers:
                  - header_name: {HEADER}
                    claim_name: tenant
              rules:
              - match: {{prefix: "/"}}
                requires:
                  requires_any:
                    requirements:
                    - provider_name: tenants
                    - allow_missing: {{}}
"#
        ),
    );
    let forwarded = "                  - exact: \"x-request-id\"\n";
    if config.contains(forwarded) {
        once(
            config,
            forwarded,
            &format!("                  - exact: \"{HEADER}\"\n"),
        )
    } else {
        config
    }
}
