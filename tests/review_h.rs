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

/// Servers that split a query on `;` as well as `&` (the older HTML form rules, many
/// frameworks) and that percent-decode its names take `?session=s;token=...` and
/// `?%74oken=...` for a token: the log showed both in full.
#[test]
fn a_token_after_a_semicolon_or_under_a_percent_encoded_name_is_not_shown() {
    for url in [
        "wss://pvp.example/pvp?session=s1;token=S3CRET",
        "wss://pvp.example/pvp?session=s1&%74oken=S3CRET",
        "wss://pvp.example/pvp?api%5Fkey=S3CRET",
    ] {
        let shown = ShownUrl(url).to_string();
        assert!(!shown.contains("S3CRET"), "{shown}");
        assert!(
            shown.contains("session=s1") || !url.contains("session"),
            "{shown}"
        );
    }
}
