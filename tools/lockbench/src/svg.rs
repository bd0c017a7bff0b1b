//! SVG text written by hand: a handful of elements, escaped text and coordinates printed
//! the same way every time, so the same figures always give the same bytes and a chart in
//! the repository only changes when its data does. No drawing crate: the charts need
//! rectangles, lines, circles and text, and a dependency for that would outweigh them.

use std::fmt::Write;

/// One SVG document being written: its elements in the order they were added.
pub(crate) struct Svg {
    width: f64,
    height: f64,
    title: String,
    body: String,
}

/// How a text lines up on its anchor point.
#[derive(Clone, Copy)]
pub(crate) enum Anchor {
    Start,
    Middle,
    End,
}

impl Anchor {
    fn name(self) -> &'static str {
        match self {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        }
    }
}

/// The look of a text: size in pixels, colour, bold or not, and rotated a quarter turn
/// counter-clockwise (a vertical axis's label) or not.
#[derive(Clone, Copy)]
pub(crate) struct TextStyle {
    pub(crate) size: f64,
    pub(crate) fill: &'static str,
    pub(crate) bold: bool,
    pub(crate) anchor: Anchor,
    pub(crate) vertical: bool,
}

impl TextStyle {
    pub(crate) const fn plain(size: f64, anchor: Anchor) -> Self {
        TextStyle {
            size,
            fill: "#222222",
            bold: false,
            anchor,
            vertical: false,
        }
    }

    pub(crate) const fn colour(self, fill: &'static str) -> Self {
        TextStyle { fill, ..self }
    }

    pub(crate) const fn bold(self) -> Self {
        TextStyle { bold: true, ..self }
    }

    pub(crate) const fn vertical(self) -> Self {
        TextStyle {
            vertical: true,
            ..self
        }
    }
}

/// A stroke: colour, width, and dashed or solid.
#[derive(Clone, Copy)]
pub(crate) struct Stroke {
    pub(crate) colour: &'static str,
    pub(crate) width: f64,
    pub(crate) dashed: bool,
}

impl Stroke {
    pub(crate) const fn solid(colour: &'static str, width: f64) -> Self {
        Stroke {
            colour,
            width,
            dashed: false,
        }
    }

    pub(crate) const fn dashed(colour: &'static str, width: f64) -> Self {
        Stroke {
            colour,
            width,
            dashed: true,
        }
    }

    fn attributes(self) -> String {
        let dash = if self.dashed {
            " stroke-dasharray=\"3 3\""
        } else {
            ""
        };
        format!(
            "stroke=\"{}\" stroke-width=\"{}\"{dash}",
            self.colour,
            coordinate(self.width)
        )
    }
}

impl Svg {
    /// An empty document of `width` by `height` pixels on a white ground (so it reads the
    /// same on a dark page), with `title` as its accessible name.
    pub(crate) fn new(width: f64, height: f64, title: &str) -> Self {
        Svg {
            width,
            height,
            title: title.to_owned(),
            body: String::new(),
        }
    }

    pub(crate) fn width(&self) -> f64 {
        self.width
    }

    /// A filled rectangle; `class` names what it stands for (`bar`, `box`), so a reader of
    /// the file, or a test, can count them.
    pub(crate) fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, class: &str) {
        let class = class_attribute(class);
        let _ = writeln!(
            self.body,
            "<rect{class} x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{fill}\"/>",
            coordinate(x),
            coordinate(y),
            coordinate(w.max(0.0)),
            coordinate(h.max(0.0)),
        );
    }

    /// A rectangle filled with `fill` at `opacity`, outlined with `stroke`.
    pub(crate) fn outlined_rect(
        &mut self,
        (x, y, w, h): (f64, f64, f64, f64),
        fill: &str,
        opacity: f64,
        stroke: Stroke,
        class: &str,
    ) {
        let class = class_attribute(class);
        let _ = writeln!(
            self.body,
            "<rect{class} x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{fill}\" \
             fill-opacity=\"{}\" {}/>",
            coordinate(x),
            coordinate(y),
            coordinate(w.max(0.0)),
            coordinate(h.max(0.0)),
            coordinate(opacity),
            stroke.attributes(),
        );
    }

    pub(crate) fn line(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), stroke: Stroke) {
        let _ = writeln!(
            self.body,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" {}/>",
            coordinate(x1),
            coordinate(y1),
            coordinate(x2),
            coordinate(y2),
            stroke.attributes(),
        );
    }

    /// A circle: filled when `fill` is given, else a ring of the stroke's colour.
    pub(crate) fn circle(
        &mut self,
        (x, y): (f64, f64),
        r: f64,
        fill: Option<&str>,
        stroke: Stroke,
    ) {
        let _ = writeln!(
            self.body,
            "<circle cx=\"{}\" cy=\"{}\" r=\"{}\" fill=\"{}\" {}/>",
            coordinate(x),
            coordinate(y),
            coordinate(r),
            fill.unwrap_or("white"),
            stroke.attributes(),
        );
    }

    pub(crate) fn text(&mut self, (x, y): (f64, f64), text: &str, style: TextStyle) {
        let weight = if style.bold {
            " font-weight=\"bold\""
        } else {
            ""
        };
        let rotate = if style.vertical {
            format!(
                " transform=\"rotate(-90 {} {})\"",
                coordinate(x),
                coordinate(y)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            self.body,
            "<text x=\"{}\" y=\"{}\" font-size=\"{}\" fill=\"{}\" text-anchor=\"{}\"{weight}{rotate}>\
             {}</text>",
            coordinate(x),
            coordinate(y),
            coordinate(style.size),
            style.fill,
            style.anchor.name(),
            escape(text),
        );
    }

    /// The finished document, with a newline at its end.
    pub(crate) fn finish(self) -> String {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             viewBox=\"0 0 {w} {h}\" font-family=\"Helvetica, Arial, sans-serif\">\n\
             <title>{}</title>\n\
             <rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n{}</svg>\n",
            escape(&self.title),
            self.body,
            w = coordinate(self.width),
            h = coordinate(self.height),
        )
    }
}

fn class_attribute(class: &str) -> String {
    if class.is_empty() {
        String::new()
    } else {
        format!(" class=\"{}\"", escape(class))
    }
}

/// A coordinate to a tenth of a pixel, without a trailing `.0`: finer would only add bytes.
pub(crate) fn coordinate(value: f64) -> String {
    let tenths = (value * 10.0).round();
    if tenths == 0.0 {
        return "0".into();
    }
    if tenths % 10.0 == 0.0 {
        format!("{}", tenths / 10.0)
    } else {
        format!("{:.1}", tenths / 10.0)
    }
}

/// Text safe inside an element or a quoted attribute.
pub(crate) fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_are_printed_to_a_tenth_without_trailing_zeros() {
        assert_eq!(coordinate(12.0), "12");
        assert_eq!(coordinate(12.04), "12");
        assert_eq!(coordinate(12.06), "12.1");
        assert_eq!(coordinate(-0.01), "0");
        assert_eq!(coordinate(-3.5), "-3.5");
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            escape("a<b & \"c\" 'd'>"),
            "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;"
        );
        let mut svg = Svg::new(10.0, 10.0, "t & u");
        svg.text((1.0, 2.0), "<x>", TextStyle::plain(11.0, Anchor::Start));
        let text = svg.finish();
        assert!(text.contains("<title>t &amp; u</title>"));
        assert!(text.contains(">&lt;x&gt;</text>"));
    }
}
