//! The page itself: one HTML shell, one script and one style sheet, all compiled into the
//! binary (no CDN, no framework, nothing fetched from elsewhere).
//!
//! Served by the controller, the shell loads `/ui/app.js` and `/ui/app.css` from the same
//! origin, so the strict `Content-Security-Policy` the API sends (`default-src 'self'`, no
//! inline script or style) holds. The offline report is one file: there the script and the
//! style are inlined, with the data in a `<script type="application/json">` block, under a
//! `<meta>` policy that allows no network access at all.

use serde::Serialize;

pub const APP_JS: &str = include_str!("assets/app.js");
pub const APP_CSS: &str = include_str!("assets/app.css");
const SHELL: &str = include_str!("assets/index.html");

/// The policy the served page is sent with.
pub const SERVED_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The policy inside the offline report: inline script and style (the file is all there
/// is), and no network access.
const OFFLINE_CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'";

/// The served shell.
pub fn served() -> String {
    SHELL
        .replace(
            "<!--HEAD-->",
            "<link rel=\"stylesheet\" href=\"/ui/app.css\">\n<script src=\"/ui/app.js\" defer></script>",
        )
        .replace("<!--DATA-->", "")
}

/// The self-contained report with `json` (JSON text) inlined.
pub fn offline(json: &str) -> String {
    let json = for_script(json);
    let head = format!(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"{OFFLINE_CSP}\">\n<style>\n{APP_CSS}\n</style>"
    );
    let data = format!(
        "<script type=\"application/json\" id=\"kipam-data\">{json}</script>\n<script>\n{}\n</script>",
        APP_JS.replace("</script", "<\\/script")
    );
    SHELL
        .replace("<!--HEAD-->", &head)
        .replace("<!--DATA-->", &data)
}

/// JSON that can sit inside an HTML `<script>` element: `<`, `>` and `&` (which only occur
/// inside JSON strings) are written as `\u003c` etc., so no name can close the element.
pub fn json_for_html<T: Serialize>(data: &T) -> Result<String, serde_json::Error> {
    Ok(for_script(&serde_json::to_string(data)?))
}

/// JSON text made safe inside a `<script>` element, as [`json_for_html`] says.
fn for_script(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut rest = text;
    while let Some(at) = rest.find(['<', '>', '&', '\u{2028}', '\u{2029}']) {
        out.push_str(&rest[..at]);
        let c = rest[at..].chars().next().unwrap_or_default();
        out.push_str(&format!("\\u{:04x}", u32::from(c)));
        rest = &rest[at + c.len_utf8()..];
    }
    out.push_str(rest);
    out
}
