//! Benchmark output: result lines, the summary table, JSON and SVG throughput-latency plots.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::load::{Measurement, Workload};
use super::{fsync_name, Point, READ_ONLY_NOTE};

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

pub(super) fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// One line with upright's figures and, beside each, NO-REP's and the ratio.
pub fn result_line(p: &Point) -> String {
    let m = &p.upright;
    let mut line = format!(
        "RESULT {} clients={} protocol={} u={} r={} batch={} fsync={}: {:.0} ops/s, p50 {} ms, p99 {} ms, p99.9 {} ms, cpu {:.1} us/op",
        p.workload.name(),
        p.clients,
        protocol_label(p),
        p.u,
        p.r,
        p.batch_size,
        fsync_name(p.fsync),
        m.throughput,
        ms(m.p50_us),
        ms(m.p99_us),
        ms(m.p999_us),
        m.cpu_us_per_op
    );
    if m.errors > 0 {
        let _ = write!(line, ", {} errors", m.errors);
    }
    if let Some(b) = &p.baseline {
        let _ = write!(
            line,
            "\n       NO-REP: {:.0} ops/s ({} of NO-REP), p50 {} ms ({}), p99 {} ms ({}), p99.9 {} ms ({}), cpu {:.1} us/op ({})",
            b.throughput,
            ratio(m.throughput, b.throughput),
            ms(b.p50_us),
            ratio(m.p50_us as f64, b.p50_us as f64),
            ms(b.p99_us),
            ratio(m.p99_us as f64, b.p99_us as f64),
            ms(b.p999_us),
            ratio(m.p999_us as f64, b.p999_us as f64),
            b.cpu_us_per_op,
            ratio(m.cpu_us_per_op, b.cpu_us_per_op)
        );
    }
    line
}

/// A Markdown table of every point (ratios are upright / NO-REP).
pub fn table(points: &[Point]) -> String {
    let mut s = String::from(
        "| workload | clients | protocol | u/r | batch | fsync | ops/s | NO-REP ops/s | ratio | p50 ms | NO-REP p50 | ratio | p99 ms | p99.9 ms | cpu us/op | NO-REP cpu | ratio |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in points {
        let m = &p.upright;
        let b = p.baseline.clone().unwrap_or_default();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {}/{} | {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {} |",
            p.workload.name(),
            p.clients,
            protocol_label(p),
            p.u,
            p.r,
            p.batch_size,
            fsync_name(p.fsync),
            m.throughput,
            b.throughput,
            ratio(m.throughput, b.throughput),
            ms(m.p50_us),
            ms(b.p50_us),
            ratio(m.p50_us as f64, b.p50_us as f64),
            ms(m.p99_us),
            ms(m.p999_us),
            m.cpu_us_per_op,
            b.cpu_us_per_op,
            ratio(m.cpu_us_per_op, b.cpu_us_per_op)
        );
    }
    s
}

fn json_measurement(m: &Measurement) -> String {
    format!(
        "{{\"throughput_ops_per_s\": {:.1}, \"latency_us\": {{\"p50\": {}, \"p99\": {}, \"p999\": {}, \"mean\": {:.1}}}, \"cpu_us_per_op\": {:.2}, \"client_cpu_us_per_op\": {:.2}, \"ops\": {}, \"errors\": {}, \"seconds\": {:.3}}}",
        m.throughput, m.p50_us, m.p99_us, m.p999_us, m.mean_us, m.cpu_us_per_op, m.client_cpu_us_per_op, m.ops, m.errors, m.seconds
    )
}

fn json_ratio(m: &Measurement, b: &Measurement) -> String {
    let r = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.4}", a / b)
        } else {
            "null".into()
        }
    };
    format!(
        "{{\"throughput\": {}, \"p50\": {}, \"p99\": {}, \"p999\": {}, \"cpu_us_per_op\": {}}}",
        r(m.throughput, b.throughput),
        r(m.p50_us as f64, b.p50_us as f64),
        r(m.p99_us as f64, b.p99_us as f64),
        r(m.p999_us as f64, b.p999_us as f64),
        r(m.cpu_us_per_op, b.cpu_us_per_op)
    )
}

