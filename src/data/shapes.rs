//! The embedded default dataset: procedurally generated images of coloured shapes with a
//! three-level class hierarchy, so that every experiment runs on a CPU with no download.
//!
//! **Hierarchy** (labels finest first, as everywhere in the crate):
//! * level 2, *family*: the shape ([`Family`]: disk, square, triangle, star, cross, arrow, heart,
//!   crescent);
//! * level 1, *variant*: a structural modification of the family ([`Pattern`]: solid, outline,
//!   holed, striped, two-tone, checkered); a variant id is `family · V + pattern`;
//! * level 0, *fine class*: a variant with a specific colour and proportion — hue
//!   `frac(0.05 + 0.618034 k)` (golden-ratio spacing) and aspect ratio 1 for even `k`, 0.6 for
//!   odd `k`, where `k` is the class's rank in its variant. A fine id is `variant · F + k`.
//!
//! No single cue gives the fine class: every variant uses the same hues and aspects, and every
//! family the same patterns, so a model must combine shape, pattern, colour and proportion.
//!
//! **Deeper hierarchies** ([`ShapesConfig::levels`] 4 to 6; the images are the same, only the
//! label columns change), for the experiments of HAPPIER on iNat-full's seven levels. Each level
//! past the third adds, in turn:
//! * level 4 — a *form* between the fine class and the variant: the variant's fine classes of
//!   one aspect (`variant · 2 + k mod 2`), a visual grouping (same shape, pattern and
//!   proportion; the hue differs);
//! * level 5 — an *order* above the family: the families in pairs (`family / 2`: disk and
//!   square, triangle and star, cross and arrow, heart and crescent);
//! * level 6 — a *class* above the order: the families in fours (`family / 4`).
//!
//! Labels stay finest first: `[fine, form, variant, family, order, class]` at six levels,
//! `[fine, variant, family]` at three.
//!
//! **Nuisance** ([`Nuisance`]) varies within a class: rotation, scale, translation, colour
//! jitter (hue, saturation, value), a random low-saturation background with a brightness
//! gradient, small distractor blobs and bars behind the object, and Gaussian pixel noise.
//!
//! **Determinism**: image `j` of fine class `c` is a pure function of `(config, c, j)`; its random
//! draws come from stream `c · 2³² + j` of a ChaCha8 generator seeded with `config.seed`, so any
//! image can be rendered alone, in any order, in parallel, with the same bytes. (Across platforms
//! the last bits may differ where the platform's `f32` `sin`, `cos` and `sqrt` differ.)
//!
//! **Values**: RGB in `[0, 1]`, `3 × S × S`, channel first (torchvision `ToTensor` convention).
//! Objects are anti-aliased from their signed distance functions.

use super::image_set::ImageSet;
use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::samplers::stream_rng;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use std::f32::consts::{PI, TAU};

/// Shape families (the coarsest level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// A disk (an ellipse for the elongated classes).
    Disk,
    /// A square.
    Square,
    /// An equilateral triangle.
    Triangle,
    /// A five-pointed star.
    Star,
    /// A plus-shaped cross.
    Cross,
    /// An arrow.
    Arrow,
    /// A heart.
    Heart,
    /// A crescent.
    Crescent,
}

/// All families, in id order.
pub const FAMILIES: [Family; 8] = [
    Family::Disk,
    Family::Square,
    Family::Triangle,
    Family::Star,
    Family::Cross,
    Family::Arrow,
    Family::Heart,
    Family::Crescent,
];

/// Structural modifications of a family (the middle level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Filled with the primary colour.
    Solid,
    /// Only a band along the contour.
    Outline,
    /// Filled, with a round hole showing the background.
    Holed,
    /// Filled, with dark parallel stripes.
    Striped,
    /// One half primary, the other half dark.
    TwoTone,
    /// Filled with a primary / dark checkerboard.
    Checkered,
}

/// All patterns, in id order.
pub const PATTERNS: [Pattern; 6] = [
    Pattern::Solid,
    Pattern::Outline,
    Pattern::Holed,
    Pattern::Striped,
    Pattern::TwoTone,
    Pattern::Checkered,
];

