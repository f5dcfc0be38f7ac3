//! The PNG plot of the client's writes around the kill: cumulative
//! acknowledged writes against time since `kill -9` (a flat stretch is the
//! unavailability window), one line per manager, and below the chart a
//! strip per manager with a tick for every failed operation.
//!
//! plotters is built without any font support (no system fonts, no font
//! files), so the few labels are drawn pixel by pixel from font8x8's
//! compiled-in 8x8 glyphs.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

use crate::runs::Point;

/// One line of the plot.
pub struct Series<'a> {
    /// Legend text.
    pub label: String,
    /// Name beside its error strip (at most 9 characters).
    pub short: String,
    /// Its colour.
    pub color: RGBColor,
    /// The writes (time since the kill).
    pub points: &'a [Point],
}

/// picket's colour.
pub const PICKET: RGBColor = RGBColor(0x1f, 0x5f, 0xbf);
/// redis-sentinel's colour.
pub const SENTINEL: RGBColor = RGBColor(0xc0, 0x30, 0x20);

/// Draw `text` with its top-left corner at `(x, y)`, each font pixel a
/// `scale` x `scale` square.
fn text<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    x: i32,
    y: i32,
    s: &str,
    scale: i32,
    color: &RGBColor,
) {
    for (i, ch) in s.chars().enumerate() {
        let code = ch as usize;
        let glyph = font8x8::legacy::BASIC_LEGACY
            .get(code)
            .copied()
            .unwrap_or(font8x8::legacy::NOTHING_TO_DISPLAY);
        let gx = x + i as i32 * 8 * scale;
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                // font8x8: the least significant bit is the leftmost pixel.
                if bits & (1 << col) != 0 {
                    let px = gx + col * scale;
                    let py = y + row as i32 * scale;
                    let _ = area.draw(&Rectangle::new(
                        [(px, py), (px + scale, py + scale)],
                        color.filled(),
                    ));
                }
            }
        }
    }
}

fn text_width(s: &str, scale: i32) -> i32 {
    s.chars().count() as i32 * 8 * scale
}

