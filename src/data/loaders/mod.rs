//! Loaders for the real datasets of the five papers, each reading the files exactly as their
//! authors distribute them and returning image paths, [`Labels`] (finest level first) and the
//! paper's split.
//!
//! | dataset | module | levels | split |
//! |---|---|---|---|
//! | Stanford Online Products | [`sop`] | class, super-class | train / test (`Ebay_{train,test}.txt`) |
//! | iNaturalist-2018, iNat-base / iNat-full | [`inaturalist`] | 2 or 7 | Smooth-AP train / test |
//! | DyML-Vehicle / -Animal / -Product | [`dyml`] | fine, middle, coarse | train; per-scale query / gallery |
//! | CUB-200-2011, Cars196 | [`cub_cars`] | class | first half of the classes / second half |
//! | In-Shop Clothes | [`inshop`] | item, category | train / query / gallery |
//! | PKU VehicleID | [`vehicleid`] | vehicle | train / small, medium, large test |
//! | revisited Oxford5k / Paris6k | [`revisited`] | easy / hard / junk ground truth | queries / database |
//! | mini-ImageNet, tiered-ImageNet, CIFAR-FS | [`fewshot_sets`] | class | base / val / novel |
//! | Fashion-MNIST (IDX) | [`fashion_mnist`] | class | train / test, decoded |
//!
//! Every loader takes the dataset root (the folder the official archive unpacks to; each module
//! documents the expected layout). Errors name the file and, for a text file, the 1-based line:
//! a missing file, a malformed line, an unknown class or image id. Class ids are the dataset's own
//! where it has numeric ids (they need not be contiguous; metrics only compare them), otherwise
//! the index of the name in the sorted list of names, which is deterministic.
//!
//! Loaders never open the images; [`ImageList::check_files_exist`] does, and the image pipeline
//! ([`crate::data::pipeline`]) names any file it cannot decode.

pub mod cub_cars;
pub mod dyml;
pub mod fashion_mnist;
pub mod fewshot_sets;
pub mod inaturalist;
pub mod inshop;
pub mod matlab;
pub mod pickle;
pub mod revisited;
pub mod sop;
pub mod vehicleid;

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Image files and their labels (one label row per file, finest level first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageList {
    paths: Vec<PathBuf>,
    labels: Labels,
}

impl ImageList {
    /// Pairs `paths` with `labels`; errors unless they have the same length.
    pub fn new(paths: Vec<PathBuf>, labels: Labels) -> Result<Self> {
        if paths.len() != labels.len() {
            return Err(Error::Shape(format!(
                "{} image paths but {} label rows",
                paths.len(),
                labels.len()
            )));
        }
        Ok(ImageList { paths, labels })
    }

    /// Builds the list from `(path, label row)` pairs; `source` names the file they were read
    /// from, for the error when there are none.
    pub(crate) fn from_rows(
        source: &Path,
        rows: Vec<(PathBuf, Vec<ClassId>)>,
    ) -> Result<ImageList> {
        if rows.is_empty() {
            return Err(Error::file(source, "lists no image"));
        }
        let (paths, labels): (Vec<PathBuf>, Vec<Vec<ClassId>>) = rows.into_iter().unzip();
        let labels = Labels::new(labels)
            .map_err(|e| Error::file(source, format!("labels do not form a hierarchy: {e}")))?;
        ImageList::new(paths, labels)
    }

    /// Like [`ImageList::from_rows`] for rows read from the lines of `source`: a class listed
    /// under two different parents is reported with both line numbers.
    pub(crate) fn from_lines(
        source: &Path,
        rows: Vec<(usize, PathBuf, Vec<ClassId>)>,
    ) -> Result<ImageList> {
        check_tree(source, rows.iter().map(|(n, _, r)| (*n, r.as_slice())))?;
        ImageList::from_rows(source, rows.into_iter().map(|(_, p, r)| (p, r)).collect())
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Always false: an empty list is rejected by the loaders.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// The image files, in the order of the dataset's list file.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The labels, one row per image, finest level first.
    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The paths and labels, without copying.
    pub fn into_parts(self) -> (Vec<PathBuf>, Labels) {
        (self.paths, self.labels)
    }

    /// Number of distinct classes at `level` (0 = finest). Errors if the level does not exist.
    pub fn num_classes(&self, level: usize) -> Result<usize> {
        if level >= self.labels.num_levels() {
            return Err(Error::invalid(
                "level",
                format!(
                    "level {level} does not exist (labels have {})",
                    self.labels.num_levels()
                ),
            ));
        }
        Ok(self
            .labels
            .column(level)
            .into_iter()
            .collect::<BTreeSet<_>>()
            .len())
    }

    /// The images at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> Result<ImageList> {
        let labels = self.labels.select(indices)?;
        let paths = indices.iter().map(|&i| self.paths[i].clone()).collect();
        Ok(ImageList { paths, labels })
    }

    /// Errors, naming the first one, if a listed file does not exist (a partial download or a
    /// wrong root). Stats every file: a few seconds for 100k images on a local disk.
    pub fn check_files_exist(&self) -> Result<()> {
        match self.paths.iter().position(|p| !p.is_file()) {
            Some(i) => Err(Error::file(
                &self.paths[i],
                format!(
                    "image {i} of the list does not exist (is the dataset fully extracted, and \
                     the root right?)"
                ),
            )),
            None => Ok(()),
        }
    }
}

/// The retrieval split of SOP, iNaturalist, CUB-200-2011 and Cars196: disjoint training and test
/// classes; at test time every test image is a query against the rest of the test set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainTest {
    /// Training images.
    pub train: ImageList,
    /// Test images (queries and references).
    pub test: ImageList,
}