/// Largest number of fine classes per variant: beyond it, hues of the same aspect get closer
/// than the hue jitter can keep apart.
pub const MAX_FINE_PER_VARIANT: usize = 16;

/// Within-class variation. Positions and sizes are in units of half the image side (the image
/// spans `[-1, 1]²`); colours are HSV components in `[0, 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Nuisance {
    /// Rotation drawn uniformly in `[-max_rotation, max_rotation]` radians (at most π: a full
    /// turn).
    pub max_rotation: f32,
    /// Object radius drawn uniformly in this range.
    pub scale: (f32, f32),
    /// Object centre drawn uniformly in `[-max_shift, max_shift]²`.
    pub max_shift: f32,
    /// Hue offset drawn uniformly in `[-hue_jitter, hue_jitter]` (in turns).
    pub hue_jitter: f32,
    /// Object saturation range.
    pub saturation: (f32, f32),
    /// Object value (brightness) range.
    pub value: (f32, f32),
    /// Background saturation is drawn in `[0, background_saturation]`.
    pub background_saturation: f32,
    /// Background value range.
    pub background_value: (f32, f32),
    /// Largest brightness change across the image from the background gradient.
    pub gradient: f32,
    /// Number of distractors drawn uniformly in `0..=max_clutter`.
    pub max_clutter: usize,
    /// Standard deviation of the additive Gaussian pixel noise (values are then clamped).
    pub noise_std: f32,
}

impl Default for Nuisance {
    fn default() -> Self {
        Nuisance {
            max_rotation: PI,
            scale: (0.5, 0.75),
            max_shift: 0.2,
            hue_jitter: 0.025,
            saturation: (0.65, 1.0),
            value: (0.6, 1.0),
            background_saturation: 0.35,
            background_value: (0.15, 0.85),
            gradient: 0.3,
            max_clutter: 3,
            noise_std: 0.04,
        }
    }
}

/// Configuration of the embedded dataset. `Default` gives 8 families × 4 variants × 8 fine
/// classes = 256 fine classes × 30 images of 3 × 32 × 32.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapesConfig {
    /// Seed of every random draw.
    pub seed: u64,
    /// Number of families, `1..=8` (the first ones of [`FAMILIES`]).
    pub families: usize,
    /// Variants per family, `1..=6` (the first ones of [`PATTERNS`]).
    pub variants_per_family: usize,
    /// Fine classes per variant, `1..=16`.
    pub fine_per_variant: usize,
    /// Images per fine class.
    pub images_per_class: usize,
    /// Image side in pixels, `8..=256`.
    pub image_size: usize,
    /// Label levels, `3..=6`: 3 = fine class, variant, family; more add a form, an order and a
    /// class (module documentation). The images do not depend on it.
    pub levels: usize,
    /// Within-class variation.
    pub nuisance: Nuisance,
}

/// The fewest and the most label levels of the embedded dataset.
pub const LEVELS: std::ops::RangeInclusive<usize> = 3..=6;

impl Default for ShapesConfig {
    fn default() -> Self {
        ShapesConfig {
            seed: 0,
            families: 8,
            variants_per_family: 4,
            fine_per_variant: 8,
            images_per_class: 30,
            image_size: 32,
            levels: 3,
            nuisance: Nuisance::default(),
        }
    }
}

/// The attributes of one fine class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapeClass {
    /// Fine class id (level 0).
    pub fine: ClassId,
    /// Variant id (level 1).
    pub variant: ClassId,
    /// Family id (level 2).
    pub family: ClassId,
    /// The shape.
    pub shape: Family,
    /// The structural modification.
    pub pattern: Pattern,
    /// Base hue, in turns.
    pub hue: f32,
    /// Height / width of the shape before rotation (1 or 0.6).
    pub aspect: f32,
}

