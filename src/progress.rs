//! Progress of long tasks on stderr, whether or not stderr is a terminal: an animated bar on a
//! terminal (indicatif), plain lines in a log file or a batch job — a user who redirects
//! `rankwise train 2> log` still sees how far a run is and when it will end.
//!
//! In line mode a task prints nothing until it has run for [`LINE_EVERY`], then one line per
//! [`LINE_EVERY`] and one when it ends: short tasks stay silent, long ones are never silent for
//! more than that.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest silence of a long task in line mode. Ten seconds: often enough to see that a job
/// lives, rare enough that an hour's run writes a few hundred lines, not thousands.
pub const LINE_EVERY: Duration = Duration::from_secs(10);

/// The line interval: [`LINE_EVERY`], or `$RANKWISE_PROGRESS_SECONDS` when it holds a number of
/// seconds ≥ 0 (0: a line at every step, e.g. to see a short task's lines in a test or a log).
fn line_every() -> Duration {
    std::env::var("RANKWISE_PROGRESS_SECONDS")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(LINE_EVERY)
}

/// Where the plain lines go (stderr; a buffer in tests).
type Sink = Box<dyn Write + Send>;

/// The state of line mode.
struct Lines {
    sink: Sink,
    every: Duration,
    started: Instant,
    last: Instant,
    done: u64,
    printed: bool,
    message: String,
}

/// The progress of one task of `total` units.
pub struct Progress {
    bar: Option<ProgressBar>,
    lines: Option<Mutex<Lines>>,
    total: u64,
    unit: &'static str,
    what: String,
}

impl Progress {
    /// Progress of `what` over `total` `unit`s (e.g. `images`, `queries`) on stderr: a bar on a
    /// terminal, lines otherwise; nothing at all unless `show`.
    pub fn new(total: usize, unit: &'static str, what: &str, show: bool) -> Progress {
        if show && std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total as u64);
            bar.set_style(
                ProgressStyle::with_template(&format!(
                    "{{msg}} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} {unit} \
                     ({{per_sec}}, eta {{eta}})"
                ))
                .expect("static progress template"),
            );
            bar.set_message(what.to_string());
            return Progress {
                bar: Some(bar),
                lines: None,
                total: total as u64,
                unit,
                what: what.to_string(),
            };
        }
        let sink: Option<Sink> = show.then(|| Box::new(std::io::stderr()) as Sink);
        Progress::lines(total, unit, what, sink, line_every())
    }

    /// Line mode into `sink` (nothing when `None`) with a line at most every `every`.
    fn lines(
        total: usize,
        unit: &'static str,
        what: &str,
        sink: Option<Sink>,
        every: Duration,
    ) -> Progress {
        let now = Instant::now();
        Progress {
            bar: None,
            lines: sink.map(|sink| {
                Mutex::new(Lines {
                    sink,
                    every,
                    started: now,
                    last: now,
                    done: 0,
                    printed: false,
                    message: what.to_string(),
                })
            }),
            total: total as u64,
            unit,
            what: what.to_string(),
        }
    }

    /// `n` more units done.
    pub fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
        if let Some(lines) = &self.lines {
            let mut l = lines.lock().unwrap_or_else(|p| p.into_inner());
            l.done += n;
            let now = Instant::now();
            if now.duration_since(l.last) >= l.every && l.done < self.total {
                l.last = now;
                l.printed = true;
                let line = self.line(&l, now, false);
                let _ = writeln!(l.sink, "{line}");
            }
        }
    }

    /// The text shown before the counts (`epoch 3 loss 0.4123`); the task's name by default.
    pub fn set_message(&self, message: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(message.clone());
        }
        if let Some(lines) = &self.lines {
            lines.lock().unwrap_or_else(|p| p.into_inner()).message = message;
        }
    }

    /// The task is over: the bar is cleared; in line mode a task that ran for the line interval
    /// (or printed a line) prints a last one with its total time.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Some(lines) = &self.lines {
            let mut l = lines.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            if l.printed || now.duration_since(l.started) >= l.every {
                let line = self.line(&l, now, true);
                let _ = writeln!(l.sink, "{line}");
                l.printed = false;
            }
        }
    }

    /// `evaluating: 12000/60502 queries (19.8%), 8 s, 1500 queries/s, ETA 32 s`.
    fn line(&self, l: &Lines, now: Instant, finished: bool) -> String {
        let elapsed = now.duration_since(l.started).as_secs_f64();
        let rate = l.done as f64 / elapsed.max(1e-9);
        let head = format!(
            "{}: {}/{} {} ({:.1}%), {}, {:.0} {}/s",
            if l.message.is_empty() {
                &self.what
            } else {
                &l.message
            },
            l.done,
            self.total,
            self.unit,
            100.0 * l.done as f64 / (self.total.max(1)) as f64,
            seconds(elapsed),
            rate,
            self.unit
        );
        if finished {
            format!("{head}, done")
        } else {
            let left = self.total.saturating_sub(l.done) as f64 / rate.max(1e-9);
            format!("{head}, ETA {}", seconds(left))
        }
    }
}

/// `42 s`, `3 min 05 s`, `2 h 07 min`.
pub fn seconds(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..=99 => format!("{s} s"),
        100..=5999 => format!("{} min {:02} s", s / 60, s % 60),
        _ => format!("{} h {:02} min", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A sink the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn lines_only_for_long_tasks_with_counts_and_eta() {
        // A task shorter than the interval prints nothing.
        let sink = Shared::default();
        let p = Progress::lines(
            10,
            "queries",
            "evaluating",
            Some(Box::new(sink.clone())),
            Duration::from_secs(3600),
        );
        p.inc(5);
        p.inc(5);
        p.finish();
        assert_eq!(sink.text(), "");
        // With a zero interval every step but the last prints a line, and the end one more.
        let sink = Shared::default();
        let p = Progress::lines(
            4,
            "images",
            "embedding",
            Some(Box::new(sink.clone())),
            Duration::ZERO,
        );
        p.inc(1);
        p.set_message("epoch 2 loss 0.5000".into());
        p.inc(1);
        p.inc(2);
        p.finish();
        let text = sink.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].starts_with("embedding: 1/4 images (25.0%), ") && lines[0].contains("ETA"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("epoch 2 loss 0.5000: 2/4 images (50.0%)"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("epoch 2 loss 0.5000: 4/4 images (100.0%)"),
            "{text}"
        );
        assert!(lines[2].ends_with(", done"), "{text}");
        // Hidden: nothing anywhere.
        let p = Progress::new(3, "images", "x", false);
        p.inc(3);
        p.finish();
        assert!(p.bar.is_none() && p.lines.is_none());
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(seconds(4.4), "4 s");
        assert_eq!(seconds(185.0), "3 min 05 s");
        assert_eq!(seconds(7620.0), "2 h 07 min");
        assert_eq!(seconds(-1.0), "0 s");
    }
}
