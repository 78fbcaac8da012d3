//! SVG charts for the pages, drawn by plotters.
//!
//! Architecture invariant: pure functions from numbers and labels to SVG text; they never
//! fail the page (a drawing error yields a chart that says so). plotters escapes its own
//! text, so labels built from span names are safe to embed with `|safe`. Colours are fixed
//! here; the stylesheet recolours text and grid for dark mode, and every series is named
//! in a legend, so colour never carries meaning alone.

use plotters::prelude::*;

const WIDTH: u32 = 720;
const HEIGHT: u32 = 220;

/// Local deadline-exceeded: spent here.
pub const LOCAL: RGBColor = RGBColor(214, 69, 65);
/// Inherited deadline-exceeded: arrived already spent.
pub const INHERITED: RGBColor = RGBColor(240, 160, 40);
pub const NEUTRAL: RGBColor = RGBColor(70, 120, 200);

/// One stacked series: its name (for the legend), colour and one value per bar.
pub struct Series<'a> {
    pub name: &'a str,
    pub colour: RGBColor,
    pub values: Vec<f64>,
}

/// Stacked bars, one per label, series stacked bottom to top in the given order.
/// `labels` are x-axis labels (a few are shown); `title` becomes the SVG's accessible name.
pub fn stacked_bars(title: &str, labels: &[String], series: &[Series<'_>]) -> String {
    let mut svg = String::new();
    let result = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        let bars = labels.len().max(1);
        let totals: Vec<f64> = (0..bars)
            .map(|i| {
                series
                    .iter()
                    .map(|s| s.values.get(i).copied().unwrap_or(0.0))
                    .sum()
            })
            .collect();
        let top = totals.iter().copied().fold(0.0f64, f64::max).max(1.0) * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..bars as f64, 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(6.min(bars))
            .y_labels(4)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                labels.get(i).cloned().unwrap_or_default()
            })
            .y_label_formatter(&|y| count_label(*y))
            .draw()?;
        let mut base = vec![0.0f64; bars];
        for s in series {
            let rects: Vec<Rectangle<(f64, f64)>> = (0..bars)
                .filter_map(|i| {
                    let value = s.values.get(i).copied().unwrap_or(0.0);
                    if value <= 0.0 {
                        return None;
                    }
                    let bottom = base[i];
                    base[i] += value;
                    Some(Rectangle::new(
                        [(i as f64 + 0.1, bottom), (i as f64 + 0.9, base[i])],
                        s.colour.filled(),
                    ))
                })
                .collect();
            chart
                .draw_series(rects)?
                .label(s.name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], s.colour.filled())
                });
        }
        if series.len() > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.7))
                .border_style(BLACK.mix(0.3))
                .draw()?;
        }
        root.present()?;
        Ok(())
    })();
    finish(svg, title, result.map_err(|e| e.to_string()))
}

/// One line of a line chart: its name (for the legend) and (time, value) points in time
/// order.
pub struct Line<'a> {
    pub name: &'a str,
    pub points: Vec<(u64, f64)>,
}

/// Colours of successive lines.
const PALETTE: [RGBColor; 5] = [
    NEUTRAL,
    LOCAL,
    INHERITED,
    RGBColor(60, 150, 90),
    RGBColor(140, 90, 180),
];

/// Values over time, one line per series, with a horizontal threshold line. `time_label`
/// formats an x-axis time (unix ns).
pub fn lines(
    title: &str,
    lines: &[Line<'_>],
    threshold: f64,
    time_label: &dyn Fn(u64) -> String,
) -> String {
    let mut svg = String::new();
    let result = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        let points = || lines.iter().flat_map(|l| l.points.iter());
        let first = points().map(|p| p.0).min().unwrap_or(0);
        let last = points().map(|p| p.0).max().unwrap_or(0).max(first + 1);
        let values = || points().map(|p| p.1).chain([threshold]);
        let low = values().fold(f64::INFINITY, f64::min).min(0.0);
        let high = values().fold(f64::NEG_INFINITY, f64::max);
        let span = (high - low).max(f64::EPSILON);
        let mut chart = ChartBuilder::on(&root)
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(52)
            .build_cartesian_2d(first..last, low..high + span * 0.1)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(6)
            .y_labels(4)
            .x_label_formatter(&|x| time_label(*x))
            .y_label_formatter(&|y| {
                let text = format!("{y:.3}");
                text.trim_end_matches('0').trim_end_matches('.').to_string()
            })
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                [(first, threshold), (last, threshold)],
                BLACK.mix(0.5).stroke_width(1),
            ))?
            .label("threshold")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], BLACK.mix(0.5)));
        for (i, line) in lines.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    colour.stroke_width(2),
                ))?
                .label(line.name)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 12, y)], colour.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.7))
            .border_style(BLACK.mix(0.3))
            .draw()?;
        root.present()?;
        Ok(())
    })();
    finish(svg, title, result.map_err(|e| e.to_string()))
}