impl ShapesConfig {
    /// Errors naming the first field out of range.
    pub fn validate(&self) -> Result<()> {
        let in_range = |field: &str, v: usize, lo: usize, hi: usize| -> Result<()> {
            if v < lo || v > hi {
                return Err(Error::invalid(
                    field,
                    format!("must be in {lo}..={hi}, got {v}"),
                ));
            }
            Ok(())
        };
        in_range("families", self.families, 1, FAMILIES.len())?;
        in_range(
            "variants_per_family",
            self.variants_per_family,
            1,
            PATTERNS.len(),
        )?;
        in_range(
            "fine_per_variant",
            self.fine_per_variant,
            1,
            MAX_FINE_PER_VARIANT,
        )?;
        in_range("images_per_class", self.images_per_class, 1, 1 << 31)?;
        in_range("image_size", self.image_size, 8, 256)?;
        in_range("levels", self.levels, *LEVELS.start(), *LEVELS.end())?;
        self.nuisance.validate()
    }

    /// Number of fine classes.
    pub fn num_classes(&self) -> usize {
        self.families * self.variants_per_family * self.fine_per_variant
    }

    /// Number of images.
    pub fn num_images(&self) -> usize {
        self.num_classes() * self.images_per_class
    }

    /// The attributes of fine class `fine` (`0..num_classes`).
    pub fn class(&self, fine: usize) -> Result<ShapeClass> {
        self.validate()?;
        if fine >= self.num_classes() {
            return Err(Error::invalid(
                "class",
                format!(
                    "{fine} out of range for {} fine classes",
                    self.num_classes()
                ),
            ));
        }
        Ok(self.class_unchecked(fine))
    }

    fn class_unchecked(&self, fine: usize) -> ShapeClass {
        let variant = fine / self.fine_per_variant;
        let family = variant / self.variants_per_family;
        let k = fine % self.fine_per_variant;
        ShapeClass {
            fine: fine as ClassId,
            variant: variant as ClassId,
            family: family as ClassId,
            shape: FAMILIES[family],
            pattern: PATTERNS[variant % self.variants_per_family],
            hue: (0.05 + 0.618_034 * k as f32).fract(),
            aspect: if k.is_multiple_of(2) { 1.0 } else { 0.6 },
        }
    }

    /// The labels of [`ShapesConfig::generate`]: one row per image, images class after class;
    /// `[fine, variant, family]` at three levels, `[fine, form, variant, family, order, class]`
    /// at six ([`ShapesConfig::label_row`]).
    pub fn labels(&self) -> Result<Labels> {
        self.validate()?;
        let mut data = Vec::with_capacity(self.num_images() * self.levels);
        for c in 0..self.num_classes() {
            let row = self.label_row(&self.class_unchecked(c));
            for _ in 0..self.images_per_class {
                data.extend_from_slice(&row);
            }
        }
        Labels::from_flat(self.num_images(), self.levels, data)
    }

    /// The label row of one class, finest first, [`ShapesConfig::levels`] long.
    pub fn label_row(&self, class: &ShapeClass) -> Vec<ClassId> {
        let k = class.fine as usize % self.fine_per_variant;
        let form = (class.variant as usize * 2 + k % 2) as ClassId;
        let mut row = vec![class.fine];
        if self.levels >= 4 {
            row.push(form);
        }
        row.extend([class.variant, class.family]);
        if self.levels >= 5 {
            row.push(class.family / 2);
        }
        if self.levels >= 6 {
            row.push(class.family / 4);
        }
        row
    }

    /// Image `index` of fine class `fine`: `3 × S × S` values in `[0, 1]`.
    pub fn render(&self, fine: usize, index: usize) -> Result<Vec<f32>> {
        let class = self.class(fine)?;
        if index >= self.images_per_class {
            return Err(Error::invalid(
                "index",
                format!(
                    "{index} out of range for {} images per class",
                    self.images_per_class
                ),
            ));
        }
        let mut out = vec![0.0; 3 * self.image_size * self.image_size];
        self.render_into(&class, index, &mut out);
        Ok(out)
    }

    /// Every image, class after class (image `i` is image `i mod images_per_class` of class
    /// `i / images_per_class`), rendered in parallel, with [`ShapesConfig::labels`].
    pub fn generate(&self) -> Result<ImageSet> {
        let labels = self.labels()?;
        let s = self.image_size;
        let per_image = 3 * s * s;
        let mut pixels = vec![0.0f32; self.num_images() * per_image];
        pixels
            .par_chunks_mut(per_image)
            .enumerate()
            .for_each(|(i, out)| {
                let class = self.class_unchecked(i / self.images_per_class);
                self.render_into(&class, i % self.images_per_class, out);
            });
        ImageSet::new(pixels, labels, 3, s, s)
    }

