//! Labelled images that a training run draws batches from and embeds: the in-memory
//! [`InMemorySource`] (the embedded dataset, Fashion-MNIST, any [`ImageSet`]) and the on-disk
//! [`OnDiskSource`] (a real dataset's [`ImageList`] decoded and augmented by the image
//! [`pipeline`](super::pipeline)), behind one trait, [`ImageSource`].
//!
//! A source returns the *network input*: normalised `f32` images of a fixed size. Batches are a
//! pure function of the source, the image indices and the [`View`] (training augmentation of
//! epoch `e`, or the deterministic evaluation transform), so a run resumed at epoch `e` sees the
//! same pixels as a run that never stopped.

use super::image_set::ImageSet;
use super::loaders::ImageList;
use super::pipeline::{load_batch, Batch, BatchLoader, LoaderConfig, Op, Resize, Transform};
use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use candle_core::{Device, Tensor};
use std::path::PathBuf;
use std::sync::Arc;

/// Which preprocessing a batch gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// The training transform (random crops and flips) of epoch `epoch` (0-based): each image's
    /// random draws come from `(seed, epoch, image index)` ([`super::pipeline::sample_rng`]).
    Train {
        /// The epoch whose augmentation to draw.
        epoch: u64,
    },
    /// The evaluation transform (deterministic for every preset).
    Eval,
}

/// Batches of a source, in order; each item is one batch or the error that ended the stream.
pub type BatchStream<'a> = Box<dyn Iterator<Item = Result<Batch>> + 'a>;

/// Labelled images, loaded a batch at a time as network input.
pub trait ImageSource: Send + Sync {
    /// The labels, one row per image, finest level first.
    fn labels(&self) -> &Labels;

    /// Number of images.
    fn len(&self) -> usize {
        self.labels().len()
    }

    /// Always false (a source has at least one image).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(C, H, W)` of the network input (the same for both views).
    fn image_shape(&self) -> (usize, usize, usize);

    /// A short description for logs and progress bars (`"embedded (1920 images)"`, …).
    fn describe(&self) -> String;

    /// Images `indices` as a normalised `B × C × H × W` `f32` tensor on `device`.
    fn batch(&self, indices: &[usize], view: View, device: &Device) -> Result<Tensor>;

    /// The batches `batches` (lists of image indices) in order. The default computes each batch
    /// when it is asked for; [`OnDiskSource`] decodes the next ones in the background.
    fn stream(
        &self,
        batches: Vec<Vec<usize>>,
        view: View,
        device: &Device,
    ) -> Result<BatchStream<'_>> {
        let device = device.clone();
        Ok(Box::new(batches.into_iter().map(move |indices| {
            let images = self.batch(&indices, view, &device)?;
            Ok(Batch { indices, images })
        })))
    }
}

/// Per-channel normalisation `(x − mean) / std` of in-memory images.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalization {
    /// Channel means.
    pub mean: Vec<f32>,
    /// Channel standard deviations (finite, > 0).
    pub std: Vec<f32>,
}

impl Normalization {
    /// The identity on `channels` channels.
    pub fn identity(channels: usize) -> Self {
        Normalization {
            mean: vec![0.0; channels],
            std: vec![1.0; channels],
        }
    }
}

/// An [`ImageSet`] held in memory and normalised per channel. It has no augmentation: both
/// views give the same values.
#[derive(Debug, Clone)]
pub struct InMemorySource {
    set: Arc<ImageSet>,
    norm: Normalization,
}

impl InMemorySource {
    /// Wraps `set` with its normalisation; errors unless `norm` has one finite mean and one finite,
    /// positive standard deviation per channel.
    pub fn new(set: ImageSet, norm: Normalization) -> Result<Self> {
        let c = set.image_shape().0;
        if norm.mean.len() != c || norm.std.len() != c {
            return Err(Error::Shape(format!(
                "normalisation of {} / {} channels for images with {c}",
                norm.mean.len(),
                norm.std.len()
            )));
        }
        if let Some(ch) = (0..c).find(|&ch| {
            !(norm.mean[ch].is_finite() && norm.std[ch].is_finite() && norm.std[ch] > 0.0)
        }) {
            return Err(Error::invalid(
                "input_norm",
                format!(
                    "channel {ch}: mean {} and std {} must be finite and std > 0",
                    norm.mean[ch], norm.std[ch]
                ),
            ));
        }
        Ok(InMemorySource {
            set: Arc::new(set),
            norm,
        })
    }

