//! `/help/budget-semantics` and `/help/instrument`: docs/budget-semantics.md and
//! docs/instrument.md, compiled into the binary and shown as pages, so that every flag
//! badge can link to its meaning (`#FLAG`) and the guides the README links are the ones
//! the server shows. Links between the guides (`instrument.md`) become their pages.

use askama::Template;
use axum::http::StatusCode;
use axum::response::Response;
use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd, html};

use super::html as page;

const GUIDE: &str = include_str!("../../../docs/budget-semantics.md");
const INSTRUMENT: &str = include_str!("../../../docs/instrument.md");

#[derive(Template)]
#[template(path = "help.html")]
pub struct HelpPage {
    pub nav: &'static str,
    pub title: String,
    /// The guide as HTML, from our own Markdown (trusted, compiled in).
    pub body: String,
}

/// A heading's anchor as GitHub makes it: lower case, spaces to `-`, only letters,
/// digits, `-` and `_` kept; so `` `local_exceed` `` is `#local_exceed` here and there.
pub fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The guide as HTML, its headings with GitHub's anchors, and its first heading.
pub fn render(markdown: &str) -> (String, String) {
    let events: Vec<Event<'_>> = Parser::new_ext(markdown, Options::ENABLE_TABLES).collect();
    let mut out: Vec<Event<'_>> = Vec::with_capacity(events.len());
    let mut title = String::new();
    let mut i = 0;
    while i < events.len() {
        if let Event::Start(Tag::Heading { level, .. }) = &events[i] {
            let end = events[i..]
                .iter()
                .position(|e| matches!(e, Event::End(TagEnd::Heading(_))))
                .map_or(events.len(), |p| i + p);
            let text: String = events[i + 1..end]
                .iter()
                .filter_map(|e| match e {
                    Event::Text(t) | Event::Code(t) => Some(t.to_string()),
                    _ => None,
                })
                .collect();
            if *level == HeadingLevel::H1 && title.is_empty() {
                title = text.clone();
            }
            out.push(Event::Start(Tag::Heading {
                level: *level,
                id: Some(slug(&text).into()),
                classes: Vec::new(),
                attrs: Vec::new(),
            }));
            i += 1;
            continue;
        }
        if let Event::Start(Tag::Link {
            link_type,
            dest_url,
            title,
            id,
        }) = &events[i]
            && let Some(page) = dest_url
                .strip_suffix(".md")
                .filter(|name| !name.contains(['/', ':']))
        {
            out.push(Event::Start(Tag::Link {
                link_type: *link_type,
                dest_url: format!("/help/{page}").into(),
                title: title.clone(),
                id: id.clone(),
            }));
            i += 1;
            continue;
        }
        out.push(events[i].clone());
        i += 1;
    }
    let mut body = String::new();
    html::push_html(&mut body, out.into_iter());
    (body, title)
}

pub async fn budget_semantics() -> Response {
    guide(GUIDE)
}

pub async fn instrument() -> Response {
    guide(INSTRUMENT)
}

fn guide(markdown: &str) -> Response {
    let (body, title) = render(markdown);
    page(
        StatusCode::OK,
        &HelpPage {
            nav: "",
            title,
            body,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_has_an_anchor_in_the_guide() {
        let (body, title) = render(GUIDE);
        assert_eq!(title, "What budgetscope's flags and numbers mean");
        for flag in crate::core::analyze::Flag::ALL {
            let anchor = format!("<h3 id=\"{}\">", flag.as_str());
            assert!(body.contains(&anchor), "no {anchor} in the guide");
        }
        assert!(
            body.contains("<h2 id=\"inherited-and-local-whose-page-is-it\">"),
            "{body}"
        );
    }

    #[test]
    fn links_between_the_guides_open_their_pages() {
        let (body, title) = render(INSTRUMENT);
        assert_eq!(title, "Instrumenting a service for budgetscope");
        assert!(body.contains("href=\"/help/budget-semantics\""), "{body}");
        assert!(!body.contains(".md\""), "{body}");
        let (body, _) = render("[x](https://example.com/a.md) [y](../README.md)");
        assert!(body.contains("href=\"https://example.com/a.md\""), "{body}");
        assert!(body.contains("href=\"../README.md\""), "{body}");
    }
}