    fn render_into(&self, class: &ShapeClass, index: usize, out: &mut [f32]) {
        let stream = ((class.fine as u64) << 32) | index as u64;
        let mut rng = stream_rng(self.seed, stream);
        let scene = Scene::draw(class, &self.nuisance, &mut rng);
        let s = self.image_size;
        let px = 2.0 / s as f32;
        let noise = Normal::new(0.0f32, self.nuisance.noise_std)
            .expect("noise_std is validated finite and non-negative");
        for y in 0..s {
            for x in 0..s {
                let p = [(x as f32 + 0.5) * px - 1.0, (y as f32 + 0.5) * px - 1.0];
                let rgb = scene.shade(p, px);
                for (ch, v) in rgb.into_iter().enumerate() {
                    let n = if self.nuisance.noise_std > 0.0 {
                        noise.sample(&mut rng)
                    } else {
                        0.0
                    };
                    out[ch * s * s + y * s + x] = (v + n).clamp(0.0, 1.0);
                }
            }
        }
    }
}

impl Nuisance {
    /// Errors naming the first field that is not finite or out of range.
    pub fn validate(&self) -> Result<()> {
        let unit = |field: &str, v: f32| -> Result<()> {
            if !(0.0..=1.0).contains(&v) {
                return Err(Error::invalid(field, format!("must be in [0, 1], got {v}")));
            }
            Ok(())
        };
        let range = |field: &str, (lo, hi): (f32, f32), max: f32| -> Result<()> {
            if !(lo.is_finite() && hi.is_finite() && 0.0 <= lo && lo <= hi && hi <= max) {
                return Err(Error::invalid(
                    field,
                    format!("must satisfy 0 ≤ low ≤ high ≤ {max}, got ({lo}, {hi})"),
                ));
            }
            Ok(())
        };
        if !(0.0..=PI).contains(&self.max_rotation) {
            return Err(Error::invalid(
                "max_rotation",
                format!("must be in [0, π] radians, got {}", self.max_rotation),
            ));
        }
        range("scale", self.scale, 1.0)?;
        if self.scale.0 <= 0.0 {
            return Err(Error::invalid("scale", "the smallest radius must be > 0"));
        }
        unit("max_shift", self.max_shift)?;
        unit("hue_jitter", self.hue_jitter)?;
        range("saturation", self.saturation, 1.0)?;
        range("value", self.value, 1.0)?;
        unit("background_saturation", self.background_saturation)?;
        range("background_value", self.background_value, 1.0)?;
        unit("gradient", self.gradient)?;
        if self.max_clutter > 64 {
            return Err(Error::invalid(
                "max_clutter",
                format!("must be ≤ 64, got {}", self.max_clutter),
            ));
        }
        if !(self.noise_std.is_finite() && self.noise_std >= 0.0) {
            return Err(Error::invalid(
                "noise_std",
                format!("must be finite and ≥ 0, got {}", self.noise_std),
            ));
        }
        Ok(())
    }
}

type V2 = [f32; 2];

fn sub(a: V2, b: V2) -> V2 {
    [a[0] - b[0], a[1] - b[1]]
}

fn dot(a: V2, b: V2) -> f32 {
    a[0] * b[0] + a[1] * b[1]
}

fn len(a: V2) -> f32 {
    dot(a, a).sqrt()
}

fn rotate(p: V2, angle: f32) -> V2 {
    let (s, c) = angle.sin_cos();
    [c * p[0] - s * p[1], s * p[0] + c * p[1]]
}

/// Signed distance to a circle (negative inside).
fn sd_circle(p: V2, centre: V2, r: f32) -> f32 {
    len(sub(p, centre)) - r
}

/// Signed distance to an axis-aligned box of half-sizes `b` centred at the origin.
fn sd_box(p: V2, b: V2) -> f32 {
    let d = [p[0].abs() - b[0], p[1].abs() - b[1]];
    len([d[0].max(0.0), d[1].max(0.0)]) + d[0].max(d[1]).min(0.0)
}