/// The body of one point's JSON object (without braces): upright's keys at the top level, the
/// NO-REP figures under `baseline`, upright / NO-REP under `ratio`.
fn json_point_fields(p: &Point) -> String {
    let m = json_measurement(&p.upright);
    let mut s = format!(
        "\"workload\": \"{}\", \"clients\": {}, \"protocol\": \"{}\", \"u\": {}, \"r\": {}, \"batch_size\": {}, \"fsync\": \"{}\", {}",
        p.workload.name(),
        p.clients,
        protocol_label(p),
        p.u,
        p.r,
        p.batch_size,
        fsync_name(p.fsync),
        &m[1..m.len() - 1]
    );
    match &p.baseline {
        Some(b) => {
            let _ = write!(
                s,
                ", \"baseline\": {}, \"ratio\": {}",
                json_measurement(b),
                json_ratio(&p.upright, b)
            );
        }
        None => s.push_str(", \"baseline\": null, \"ratio\": null"),
    }
    s
}

/// The whole run as JSON: the last point's figures at the top level (for a single-point run that
/// is the run), every point under `runs`.
pub fn to_json(points: &[Point], cores: usize, command: &str) -> String {
    let mut s = String::from("{\n");
    let _ = writeln!(s, "  \"machine\": {{\"cores\": {cores}}},");
    let _ = writeln!(s, "  \"command\": {},", json_string(command));
    let _ = writeln!(s, "  \"note\": {},", json_string(READ_ONLY_NOTE));
    if let Some(last) = points.last() {
        let _ = writeln!(s, "  {},", json_point_fields(last));
    }
    s.push_str("  \"runs\": [\n");
    for (i, p) in points.iter().enumerate() {
        let comma = if i + 1 < points.len() { "," } else { "" };
        let _ = writeln!(s, "    {{{}}}{comma}", json_point_fields(p));
    }
    s.push_str("  ]\n}\n");
    s
}