    /// The images, unnormalised.
    pub fn images(&self) -> &ImageSet {
        &self.set
    }

    /// The normalisation.
    pub fn normalization(&self) -> &Normalization {
        &self.norm
    }
}

impl ImageSource for InMemorySource {
    fn labels(&self) -> &Labels {
        self.set.labels()
    }

    fn image_shape(&self) -> (usize, usize, usize) {
        self.set.image_shape()
    }

    fn describe(&self) -> String {
        let (c, h, w) = self.set.image_shape();
        format!("in-memory, {} images of {c} × {h} × {w}", self.set.len())
    }

    fn batch(&self, indices: &[usize], _view: View, device: &Device) -> Result<Tensor> {
        let c = self.norm.mean.len();
        let x = self.set.batch_tensor(indices, device)?;
        let mean = Tensor::from_slice(&self.norm.mean, (1, c, 1, 1), device)?;
        let std = Tensor::from_slice(&self.norm.std, (1, c, 1, 1), device)?;
        Ok(x.broadcast_sub(&mean)?.broadcast_div(&std)?)
    }
}

/// Image files on disk with their labels, decoded and transformed by the image pipeline: the
/// training transform for [`View::Train`], the evaluation transform for [`View::Eval`]. Both
/// transforms normalise (their [`super::pipeline::Normalize`]) and must end with a fixed-size
/// step of the same size.
#[derive(Debug, Clone)]
pub struct OnDiskSource {
    paths: Arc<Vec<PathBuf>>,
    labels: Labels,
    train_transform: Transform,
    eval_transform: Transform,
    loader: LoaderConfig,
    size: (u32, u32),
    name: String,
}

impl OnDiskSource {
    /// The images of `list` with the two transforms; `loader` sets the decoding threads, the
    /// prefetch depth and the augmentation seed. `name` describes the source in logs
    /// (`"SOP train"`).
    ///
    /// Errors if a transform is invalid, does not end with a fixed-size step, or the two give
    /// different sizes, and if the loader settings are zero.
    pub fn new(
        name: impl Into<String>,
        list: ImageList,
        train_transform: Transform,
        eval_transform: Transform,
        loader: LoaderConfig,
    ) -> Result<Self> {
        train_transform.validate()?;
        eval_transform.validate()?;
        if loader.threads == 0 || loader.prefetch == 0 {
            return Err(Error::invalid(
                "loader",
                "threads and prefetch must be at least 1",
            ));
        }
        let fixed = |t: &Transform, which: &str| {
            output_size(t).ok_or_else(|| {
                Error::invalid(
                    which,
                    format!(
                        "{t:?} does not end with a fixed-size crop or resize, so images of \
                         different sizes cannot form a batch"
                    ),
                )
            })
        };
        let size = fixed(&train_transform, "train_transform")?;
        let eval_size = fixed(&eval_transform, "test_transform")?;
        if size != eval_size {
            return Err(Error::invalid(
                "test_transform",
                format!(
                    "gives {} × {} images but the training transform {} × {}; the network \
                     needs one input size",
                    eval_size.0, eval_size.1, size.0, size.1
                ),
            ));
        }
        let (paths, labels) = list.into_parts();
        Ok(OnDiskSource {
            paths: Arc::new(paths),
            labels,
            train_transform,
            eval_transform,
            loader,
            size,
            name: name.into(),
        })
    }

    /// The image files, one per label row.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The transform of `view`.
    pub fn transform(&self, view: View) -> &Transform {
        match view {
            View::Train { .. } => &self.train_transform,
            View::Eval => &self.eval_transform,
        }
    }

    /// The loader settings.
    pub fn loader(&self) -> LoaderConfig {
        self.loader
    }

    /// The epoch whose random draws `view` uses (evaluation: 0, its transform draws nothing for
    /// the presets, and stays deterministic otherwise).
    fn epoch(view: View) -> u64 {
        match view {
            View::Train { epoch } => epoch,
            View::Eval => 0,
        }
    }
}

impl ImageSource for OnDiskSource {
    fn labels(&self) -> &Labels {
        &self.labels
    }

    fn image_shape(&self) -> (usize, usize, usize) {
        (3, self.size.0 as usize, self.size.1 as usize)
    }

    fn describe(&self) -> String {
        format!(
            "{}, {} images → 3 × {} × {}",
            self.name,
            self.paths.len(),
            self.size.0,
            self.size.1
        )
    }