/// A test set with separate queries and gallery (In-Shop, DyML).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryGallery {
    /// Query images.
    pub query: ImageList,
    /// Gallery (reference) images.
    pub gallery: ImageList,
}

/// Errors, naming both lines of `source`, if a class at some level has two different parents
/// at the next level (the labels would not form a tree).
fn check_tree<'a>(source: &Path, rows: impl Iterator<Item = (usize, &'a [ClassId])>) -> Result<()> {
    let mut parent: HashMap<(usize, ClassId), (ClassId, usize)> = HashMap::new();
    for (line, row) in rows {
        for l in 0..row.len().saturating_sub(1) {
            let (child, par) = (row[l], row[l + 1]);
            let (first, first_line) = *parent.entry((l, child)).or_insert((par, line));
            if first != par {
                return Err(Error::line(
                    source,
                    line,
                    format!(
                        "class {child} at level {l} has parent {par} here but {first} on line \
                         {first_line}: the labels do not form a hierarchy"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Reads a whole text file, naming the file on an I/O or encoding error.
pub(crate) fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    String::from_utf8(bytes).map_err(|e| {
        Error::file(
            path,
            format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        )
    })
}

/// Reads a whole binary file, naming the file on an I/O error.
pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

/// The lines of `text` with their 1-based numbers, without the line terminator (`\n` or
/// `\r\n`), skipping blank lines (list files end with a newline; some have trailing blank lines).
pub(crate) fn numbered_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split('\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l.strip_suffix('\r').unwrap_or(l)))
        .filter(|(_, l)| !l.trim().is_empty())
}

/// Parses `value` as a number, or errors naming the file, line and field.
pub(crate) fn parse_field<T: FromStr>(
    path: &Path,
    line: usize,
    field: &str,
    value: &str,
) -> Result<T> {
    value.trim().parse::<T>().map_err(|_| {
        Error::line(
            path,
            line,
            format!("field '{field}' must be an integer, got '{value}'"),
        )
    })
}

/// Splits a line on whitespace and errors unless it has exactly `names.len()` fields.
pub(crate) fn whitespace_fields<'a>(
    path: &Path,
    line: usize,
    text: &'a str,
    names: &[&str],
) -> Result<Vec<&'a str>> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() != names.len() {
        return Err(Error::line(
            path,
            line,
            format!(
                "expected {} whitespace-separated fields ({}), found {}",
                names.len(),
                names.join(" "),
                fields.len()
            ),
        ));
    }
    Ok(fields)
}

/// Errors unless `root` is an existing folder (the usual mistake is a wrong dataset root).
pub(crate) fn require_dir(root: &Path) -> Result<()> {
    if root.is_dir() {
        Ok(())
    } else {
        Err(Error::file(root, "dataset root is not an existing folder"))
    }
}

/// Class ids for names: the index of each name in their sorted list (deterministic, and the same
/// for every split that uses the same name table).
pub(crate) fn sorted_name_ids<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> BTreeMap<String, ClassId> {
    let set: BTreeSet<&str> = names.into_iter().collect();
    set.into_iter()
        .enumerate()
        .map(|(i, n)| (n.to_string(), i as ClassId))
        .collect()
}

/// Splits `rows` into the images of the first `⌊n/2⌋` classes (by increasing id) and the rest:
/// the CUB-200-2011 (100 / 100) and Cars196 (98 / 98) retrieval protocol. `source` names the
/// annotation file for errors.
pub(crate) fn split_first_half_classes(
    source: &Path,
    rows: Vec<(PathBuf, ClassId)>,
) -> Result<TrainTest> {
    let classes: BTreeSet<ClassId> = rows.iter().map(|(_, c)| *c).collect();
    if classes.len() < 2 {
        return Err(Error::file(
            source,
            format!(
                "{} class(es): a class-disjoint train/test split needs at least 2",
                classes.len()
            ),
        ));
    }
    let train_classes: BTreeSet<ClassId> =
        classes.iter().take(classes.len() / 2).copied().collect();
    let (train, test): (Vec<_>, Vec<_>) = rows
        .into_iter()
        .map(|(p, c)| (p, vec![c]))
        .partition(|(_, c)| train_classes.contains(&c[0]));
    Ok(TrainTest {
        train: ImageList::from_rows(source, train)?,
        test: ImageList::from_rows(source, test)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_lines_keep_file_line_numbers() {
        let lines: Vec<_> = numbered_lines("a\r\n\nb\n  \nc").collect();
        assert_eq!(lines, vec![(1, "a"), (3, "b"), (5, "c")]);
    }

    #[test]
    fn sorted_name_ids_are_dense_and_sorted() {
        let ids = sorted_name_ids(["b", "a", "b", "c"]);
        assert_eq!(ids["a"], 0);
        assert_eq!(ids["b"], 1);
        assert_eq!(ids["c"], 2);
    }

    #[test]
    fn parse_field_names_file_line_and_field() {
        let err = parse_field::<i64>(Path::new("x.txt"), 7, "class_id", "abc").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("x.txt:7") && msg.contains("class_id"), "{msg}");
    }

    #[test]
    fn first_half_split_is_class_disjoint() {
        let rows = (0..10)
            .map(|i| (PathBuf::from(format!("{i}.jpg")), (i % 4 + 1) as ClassId))
            .collect();
        let s = split_first_half_classes(Path::new("a"), rows).unwrap();
        assert!(s.train.labels().column(0).iter().all(|&c| c <= 2));
        assert!(s.test.labels().column(0).iter().all(|&c| c >= 3));
        assert_eq!(s.train.len() + s.test.len(), 10);
    }
}