pub(super) fn json_string(text: &str) -> String {
    let mut s = String::from("\"");
    for ch in text.chars() {
        match ch {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// Where the plot of `workload` goes next to the JSON file `json`: `<stem>-<A>-<B>.svg`.
pub fn svg_path(json: &Path, workload: Workload) -> PathBuf {
    let stem = json
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bench".into());
    json.with_file_name(format!("{stem}-{}.svg", workload.name().replace('/', "-")))
}

/// A named series of (throughput, p50 ms, clients) points.
type Series = (String, Vec<(f64, f64, u32)>);

const W: f64 = 640.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const BOTTOM: f64 = 50.0;
const TOP: f64 = 40.0;
const RIGHT: f64 = 20.0;

pub(super) fn nice_max(v: f64) -> f64 {
    let v = v.max(1e-9) * 1.1;
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|x| *x >= v)
        .unwrap_or(10.0 * p)
}

/// The axes of a plot: the width and the right margin vary, the rest is shared.
pub(super) struct Plot {
    /// Width of the image.
    pub width: f64,
    /// Room right of the plot area (for a legend).
    pub right: f64,
    /// Largest x shown.
    pub xmax: f64,
    /// Largest y shown.
    pub ymax: f64,
}

impl Plot {
    /// Image x of value `x`.
    pub fn px(&self, x: f64) -> f64 {
        LEFT + x / self.xmax * (self.width - LEFT - self.right)
    }

    /// Image y of value `y`.
    pub fn py(&self, y: f64) -> f64 {
        H - BOTTOM - y / self.ymax * (H - BOTTOM - TOP)
    }

    /// The image's start: its title, a grid of five steps on each axis with their values
    /// (`y_decimals` after the point on the y axis), and the axis labels.
    pub fn open(&self, title: &str, x_label: &str, y_label: &str, y_decimals: usize) -> String {
        let (w, middle) = (self.width, (self.width - self.right + LEFT) / 2.0);
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{middle}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{title}</text>\n"
        );
        for i in 0..=5 {
            let (x, y) = (self.xmax * i as f64 / 5.0, self.ymax * i as f64 / 5.0);
            let _ = writeln!(
                s,
                "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#ddd\"/><text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4:.0}</text>",
                self.px(x), TOP, H - BOTTOM, H - BOTTOM + 16.0, x
            );
            let _ = writeln!(
                s,
                "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4}\" text-anchor=\"end\">{5:.6$}</text>",
                LEFT, self.py(y), w - self.right, LEFT - 6.0, self.py(y) + 4.0, y, y_decimals
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{middle}\" y=\"{}\" text-anchor=\"middle\">{x_label}</text>",
            H - 12.0
        );
        let _ = writeln!(
            s,
            "<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {0})\" text-anchor=\"middle\">{y_label}</text>",
            H / 2.0
        );
        s
    }
}

/// A throughput (x) versus p50 latency (y) plot of one workload: one series per upright setting
/// and one for NO-REP, a point per client count, labelled with it.
pub fn to_svg(points: &[Point], workload: Workload) -> String {
    let mut series: Vec<Series> = Vec::new();
    let mut add = |name: String, x: f64, y: f64, c: u32| match series.iter_mut().find(|(n, _)| *n == name) {
        Some((_, v)) => v.push((x, y, c)),
        None => series.push((name, vec![(x, y, c)])),
    };
    let mut baseline_clients = Vec::new();
    for p in points.iter().filter(|p| p.workload == workload) {
        let name = format!(
            "upright {} u={} r={} batch={} fsync={}",
            protocol_label(p),
            p.u,
            p.r,
            p.batch_size,
            fsync_name(p.fsync)
        );
        add(name, p.upright.throughput, p.upright.p50_us as f64 / 1000.0, p.clients);
        if let Some(b) = &p.baseline {
            // One NO-REP point per client count (each protocol's points have their own).
            if !baseline_clients.contains(&p.clients) {
                baseline_clients.push(p.clients);
                add("NO-REP".into(), b.throughput, b.p50_us as f64 / 1000.0, p.clients);
            }
        }
    }
    let all = series.iter().flat_map(|(_, v)| v.iter());
    let (xmax, ymax) = all.fold((0f64, 0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let (xmax, ymax) = (nice_max(xmax), nice_max(ymax));
    let plot = Plot {
        width: W,
        right: RIGHT,
        xmax,
        ymax,
    };
    let (px, py) = (|x| plot.px(x), |y| plot.py(y));
    let mut s = plot.open(
        &format!(
            "Workload {}: throughput vs median latency (points: client counts)",
            workload.name()
        ),
        "throughput (ops/s)",
        "p50 latency (ms)",
        2,
    );
    let colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
    for (i, (name, pts)) in series.iter().enumerate() {
        let colour = if name == "NO-REP" {
            "#777"
        } else {
            colours[i % colours.len()]
        };
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y, _)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            path.join(" ")
        );
        for (x, y, c) in pts {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">{c}</text>",
                px(*x), py(*y), px(*x) + 6.0, py(*y) - 6.0
            );
        }
        let ly = TOP + 14.0 + 16.0 * i as f64;
        let _ = writeln!(
            s,
            "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{colour}\"/><text x=\"{}\" y=\"{}\">{name}</text>",
            LEFT + 10.0, ly - 9.0, LEFT + 26.0, ly
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The protocol as results name it: `pbft`, `pbft+selective` under selective execution,
/// `pbft+separate` with separate stages (`pbft+separate+selective` with both).
pub fn protocol_label(p: &Point) -> String {
    let mut label = p.protocol.name().to_string();
    if p.separate_stages {
        label.push_str("+separate");
    }
    if p.selective {
        label.push_str("+selective");
    }
    label
}