/// Signed distance to a simple polygon (exact; winding-number sign), after Quílez.
fn sd_polygon(p: V2, v: &[V2]) -> f32 {
    let mut d = dot(sub(p, v[0]), sub(p, v[0]));
    let mut inside = false;
    let mut j = v.len() - 1;
    for i in 0..v.len() {
        let e = sub(v[j], v[i]);
        let w = sub(p, v[i]);
        let t = (dot(w, e) / dot(e, e)).clamp(0.0, 1.0);
        let b = [w[0] - e[0] * t, w[1] - e[1] * t];
        d = d.min(dot(b, b));
        let c = [p[1] >= v[i][1], p[1] < v[j][1], e[0] * w[1] > e[1] * w[0]];
        if c.iter().all(|&x| x) || c.iter().all(|&x| !x) {
            inside = !inside;
        }
        j = i;
    }
    if inside {
        -d.sqrt()
    } else {
        d.sqrt()
    }
}

/// Signed distance to Quílez's heart (exact): tip at the origin, lobes up to `y ≈ 1.1`.
fn sd_heart(p: V2) -> f32 {
    let p = [p[0].abs(), p[1]];
    if p[0] + p[1] > 1.0 {
        return len(sub(p, [0.25, 0.75])) - std::f32::consts::SQRT_2 / 4.0;
    }
    let top = sub(p, [0.0, 1.0]);
    let m = 0.5 * (p[0] + p[1]).max(0.0);
    let diagonal = sub(p, [m, m]);
    let dist = dot(top, top).min(dot(diagonal, diagonal)).sqrt();
    if p[0] > p[1] {
        dist
    } else {
        -dist
    }
}

/// Regular star or polygon: `n` vertices alternating radii `r_outer`, `r_inner` (equal radii give
/// a regular polygon), first vertex pointing up.
fn star_vertices(points: usize, r_outer: f32, r_inner: f32) -> Vec<V2> {
    (0..2 * points)
        .map(|k| {
            let r = if k % 2 == 0 { r_outer } else { r_inner };
            let a = PI / 2.0 + PI * k as f32 / points as f32;
            [r * a.cos(), r * a.sin()]
        })
        .collect()
}

/// The geometry of a family in its local frame (unit radius), with the centre and radius of the
/// hole of [`Pattern::Holed`] placed where the shape is thick enough.
struct Shape {
    family: Family,
    polygon: Vec<V2>,
    hole: (V2, f32),
}

impl Shape {
    fn new(family: Family) -> Self {
        let (polygon, hole) = match family {
            Family::Disk => (vec![], ([0.0, 0.0], 0.4)),
            Family::Square => (vec![], ([0.0, 0.0], 0.4)),
            Family::Triangle => {
                // Equilateral triangle of circumradius 1.15: the three points of a 3-star.
                let v = star_vertices(3, 1.15, 0.575);
                (v.into_iter().step_by(2).collect(), ([0.0, 0.0], 0.3))
            }
            Family::Star => (star_vertices(5, 1.1, 0.48), ([0.0, 0.0], 0.25)),
            Family::Cross => {
                let (w, l) = (0.34, 1.0);
                (
                    vec![
                        [w, w],
                        [w, l],
                        [-w, l],
                        [-w, w],
                        [-l, w],
                        [-l, -w],
                        [-w, -w],
                        [-w, -l],
                        [w, -l],
                        [w, -w],
                        [l, -w],
                        [l, w],
                    ],
                    ([0.0, 0.0], 0.26),
                )
            }
            Family::Arrow => (
                vec![
                    [-1.0, -0.32],
                    [0.05, -0.32],
                    [0.05, -0.8],
                    [1.0, 0.0],
                    [0.05, 0.8],
                    [0.05, 0.32],
                    [-1.0, 0.32],
                ],
                ([0.1, 0.0], 0.22),
            ),
            Family::Heart => (vec![], ([0.0, 0.0], 0.3)),
            Family::Crescent => (vec![], ([-0.62, 0.0], 0.2)),
        };
        Shape {
            family,
            polygon,
            hole,
        }
    }