    fn batch(&self, indices: &[usize], view: View, device: &Device) -> Result<Tensor> {
        load_batch(
            &self.paths,
            indices,
            self.transform(view),
            self.loader.seed,
            Self::epoch(view),
            device,
        )
    }

    /// Decodes the batches on the loader's own threads, `prefetch` batches ahead, and puts
    /// them on `device` there (for a CUDA device from page-locked buffers, the copy queued on
    /// its stream: [`crate::data::staging`]), so that the consumer, the trainer's step, never
    /// waits for a copy.
    fn stream(
        &self,
        batches: Vec<Vec<usize>>,
        view: View,
        device: &Device,
    ) -> Result<BatchStream<'_>> {
        let expected = batches.len();
        let mut loader = BatchLoader::new(
            Arc::clone(&self.paths),
            batches,
            self.transform(view).clone(),
            Self::epoch(view),
            self.loader,
            device.clone(),
        )?;
        let mut seen = 0usize;
        let mut done = false;
        Ok(Box::new(std::iter::from_fn(move || {
            if done || seen == expected {
                return None;
            }
            let item = match loader.next() {
                Some(item) => item,
                // The loader thread ended without sending every batch (it panicked).
                None => Err(Error::invalid(
                    "loader",
                    format!("the image loader stopped after {seen} of {expected} batches"),
                )),
            };
            seen += 1;
            done = item.is_err();
            Some(item)
        })))
    }
}

/// `(height, width)` of every image `transform` outputs: the size set by its last fixed-size
/// step (a crop, or a resize to an exact size); `None` if no step fixes it (a resize of the
/// shorter side keeps the aspect ratio, so sizes vary).
pub fn output_size(transform: &Transform) -> Option<(u32, u32)> {
    for op in transform.ops.iter().rev() {
        match *op {
            Op::CenterCrop { height, width }
            | Op::RandomCrop { height, width, .. }
            | Op::RandomResizedCrop { height, width, .. }
            | Op::Resize(Resize::Exact { height, width }) => return Some((height, width)),
            Op::Resize(Resize::ShorterSide(_)) => return None,
            Op::HorizontalFlip { .. } => {}
        }
    }
    None
}

/// The images of another source at `indices`, in that order: a training split with some of its
/// classes held out ([`crate::train::validation`]), or those held-out classes. Index `i` of the
/// subset is image `indices[i]` of the source, so its pixels, augmentation draws included
/// (which [`OnDiskSource`] keys by the source's own index), are the source's.
#[derive(Clone)]
pub struct SubsetSource {
    inner: Arc<dyn ImageSource>,
    indices: Arc<Vec<usize>>,
    labels: Labels,
    what: String,
}

impl SubsetSource {
    /// The images `indices` of `inner`, described as `what` (`"validation classes"`). Errors when
    /// `indices` is empty or names an image `inner` does not have.
    pub fn new(inner: Arc<dyn ImageSource>, indices: Vec<usize>, what: &str) -> Result<Self> {
        if indices.is_empty() {
            return Err(Error::invalid(
                "indices",
                format!(
                    "{what}: a subset of {} needs at least one image",
                    inner.describe()
                ),
            ));
        }
        let labels = inner.labels().select(&indices)?;
        Ok(SubsetSource {
            inner,
            indices: Arc::new(indices),
            labels,
            what: what.to_string(),
        })
    }

    /// The source's index of every image of the subset.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    fn outer(&self, local: &[usize]) -> Result<Vec<usize>> {
        local
            .iter()
            .map(|&i| {
                self.indices.get(i).copied().ok_or_else(|| {
                    Error::invalid(
                        "index",
                        format!(
                            "{i} out of range for {} images of {}",
                            self.len(),
                            self.what
                        ),
                    )
                })
            })
            .collect()
    }
}

impl ImageSource for SubsetSource {
    fn labels(&self) -> &Labels {
        &self.labels
    }

    fn image_shape(&self) -> (usize, usize, usize) {
        self.inner.image_shape()
    }

    fn describe(&self) -> String {
        format!(
            "{}: {} of the images of {}",
            self.what,
            self.indices.len(),
            self.inner.describe()
        )
    }

    fn batch(&self, indices: &[usize], view: View, device: &Device) -> Result<Tensor> {
        self.inner.batch(&self.outer(indices)?, view, device)
    }

