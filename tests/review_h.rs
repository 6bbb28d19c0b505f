//! Review h: what the last hour's fixes (reviews b and c: capture reading, start-up warnings,
//! the config file, the server URL as logged) broke or missed.

use pvp_t140::sink::ShownUrl;

/// The server URL is logged at every connect, with a token in its query hidden. With a port in
/// the URL and an `@` in the query (an e-mail address: `?user=alice@example.org&token=...`),
/// the part up to that `@` was taken for user information and hidden, and the rest, the
/// token included, written as it is: the token was in the log in full.
#[test]
fn a_token_after_an_at_sign_in_the_query_is_not_shown() {
    let shown =
        ShownUrl("wss://pvp.example:8443/pvp?user=alice@example.org&token=S3CRET").to_string();
    assert!(!shown.contains("S3CRET"), "{shown}");
}