    /// Signed distance in the local frame.
    fn sdf(&self, q: V2) -> f32 {
        match self.family {
            Family::Disk => sd_circle(q, [0.0, 0.0], 1.0),
            Family::Square => sd_box(q, [0.82, 0.82]),
            Family::Triangle | Family::Star | Family::Cross | Family::Arrow => {
                sd_polygon(q, &self.polygon)
            }
            // Quílez's heart spans x ∈ [−0.6, 0.6], y ∈ [0, 1.1]: centre and scale it to the
            // unit radius of the other families.
            Family::Heart => sd_heart([q[0] * 0.6, q[1] * 0.6 + 0.5]) / 0.6,
            Family::Crescent => sd_circle(q, [0.0, 0.0], 1.0).max(-sd_circle(q, [0.55, 0.0], 0.8)),
        }
    }
}

/// Coverage of a pixel of size `px` by the region `d < 0` (a linear ramp over one pixel).
fn coverage(d: f32, px: f32) -> f32 {
    (0.5 - d / px).clamp(0.0, 1.0)
}

/// Anti-aliased square wave of period `period` along `u`: −1 in the middle half of each period,
/// +1 in the outer half, linear over one pixel `px` at the edges.
fn square_wave(u: f32, period: f32, px: f32) -> f32 {
    let phase = (u / period).rem_euclid(1.0);
    (((phase - 0.5).abs() - 0.25) * period / px * 2.0).clamp(-1.0, 1.0)
}

fn mix(a: [f32; 3], b: [f32; 3], t: f32) -> [f32; 3] {
    [
        a[0] + (b[0] - a[0]) * t,
        a[1] + (b[1] - a[1]) * t,
        a[2] + (b[2] - a[2]) * t,
    ]
}

/// HSV (all in `[0, 1]`, hue in turns) to RGB.
fn hsv_to_rgb(h: f32, s: f32, v: f32) -> [f32; 3] {
    let h6 = h.rem_euclid(1.0) * 6.0;
    let sector = h6.floor();
    let f = h6 - sector;
    let (p, q, t) = (v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f)));
    match sector as u32 {
        0 => [v, t, p],
        1 => [q, v, p],
        2 => [p, v, t],
        3 => [p, q, v],
        4 => [t, p, v],
        _ => [v, p, q],
    }
}

/// A distractor behind the object: a disk or a bar.
struct Clutter {
    centre: V2,
    angle: f32,
    size: f32,
    bar: bool,
    rgb: [f32; 3],
}

impl Clutter {
    fn sdf(&self, p: V2) -> f32 {
        let q = rotate(sub(p, self.centre), -self.angle);
        if self.bar {
            sd_box(q, [self.size, self.size * 0.3])
        } else {
            len(q) - self.size * 0.6
        }
    }
}

/// Every random quantity of one image, drawn in a fixed order.
struct Scene {
    background: [f32; 3],
    gradient_dir: V2,
    gradient: f32,
    clutter: Vec<Clutter>,
    shape: Shape,
    pattern: Pattern,
    angle: f32,
    radius: f32,
    aspect: f32,
    centre: V2,
    primary: [f32; 3],
    secondary: [f32; 3],
    pattern_angle: f32,
}