/// Draw the plot to `path` (PNG).
pub fn draw(
    path: &Path,
    title: &str,
    down_after_ms: f64,
    series: &[Series<'_>],
) -> anyhow::Result<()> {
    let (w, h) = (1100u32, 640u32);
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;

    let cum: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|s| {
            // Counted from the left edge, so the steady slope before the
            // kill shows too and the flat stretch stands out.
            let mut n = 0.0;
            let mut v = vec![(-1.0, 0.0)];
            for p in s
                .points
                .iter()
                .filter(|p| p.outcome == "ok" && p.t_ms >= -1000.0)
            {
                n += 1.0;
                v.push((p.t_ms / 1000.0, n));
            }
            v
        })
        .collect();
    // Until every line has been writing again for a good while.
    let x_min = -1.0;
    let recovered: f64 = series
        .iter()
        .map(|s| {
            s.points
                .iter()
                .filter(|p| p.t_ms > 0.0 && p.outcome == "ok")
                .map(|p| p.t_ms / 1000.0)
                .next()
                .unwrap_or(0.0)
        })
        .fold(down_after_ms / 1000.0, f64::max);
    let x_max = (recovered + 2.0).ceil();
    let y_max = cum
        .iter()
        .flat_map(|v| v.iter().filter(|(x, _)| *x <= x_max).map(|(_, y)| *y))
        .fold(10.0, f64::max)
        * 1.08;

    let (left, right, top, bottom) = (80i32, 30i32, 80i32, 150i32);
    let (pw, ph) = (w as i32 - left - right, h as i32 - top - bottom);
    // Data to pixels; plotters' own chart coordinates would need its
    // label machinery, which has no font here.
    let to_px = |x: f64, y: f64| {
        let px = left + ((x - x_min) / (x_max - x_min) * f64::from(pw)).round() as i32;
        let py = top + ph - (y / y_max * f64::from(ph)).round() as i32;
        (px, py)
    };
    let line = |pts: Vec<(f64, f64)>, style: ShapeStyle| -> anyhow::Result<()> {
        let px: Vec<(i32, i32)> = pts.into_iter().map(|(x, y)| to_px(x, y)).collect();
        root.draw(&PathElement::new(px, style))
            .map_err(|e| anyhow!("{e}"))
    };
    let grey = RGBColor(0xdd, 0xdd, 0xdd);
    let dark = RGBColor(0x33, 0x33, 0x33);

    // Grid: a vertical line per second, about five horizontal lines.
    let y_step = nice_step(y_max / 5.0);
    let mut s = x_min.ceil() as i64;
    while (s as f64) <= x_max {
        let x = s as f64;
        line(vec![(x, 0.0), (x, y_max)], grey.into())?;
        let (px, py) = to_px(x, 0.0);
        let l = format!("{s}");
        text(&root, px - text_width(&l, 2) / 2, py + 8, &l, 2, &dark);
        s += 1;
    }
    let mut y = 0.0;
    while y <= y_max {
        line(vec![(x_min, y), (x_max, y)], grey.into())?;
        let (px, py) = to_px(x_min, y);
        let l = format!("{y:.0}");
        text(&root, px - text_width(&l, 1) - 6, py - 4, &l, 1, &dark);
        y += y_step;
    }
    // The kill, and down_after after it.
    for (x, c) in [
        (0.0, BLACK),
        (down_after_ms / 1000.0, RGBColor(0x88, 0x88, 0x88)),
    ] {
        line(vec![(x, 0.0), (x, y_max)], c.stroke_width(2))?;
    }
    let (kx, ky) = to_px(0.0, y_max);
    text(&root, kx + 4, ky + 4, "kill -9", 1, &BLACK);
    let (dx, _) = to_px(down_after_ms / 1000.0, y_max);
    text(
        &root,
        dx + 4,
        ky + 4,
        "down_after",
        1,
        &RGBColor(0x66, 0x66, 0x66),
    );

    for (s, v) in series.iter().zip(&cum) {
        line(
            v.iter().copied().filter(|(x, _)| *x <= x_max).collect(),
            s.color.stroke_width(2),
        )?;
    }

    // Axis frame.
    let (x0, y0) = to_px(x_min, 0.0);
    let (x1, y1) = to_px(x_max, y_max);
    root.draw(&Rectangle::new([(x0, y1), (x1, y0)], dark.stroke_width(1)))
        .map_err(|e| anyhow!("{e}"))?;

    // Error strips under the chart.
    let strip_h = 22;
    text(
        &root,
        x0,
        y0 + 44,
        "failed operations (a tick each)",
        1,
        &dark,
    );
    for (i, s) in series.iter().enumerate() {
        let top_y = y0 + 56 + i as i32 * (strip_h + 10);
        root.draw(&Rectangle::new(
            [(x0, top_y), (x1, top_y + strip_h)],
            grey.filled(),
        ))
        .map_err(|e| anyhow!("{e}"))?;
        for p in s.points.iter().filter(|p| p.outcome != "ok") {
            let t = p.t_ms / 1000.0;
            if t < x_min || t > x_max {
                continue;
            }
            let (px, _) = to_px(t, 0.0);
            root.draw(&PathElement::new(
                vec![(px, top_y + 2), (px, top_y + strip_h - 2)],
                s.color,
            ))
            .map_err(|e| anyhow!("{e}"))?;
        }
        text(&root, 6, top_y + 7, &s.short, 1, &s.color);
    }

    // Title, legend, axis names.
    text(&root, 10, 10, title, 2, &BLACK);
    let mut lx = 10;
    for s in series {
        let ly = 36;
        root.draw(&Rectangle::new(
            [(lx, ly + 2), (lx + 24, ly + 6)],
            s.color.filled(),
        ))
        .map_err(|e| anyhow!("{e}"))?;
        text(&root, lx + 30, ly, &s.label, 1, &s.color);
        lx += 50 + text_width(&s.label, 1);
    }
    text(
        &root,
        10,
        top - 16,
        "acknowledged writes, counted from 1 s before the kill",
        1,
        &dark,
    );
    let xl = "seconds since kill -9";
    text(
        &root,
        (x0 + x1 - text_width(xl, 1)) / 2,
        y0 + 28,
        xl,
        1,
        &dark,
    );
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= raw {
            return m * p;
        }
    }
    10.0 * p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps() {
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(120.0), 200.0);
        assert_eq!(nice_step(0.0), 1.0);
    }

    #[test]
    fn draws_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.png");
        let pts: Vec<Point> = (-100..300)
            .map(|i| Point {
                t_ms: i as f64 * 10.0,
                outcome: if (0..150).contains(&i) {
                    "refused"
                } else {
                    "ok"
                },
            })
            .collect();
        draw(
            &path,
            "test",
            1000.0,
            &[Series {
                label: "picket".into(),
                short: "picket".into(),
                color: PICKET,
                points: &pts,
            }],
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
    }
}