/// A histogram: one bar per bin, labelled by the bin's lower edge.
pub fn histogram(title: &str, bins: &[(String, f64)], colour: RGBColor) -> String {
    let labels: Vec<String> = bins.iter().map(|(label, _)| label.clone()).collect();
    stacked_bars(
        title,
        &labels,
        &[Series {
            name: title,
            colour,
            values: bins.iter().map(|(_, n)| *n).collect(),
        }],
    )
}

fn count_label(y: f64) -> String {
    if y >= 10_000.0 {
        format!("{:.0}k", y / 1000.0)
    } else if y.fract().abs() < 1e-9 {
        format!("{y:.0}")
    } else {
        format!("{y:.1}")
    }
}

/// Gives the SVG an accessible name and a scalable size, or replaces it with a note.
fn finish(svg: String, title: &str, result: Result<(), String>) -> String {
    match result {
        Ok(()) => {
            let title = escape(title);
            svg.replacen(
                "<svg ",
                &format!(
                    "<svg class=\"chart\" role=\"img\" aria-label=\"{title}\" preserveAspectRatio=\"xMinYMin meet\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" "
                ),
                1,
            )
            .replacen(&format!("width=\"{WIDTH}\" height=\"{HEIGHT}\""), "", 1)
        }
        Err(error) => format!(
            "<p class=\"muted\">The chart could not be drawn ({}); the table below has the numbers.</p>",
            escape(&error)
        ),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_stack_and_labels_are_escaped() {
        let svg = stacked_bars(
            "exceeded <b>",
            &["<script>".to_string(), "b".to_string()],
            &[
                Series {
                    name: "local",
                    colour: LOCAL,
                    values: vec![1.0, 2.0],
                },
                Series {
                    name: "inherited",
                    colour: INHERITED,
                    values: vec![3.0, 0.0],
                },
            ],
        );
        assert!(svg.starts_with("<svg class=\"chart\""), "{svg}");
        assert!(svg.contains("aria-label=\"exceeded &lt;b&gt;\""));
        assert!(!svg.contains("<script>"), "{svg}");
        assert!(svg.contains("local") && svg.contains("inherited"), "legend");
        // Three non-zero values: three bars in the plot (plus legend swatches).
        assert!(svg.matches("<rect").count() >= 3);
    }

    #[test]
    fn lines_draw_each_series_and_the_threshold() {
        let svg = lines(
            "values of <rule>",
            &[
                Line {
                    name: "edge <GET>",
                    points: vec![(0, 0.1), (60, 0.4), (120, 0.2)],
                },
                Line {
                    name: "billing",
                    points: vec![(60, 0.7)],
                },
            ],
            0.3,
            &|t| format!("t{t}"),
        );
        assert!(
            svg.contains("aria-label=\"values of &lt;rule&gt;\""),
            "{svg}"
        );
        assert!(!svg.contains("<GET>"), "{svg}");
        assert!(svg.contains("threshold") && svg.contains("billing"));
        assert!(svg.matches("<polyline").count() >= 3, "{svg}");
        assert!(lines("empty", &[], 1.0, &|_| String::new()).contains("<svg"));
    }

    #[test]
    fn an_empty_series_still_draws_axes() {
        let svg = histogram("budget", &[], NEUTRAL);
        assert!(svg.contains("<svg"), "{svg}");
    }
}