impl Scene {
    fn draw(class: &ShapeClass, n: &Nuisance, rng: &mut ChaCha8Rng) -> Scene {
        let background = hsv_to_rgb(
            rng.random::<f32>(),
            rng.random_range(0.0..=n.background_saturation),
            rng.random_range(n.background_value.0..=n.background_value.1),
        );
        let gradient_dir = rotate([1.0, 0.0], rng.random::<f32>() * TAU);
        let gradient = rng.random_range(-n.gradient..=n.gradient) / 2.0;
        let clutter = (0..rng.random_range(0..=n.max_clutter))
            .map(|_| Clutter {
                centre: [rng.random_range(-1.0..=1.0), rng.random_range(-1.0..=1.0)],
                angle: rng.random::<f32>() * PI,
                size: rng.random_range(0.1..=0.22),
                bar: rng.random::<bool>(),
                rgb: hsv_to_rgb(
                    rng.random::<f32>(),
                    rng.random::<f32>(),
                    rng.random_range(0.2..=1.0),
                ),
            })
            .collect();
        let angle = rng.random_range(-n.max_rotation..=n.max_rotation);
        let radius = rng.random_range(n.scale.0..=n.scale.1);
        let centre = [
            rng.random_range(-n.max_shift..=n.max_shift),
            rng.random_range(-n.max_shift..=n.max_shift),
        ];
        let hue = class.hue + rng.random_range(-n.hue_jitter..=n.hue_jitter);
        let sat = rng.random_range(n.saturation.0..=n.saturation.1);
        let val = rng.random_range(n.value.0..=n.value.1);
        Scene {
            background,
            gradient_dir,
            gradient,
            clutter,
            shape: Shape::new(class.shape),
            pattern: class.pattern,
            angle,
            radius,
            aspect: class.aspect,
            centre,
            primary: hsv_to_rgb(hue, sat, val),
            // The pattern colour: the same hue, dark, so that the pattern is a structure of the
            // object and not a second colour cue.
            secondary: hsv_to_rgb(hue, sat, val * 0.3),
            // Stripes of a few classes run along the shape's axis, others across it: this tilt is
            // part of the pose, so draw it with the pose.
            pattern_angle: rng.random_range(-0.3..=0.3),
        }
    }