    /// The source's own stream (an [`OnDiskSource`] keeps decoding ahead), its batches' indices
    /// mapped back to the subset's.
    fn stream(
        &self,
        batches: Vec<Vec<usize>>,
        view: View,
        device: &Device,
    ) -> Result<BatchStream<'_>> {
        let outer = batches
            .iter()
            .map(|b| self.outer(b))
            .collect::<Result<Vec<_>>>()?;
        let stream = self.inner.stream(outer, view, device)?;
        Ok(Box::new(stream.zip(batches).map(|(item, local)| {
            item.map(|batch| Batch {
                indices: local,
                images: batch.images,
            })
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_size_is_set_by_the_last_sizing_step() {
        assert_eq!(output_size(&Transform::retrieval_train()), Some((224, 224)));
        assert_eq!(
            output_size(&Transform::happier_sop_test()),
            Some((224, 224))
        );
        let t = Transform {
            ops: vec![Op::CenterCrop {
                height: 8,
                width: 6,
            }],
            ..Transform::retrieval_test()
        };
        assert_eq!(output_size(&t), Some((8, 6)));
        // A shorter-side resize last leaves the size open; no step at all too.
        let t = Transform {
            ops: vec![t.ops[0], Op::Resize(Resize::ShorterSide(10))],
            ..t
        };
        assert_eq!(output_size(&t), None);
        let t = Transform {
            ops: Vec::new(),
            ..t
        };
        assert_eq!(output_size(&t), None);
    }

    #[test]
    fn in_memory_source_normalises_and_checks_channels() {
        let labels = Labels::from_fine(&[0, 1]).unwrap();
        let set = ImageSet::new(vec![0.5; 2 * 2 * 2 * 2], labels, 2, 2, 2).unwrap();
        let norm = Normalization {
            mean: vec![0.5, 0.25],
            std: vec![1.0, 0.5],
        };
        let src = InMemorySource::new(set.clone(), norm).unwrap();
        let x = src.batch(&[1], View::Eval, &Device::Cpu).unwrap();
        let v: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(v, vec![0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5]);
        let streamed: Vec<Batch> = src
            .stream(
                vec![vec![0], vec![1, 0]],
                View::Train { epoch: 3 },
                &Device::Cpu,
            )
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(streamed[1].indices, vec![1, 0]);
        assert_eq!(streamed[1].images.dims(), &[2, 2, 2, 2]);
        let e = InMemorySource::new(set.clone(), Normalization::identity(3))
            .unwrap_err()
            .to_string();
        assert!(e.contains("3 / 3 channels") && e.contains("with 2"), "{e}");
        let bad = Normalization {
            mean: vec![0.0, 0.0],
            std: vec![1.0, 0.0],
        };
        let e = InMemorySource::new(set, bad).unwrap_err().to_string();
        assert!(e.contains("input_norm") && e.contains("channel 1"), "{e}");
    }

    #[test]
    fn a_subset_reads_its_source_images_and_maps_stream_indices_back() {
        // Image i holds the value i in every pixel, so each batch says which images it read.
        let labels = Labels::from_fine(&[0, 0, 1, 1, 2]).unwrap();
        let pixels: Vec<f32> = (0..5).flat_map(|i| vec![i as f32; 4]).collect();
        let set = ImageSet::new(pixels, labels, 1, 2, 2).unwrap();
        let src: Arc<dyn ImageSource> =
            Arc::new(InMemorySource::new(set, Normalization::identity(1)).unwrap());
        let sub = SubsetSource::new(Arc::clone(&src), vec![4, 1, 2], "held out").unwrap();
        assert_eq!(sub.len(), 3);
        assert_eq!(sub.labels().column(0), vec![2, 0, 1]);
        let firsts = |t: &Tensor| -> Vec<f32> {
            t.flatten_from(1)
                .unwrap()
                .narrow(1, 0, 1)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let x = sub.batch(&[2, 0], View::Eval, &Device::Cpu).unwrap();
        assert_eq!(firsts(&x), vec![2.0, 4.0]);
        let streamed: Vec<Batch> = sub
            .stream(vec![vec![1], vec![0, 2]], View::Eval, &Device::Cpu)
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(streamed[0].indices, vec![1]);
        assert_eq!(streamed[1].indices, vec![0, 2]);
        assert_eq!(firsts(&streamed[1].images), vec![4.0, 2.0]);
        let e = sub
            .batch(&[3], View::Eval, &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("3 out of range") && e.contains("held out"),
            "{e}"
        );
        assert!(SubsetSource::new(Arc::clone(&src), vec![], "none").is_err());
        assert!(SubsetSource::new(src, vec![5], "past the end").is_err());
    }
}
