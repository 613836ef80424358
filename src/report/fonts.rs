//! The one font every figure uses, read from the system at run time.
//!
//! plotters' `ab_glyph` backend draws text from font bytes registered by the program, so no C
//! library (fontconfig, freetype) is linked. We register one sans-serif TrueType font under the
//! family name [`FONT_FAMILY`] the first time a figure is drawn: `$RANKWISE_FONT` if set, else
//! the first of a few standard paths (DejaVu Sans, Liberation Sans, Noto Sans, Arial), else
//! what `fc-match sans-serif` names.

use crate::error::{Error, Result};
use plotters::style::FontStyle;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Family name under which the font is registered (plotters' default family).
pub const FONT_FAMILY: &str = "sans-serif";

/// Environment variable naming a `.ttf`/`.otf` file to use instead of the system's.
pub const FONT_ENV: &str = "RANKWISE_FONT";

const CANDIDATES: [&str; 8] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers the figure font once per process; later calls return the first outcome.
///
/// Errors (every time, with the same message) when no usable font is found, naming the paths
/// tried and how to fix it.
pub fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    match REGISTERED.get_or_init(register) {
        Ok(_) => Ok(()),
        Err(msg) => Err(Error::invalid("font", msg.clone())),
    }
}

fn register() -> std::result::Result<PathBuf, String> {
    let mut tried = Vec::new();
    let from_env = std::env::var_os(FONT_ENV).map(PathBuf::from);
    let from_fc = || {
        std::process::Command::new("fc-match")
            .args(["--format=%{file}", "sans-serif"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
    };
    let candidates = from_env
        .into_iter()
        .chain(CANDIDATES.iter().map(PathBuf::from))
        .chain(std::iter::once_with(from_fc).flatten());
    for path in candidates {
        match try_register(&path) {
            Ok(()) => return Ok(path),
            Err(why) => tried.push(format!("{} ({why})", path.display())),
        }
    }
    Err(format!(
        "no font for figures; tried {}. Install one (e.g. `apt-get install fonts-dejavu-core`) \
         or set {FONT_ENV} to a .ttf file",
        tried.join(", ")
    ))
}

fn try_register(path: &Path) -> std::result::Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    // plotters keeps fonts for the life of the process and wants `'static` bytes; this runs
    // once per process, so the one leaked buffer is the font's cache.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, bytes)
        .map_err(|_| "not a TrueType/OpenType font".to_string())
}