    /// Colour of the pixel centred at `p` (pixel size `px`), before noise.
    fn shade(&self, p: V2, px: f32) -> [f32; 3] {
        let t = dot(p, self.gradient_dir) * self.gradient;
        let mut rgb = self.background.map(|c| c + t);
        for c in &self.clutter {
            rgb = mix(rgb, c.rgb, coverage(c.sdf(p), px));
        }
        let rel = sub(p, self.centre);
        // The object fits in 1.2 radii (the star's and triangle's tips); skip far pixels.
        if len(rel) > 1.2 * self.radius + 2.0 * px {
            return rgb;
        }
        let local = rotate(rel, -self.angle);
        let q = [
            local[0] / self.radius,
            local[1] / (self.radius * self.aspect),
        ];
        // Pixel size in local units (the geometric mean of the two axis scales).
        let pxl = px / (self.radius * self.aspect.sqrt());
        let d = self.shape.sdf(q);
        let (alpha, dark) = match self.pattern {
            Pattern::Solid => (coverage(d, pxl), 0.0),
            Pattern::Outline => (coverage(d.max(-d - 0.28), pxl), 0.0),
            Pattern::Holed => {
                let (c, r) = self.shape.hole;
                (coverage(d.max(-sd_circle(q, c, r)), pxl), 0.0)
            }
            Pattern::Striped => {
                let u = rotate(q, self.pattern_angle)[0];
                (coverage(d, pxl), 0.5 - 0.5 * square_wave(u, 0.6, pxl))
            }
            Pattern::TwoTone => {
                let u = rotate(q, self.pattern_angle)[0];
                (coverage(d, pxl), coverage(u, pxl))
            }
            Pattern::Checkered => {
                let r = rotate(q, self.pattern_angle);
                let checker = square_wave(r[0], 0.8, pxl) * square_wave(r[1], 0.8, pxl);
                (coverage(d, pxl), 0.5 - 0.5 * checker)
            }
        };
        let object = mix(self.primary, self.secondary, dark);
        mix(rgb, object, alpha)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_distances() {
        assert!((sd_circle([2.0, 0.0], [0.0, 0.0], 1.0) - 1.0).abs() < 1e-6);
        assert!((sd_box([0.0, 0.0], [1.0, 1.0]) + 1.0).abs() < 1e-6);
        assert!((sd_box([2.0, 2.0], [1.0, 1.0]) - 2f32.sqrt()).abs() < 1e-6);
        let square = [[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]];
        assert!((sd_polygon([0.0, 0.0], &square) + 1.0).abs() < 1e-6);
        assert!((sd_polygon([3.0, 0.0], &square) - 2.0).abs() < 1e-6);
        // Every family holds its hole with a margin of material around it, and fits in the
        // bounding radius 1.2 used to skip far pixels.
        for family in FAMILIES {
            let s = Shape::new(family);
            let (c, r) = s.hole;
            for k in 0..64 {
                let (sin, cos) = (TAU * k as f32 / 64.0).sin_cos();
                let rim = [c[0] + (r + 0.05) * cos, c[1] + (r + 0.05) * sin];
                assert!(s.sdf(rim) < 0.0, "{family:?}: hole not inside at {rim:?}");
                assert!(
                    s.sdf([1.2 * cos, 1.2 * sin]) > 0.0,
                    "{family:?}: beyond 1.2"
                );
            }
        }
    }

    #[test]
    fn colour_helpers() {
        assert_eq!(hsv_to_rgb(0.0, 1.0, 1.0), [1.0, 0.0, 0.0]);
        assert_eq!(hsv_to_rgb(1.0 / 3.0, 1.0, 0.5), [0.0, 0.5, 0.0]);
        assert_eq!(hsv_to_rgb(0.7, 0.0, 0.25), [0.25, 0.25, 0.25]);
        assert_eq!(coverage(-1.0, 0.1), 1.0);
        assert_eq!(coverage(0.0, 0.1), 0.5);
        assert_eq!(square_wave(0.3, 0.6, 0.01), -1.0);
        assert_eq!(square_wave(0.0, 0.6, 0.01), 1.0);
    }

    #[test]
    fn class_attributes_follow_the_id_layout() {
        let config = ShapesConfig::default();
        let c = config.class(8 * 4 * 3 + 8 * 2 + 5).unwrap();
        assert_eq!((c.family, c.variant, c.fine), (3, 14, 117));
        assert_eq!(
            (c.shape, c.pattern, c.aspect),
            (Family::Star, Pattern::Holed, 0.6)
        );
        assert!(config.class(256).is_err());
        let bad = ShapesConfig {
            families: 9,
            ..ShapesConfig::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("families"), "{e}");
        let bad = ShapesConfig {
            levels: 7,
            ..ShapesConfig::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("levels") && e.contains("3..=6"), "{e}");
    }

    #[test]
    fn deeper_levels_add_form_order_and_class_and_keep_a_tree() {
        let three = ShapesConfig::default();
        // Class 117: family 3 (star), variant 14, k = 5 (odd: aspect 0.6).
        let c = three.class(117).unwrap();
        assert_eq!(three.label_row(&c), [117, 14, 3]);
        let at = |levels| ShapesConfig {
            levels,
            ..three.clone()
        };
        assert_eq!(at(4).label_row(&c), [117, 29, 14, 3]);
        assert_eq!(at(5).label_row(&c), [117, 29, 14, 3, 1]);
        assert_eq!(at(6).label_row(&c), [117, 29, 14, 3, 1, 0]);
        // A form holds the variant's classes of one aspect: 4 of the 8.
        let six = at(6);
        let labels = six.labels().unwrap();
        assert_eq!(labels.num_levels(), 6);
        for level in 0..5 {
            // Each class of a level has exactly one parent at the next: the labels form a tree.
            let mut parent = std::collections::BTreeMap::new();
            for i in 0..labels.len() {
                let row = labels.row(i);
                let p = parent.entry(row[level]).or_insert(row[level + 1]);
                assert_eq!(*p, row[level + 1], "level {level} class {}", row[level]);
            }
        }
        let forms: std::collections::BTreeSet<_> = labels.column(1).into_iter().collect();
        assert_eq!(forms.len(), 64);
        for fine in (0..256).step_by(37) {
            let c = six.class(fine).unwrap();
            assert_eq!(c.aspect == 1.0, six.label_row(&c)[1] % 2 == 0);
        }
        // The images do not depend on the levels.
        let small = |levels| ShapesConfig {
            families: 2,
            variants_per_family: 1,
            fine_per_variant: 2,
            images_per_class: 2,
            image_size: 8,
            levels,
            ..ShapesConfig::default()
        };
        let (a, b) = (small(3).generate().unwrap(), small(6).generate().unwrap());
        assert_eq!(a.pixels(), b.pixels());
        assert_eq!(a.labels().column(0), b.labels().column(0));
    }
}
