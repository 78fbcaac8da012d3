//! The stylesheet, script and icon, compiled into the binary so the UI works offline and
//! from any working directory.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The classes that place bars and marks (`super::pages::permille`): left, width and the
/// deadline line (`--dl`) in steps of 0.1 %, and the waterfall's indent per depth. Pages
/// carry no inline styles, so the Content-Security-Policy allows only our own stylesheets.
static GEOMETRY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let mut css = String::from("/* generated: src/web/assets.rs */\n");
    for n in 0..=super::pages::PERMILLE {
        let at = format!("{}.{}%", n / 10, n % 10);
        css += &format!(".g-l{n}{{left:{at}}}.g-w{n}{{width:{at}}}.g-d{n}{{--dl:{at}}}\n");
    }
    for depth in 0..=super::pages::MAX_INDENT {
        css += &format!(".g-i{depth}{{padding-left:{}px}}\n", depth * 14);
    }
    css
});

const FILES: [(&str, &str, &str); 3] = [
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../static/app.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../static/app.js"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("../../static/favicon.svg"),
    ),
];

pub async fn asset(Path(file): Path<String>) -> Response {
    if file == "geometry.css" {
        return (
            [
                (header::CONTENT_TYPE, "text/css; charset=utf-8"),
                (header::CACHE_CONTROL, "public, max-age=300"),
            ],
            GEOMETRY.as_str(),
        )
            .into_response();
    }
    match FILES.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, body)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "public, max-age=300"),
            ],
            *body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}
