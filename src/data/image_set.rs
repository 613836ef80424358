//! An in-memory set of equally sized images with their hierarchical labels.

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use candle_core::{Device, Tensor};

/// `N` images of `C × H × W` `f32` values (row-major, channel first, the layout of a candle or
/// PyTorch `N × C × H × W` tensor) and their [`Labels`].
///
/// The value range is the producer's convention; the embedded dataset
/// ([`crate::data::shapes`]) gives RGB values in `[0, 1]`, as torchvision's `ToTensor`.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSet {
    pixels: Vec<f32>,
    labels: Labels,
    channels: usize,
    height: usize,
    width: usize,
}

impl ImageSet {
    /// Wraps `pixels` (`N × C × H × W`, `N = labels.len()`).
    ///
    /// Errors when a dimension is zero, the buffer length is not `N · C · H · W`, or a value is
    /// not finite (naming the image and the position).
    pub fn new(
        pixels: Vec<f32>,
        labels: Labels,
        channels: usize,
        height: usize,
        width: usize,
    ) -> Result<Self> {
        if channels == 0 || height == 0 || width == 0 {
            return Err(Error::Shape(format!(
                "images must have positive dimensions, got {channels} × {height} × {width}"
            )));
        }
        let per_image = channels * height * width;
        if pixels.len() != labels.len() * per_image {
            return Err(Error::Shape(format!(
                "{} values for {} images of {channels} × {height} × {width} (expected {})",
                pixels.len(),
                labels.len(),
                labels.len() * per_image
            )));
        }
        if let Some(k) = pixels.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "pixels",
                format!(
                    "image {} has a non-finite value ({}) at offset {}",
                    k / per_image,
                    pixels[k],
                    k % per_image
                ),
            ));
        }
        Ok(ImageSet {
            pixels,
            labels,
            channels,
            height,
            width,
        })
    }

    /// Number of images `N`.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Always false (labels are never empty).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// `(C, H, W)`.
    pub fn image_shape(&self) -> (usize, usize, usize) {
        (self.channels, self.height, self.width)
    }

    /// Values per image, `C · H · W`.
    pub fn image_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// All values, `N × C × H × W` row-major.
    pub fn pixels(&self) -> &[f32] {
        &self.pixels
    }

    /// The labels, one row per image.
    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The values of image `i` (`C × H × W`). Panics if `i ≥ N`, like slice indexing.
    pub fn image(&self, i: usize) -> &[f32] {
        let n = self.image_len();
        &self.pixels[i * n..(i + 1) * n]
    }

    /// The values (`N × C × H × W`) and the labels, without copying.
    pub fn into_parts(self) -> (Vec<f32>, Labels) {
        (self.pixels, self.labels)
    }

    /// The images at `indices`, in that order, with their labels.
    pub fn select(&self, indices: &[usize]) -> Result<ImageSet> {
        let labels = self.labels.select(indices)?;
        let mut pixels = Vec::with_capacity(indices.len() * self.image_len());
        for &i in indices {
            pixels.extend_from_slice(self.image(i));
        }
        Ok(ImageSet {
            labels,
            pixels,
            ..*self
        })
    }

    /// All images as an `N × C × H × W` `f32` tensor on `device`.
    pub fn to_tensor(&self, device: &Device) -> Result<Tensor> {
        let (c, h, w) = self.image_shape();
        Ok(Tensor::from_slice(
            &self.pixels,
            (self.len(), c, h, w),
            device,
        )?)
    }

    /// The images at `indices` (a mini-batch) as a `B × C × H × W` tensor on `device`.
    pub fn batch_tensor(&self, indices: &[usize], device: &Device) -> Result<Tensor> {
        let n = self.len();
        let mut pixels = Vec::with_capacity(indices.len() * self.image_len());
        for &i in indices {
            if i >= n {
                return Err(Error::invalid(
                    "index",
                    format!("{i} out of range for {n} images"),
                ));
            }
            pixels.extend_from_slice(self.image(i));
        }
        let (c, h, w) = self.image_shape();
        Ok(Tensor::from_vec(pixels, (indices.len(), c, h, w), device)?)
    }

    /// Per-channel mean and (population) standard deviation over all pixels of all images, for
    /// input normalisation `(x − mean) / std`.
    pub fn channel_mean_std(&self) -> Vec<(f64, f64)> {
        let plane = self.height * self.width;
        (0..self.channels)
            .map(|ch| {
                let (mut sum, mut sq) = (0.0f64, 0.0f64);
                for i in 0..self.len() {
                    let start = i * self.image_len() + ch * plane;
                    for &v in &self.pixels[start..start + plane] {
                        sum += v as f64;
                        sq += (v as f64) * (v as f64);
                    }
                }
                let count = (self.len() * plane) as f64;
                let mean = sum / count;
                (mean, (sq / count - mean * mean).max(0.0).sqrt())
            })
            .collect()
    }

    /// A grid of the images at `indices` (`cols` per row, 1-pixel gaps of `gap_value`) as 8-bit
    /// interleaved RGB (`rows·(H+1)+1` × `cols·(W+1)+1` pixels), values in `[0, 1]` scaled to
    /// `0..=255`. Needs 3 channels. Returns `(rgb, width, height)`; for a PNG preview.
    pub fn grid_rgb8(
        &self,
        indices: &[usize],
        cols: usize,
        gap_value: u8,
    ) -> Result<(Vec<u8>, usize, usize)> {
        if self.channels != 3 {
            return Err(Error::Shape(format!(
                "an RGB grid needs 3 channels, the images have {}",
                self.channels
            )));
        }
        if cols == 0 || indices.is_empty() {
            return Err(Error::invalid(
                "cols",
                "need at least one column and one image",
            ));
        }
        if let Some(&i) = indices.iter().find(|&&i| i >= self.len()) {
            return Err(Error::invalid(
                "index",
                format!("{i} out of range for {} images", self.len()),
            ));
        }
        let rows = indices.len().div_ceil(cols);
        let (h, w) = (self.height, self.width);
        let (gw, gh) = (cols * (w + 1) + 1, rows * (h + 1) + 1);
        let mut rgb = vec![gap_value; gw * gh * 3];
        for (k, &i) in indices.iter().enumerate() {
            let (r0, c0) = ((k / cols) * (h + 1) + 1, (k % cols) * (w + 1) + 1);
            let img = self.image(i);
            for y in 0..h {
                for x in 0..w {
                    for ch in 0..3 {
                        let v = img[ch * h * w + y * w + x];
                        rgb[((r0 + y) * gw + c0 + x) * 3 + ch] =
                            (v.clamp(0.0, 1.0) * 255.0).round() as u8;
                    }
                }
            }
        }
        Ok((rgb, gw, gh))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> ImageSet {
        let labels = Labels::from_fine(&[0, 1]).unwrap();
        let pixels = (0..2 * 3 * 2 * 2).map(|v| v as f32 / 24.0).collect();
        ImageSet::new(pixels, labels, 3, 2, 2).unwrap()
    }

    #[test]
    fn checks_the_buffer() {
        let labels = Labels::from_fine(&[0, 1]).unwrap();
        let e = ImageSet::new(vec![0.0; 5], labels.clone(), 3, 2, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("5 values for 2 images"), "{e}");
        let mut px = vec![0.0; 24];
        px[13] = f32::NAN;
        let e = ImageSet::new(px, labels, 3, 2, 2).unwrap_err().to_string();
        assert!(e.contains("image 1") && e.contains("offset 1"), "{e}");
    }

    #[test]
    fn select_and_tensors_keep_the_layout() {
        let s = tiny();
        let t = s.select(&[1]).unwrap();
        assert_eq!(t.image(0), s.image(1));
        assert_eq!(t.labels().fine(0), 1);
        let x = s.batch_tensor(&[1, 0], &Device::Cpu).unwrap();
        assert_eq!(x.dims(), &[2, 3, 2, 2]);
        let v: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(&v[..12], s.image(1));
        assert!(s.batch_tensor(&[2], &Device::Cpu).is_err());
    }

    #[test]
    fn channel_statistics() {
        let s = tiny();
        let stats = s.channel_mean_std();
        // Channel 0 holds values {0,1,2,3} and {12,13,14,15} / 24.
        let mean0 = [0, 1, 2, 3, 12, 13, 14, 15].iter().sum::<i32>() as f64 / 8.0 / 24.0;
        assert!((stats[0].0 - mean0).abs() < 1e-7);
    }

    #[test]
    fn grid_places_images_with_gaps() {
        let s = tiny();
        let (rgb, w, h) = s.grid_rgb8(&[0, 1], 2, 7).unwrap();
        assert_eq!((w, h), (7, 4));
        assert_eq!(rgb[0], 7);
        // Pixel (1, 1) is image 0's first red value, 0.
        assert_eq!(rgb[(w + 1) * 3], 0);
        // Image 1's first red value 12/24 → 128.
        assert_eq!(rgb[(w + 4) * 3], 128);
    }
}
