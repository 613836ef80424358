//! Every dataset loader on a tiny fixture in the exact on-disk format of the distributed dataset,
//! including malformed input that must be reported with its file and line.

use rankwise::data::loaders::{
    cub_cars, dyml, fashion_mnist, fewshot_sets, inaturalist, inshop, pickle, revisited, sop,
    vehicleid, ImageList,
};
use rankwise::hierarchy::ClassId;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

fn write(root: &Path, rel: &str, content: impl AsRef<[u8]>) -> PathBuf {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(&p, content).unwrap();
    p
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/loaders")
        .join(name)
}

fn rows(list: &ImageList) -> Vec<Vec<ClassId>> {
    (0..list.len())
        .map(|i| list.labels().row(i).to_vec())
        .collect()
}

fn err_text<T: std::fmt::Debug>(r: rankwise::Result<T>) -> String {
    r.unwrap_err().to_string()
}

// ---------------------------------------------------------------- Stanford Online Products

const EBAY_TRAIN: &str = "image_id class_id super_class_id path\n\
1 1 1 bicycle_final/111085122871_0.JPG\n\
2 1 1 bicycle_final/111085122871_1.JPG\n\
3 2 1 bicycle_final/111265328556_0.JPG\n\
4 3 2 cabinet_final/111166210823_0.JPG\n";
const EBAY_TEST: &str = "image_id class_id super_class_id path\r\n\
59552 11319 1 bicycle_final/251145016366_0.JPG\r\n\
59553 11319 1 bicycle_final/251145016366_1.JPG\r\n\
59554 11320 12 toaster_final/331127711427_0.JPG\r\n";

#[test]
fn sop_reads_both_splits_with_class_and_super_class() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "Ebay_train.txt", EBAY_TRAIN);
    write(root, "Ebay_test.txt", EBAY_TEST);
    let sop = sop::load(root).unwrap();
    assert_eq!(sop.train.len(), 4);
    assert_eq!(
        rows(&sop.train),
        vec![vec![1, 1], vec![1, 1], vec![2, 1], vec![3, 2]]
    );
    assert_eq!(
        sop.train.paths()[3],
        root.join("cabinet_final/111166210823_0.JPG")
    );
    assert_eq!(
        rows(&sop.test),
        vec![vec![11319, 1], vec![11319, 1], vec![11320, 12]]
    );
    assert_eq!(sop.test.num_classes(0).unwrap(), 2);
    assert_eq!(sop.test.num_classes(1).unwrap(), 2);
}

#[test]
fn sop_errors_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "Ebay_test.txt", EBAY_TEST);
    let bad = EBAY_TRAIN.replace("3 2 1 bicycle", "3 2 bicycle");
    write(root, "Ebay_train.txt", &bad);
    let e = err_text(sop::load(root));
    assert!(
        e.contains("Ebay_train.txt:4") && e.contains("expected 4"),
        "{e}"
    );

    write(root, "Ebay_train.txt", EBAY_TRAIN.replace("4 3 2", "4 x 2"));
    let e = err_text(sop::load(root));
    assert!(
        e.contains("Ebay_train.txt:5") && e.contains("class_id"),
        "{e}"
    );

    write(
        root,
        "Ebay_train.txt",
        EBAY_TRAIN.replace("image_id class_id", "id class"),
    );
    let e = err_text(sop::load(root));
    assert!(
        e.contains("Ebay_train.txt:1") && e.contains("header"),
        "{e}"
    );

    // Class 1 under two super-classes is not a hierarchy.
    write(
        root,
        "Ebay_train.txt",
        EBAY_TRAIN.replace("2 1 1 bicycle", "2 1 5 bicycle"),
    );
    let e = err_text(sop::load(root));
    assert!(
        e.contains("Ebay_train.txt") && e.contains("hierarchy"),
        "{e}"
    );

    write(
        root,
        "Ebay_train.txt",
        "image_id class_id super_class_id path\n",
    );
    assert!(err_text(sop::load(root)).contains("lists no image"));

    fs::remove_file(root.join("Ebay_test.txt")).unwrap();
    write(root, "Ebay_train.txt", EBAY_TRAIN);
    assert!(err_text(sop::load(root)).contains("Ebay_test.txt"));
    assert!(err_text(sop::load(root.join("nope"))).contains("nope"));
}

#[test]
fn check_files_exist_names_the_missing_image() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "Ebay_train.txt", EBAY_TRAIN);
    write(root, "Ebay_test.txt", EBAY_TEST);
    let sop = sop::load(root).unwrap();
    for p in sop.train.paths() {
        write(root, p.strip_prefix(root).unwrap().to_str().unwrap(), b"x");
    }
    sop.train.check_files_exist().unwrap();
    let e = err_text(sop.test.check_files_exist());
    assert!(e.contains("251145016366_0.JPG"), "{e}");
    let sub = sop.train.select(&[3, 0]).unwrap();
    assert_eq!(rows(&sub), vec![vec![3, 2], vec![1, 1]]);
}

// ---------------------------------------------------------------- CUB-200-2011 and Cars196

#[test]
fn cub_splits_first_half_of_classes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut images = String::new();
    let mut labels = String::new();
    for id in 1..=8 {
        let class = (id + 1) / 2; // classes 1..=4, two images each
        images += &format!("{id} {class:03}.Bird/Bird_{id:04}.jpg\n");
        labels += &format!("{id} {class}\n");
    }
    write(root, "images.txt", &images);
    write(root, "image_class_labels.txt", &labels);
    let cub = cub_cars::load_cub(root).unwrap();
    assert_eq!(rows(&cub.train), vec![vec![1], vec![1], vec![2], vec![2]]);
    assert_eq!(rows(&cub.test), vec![vec![3], vec![3], vec![4], vec![4]]);
    assert_eq!(
        cub.train.paths()[0],
        root.join("images/001.Bird/Bird_0001.jpg")
    );

    write(
        root,
        "image_class_labels.txt",
        labels.replace("5 3\n", "5\n"),
    );
    let e = err_text(cub_cars::load_cub(root));
    assert!(e.contains("image_class_labels.txt:5"), "{e}");

    write(root, "image_class_labels.txt", labels.replace("7 4\n", ""));
    let e = err_text(cub_cars::load_cub(root));
    assert!(e.contains("images.txt:7") && e.contains("no class"), "{e}");

    write(root, "image_class_labels.txt", format!("{labels}9 4\n"));
    let e = err_text(cub_cars::load_cub(root));
    assert!(
        e.contains("image_class_labels.txt:9") && e.contains("not listed"),
        "{e}"
    );
}

#[test]
fn cars_reads_the_official_mat_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::copy(fixture("cars_annos.mat"), root.join("cars_annos.mat")).unwrap();
    let cars = cub_cars::load_cars(root).unwrap();
    // Classes 1, 1, 2, 3, 4, 4: the first two classes train, the last two test.
    assert_eq!(rows(&cars.train), vec![vec![1], vec![1], vec![2]]);
    assert_eq!(rows(&cars.test), vec![vec![3], vec![4], vec![4]]);
    assert_eq!(cars.train.paths()[0], root.join("car_ims/000001.jpg"));
    assert_eq!(cars.test.paths()[2], root.join("car_ims/000006.jpg"));

    let bytes = fs::read(fixture("cars_annos.mat")).unwrap();
    fs::write(root.join("cars_annos.mat"), &bytes[..bytes.len() - 40]).unwrap();
    let e = err_text(cub_cars::load_cars(root));
    assert!(
        e.contains("cars_annos.mat") && e.contains("MAT-file"),
        "{e}"
    );
}

// ---------------------------------------------------------------- In-Shop

const PARTITION: &str = "7\n\
image_name item_id evaluation_status\n\
img/WOMEN/Dresses/id_00000002/02_1_front.jpg id_00000002 train\n\
img/WOMEN/Dresses/id_00000002/02_2_side.jpg id_00000002 train\n\
img/MEN/Denim/id_00000080/01_1_front.jpg id_00000080 train\n\
img/WOMEN/Dresses/id_00000007/01_1_front.jpg id_00000007 query\n\
img/WOMEN/Dresses/id_00000007/01_2_side.jpg id_00000007 gallery\n\
img/MEN/Denim/id_00000090/01_1_front.jpg id_00000090 query\n\
img/MEN/Denim/id_00000090/01_4_full.jpg id_00000090 gallery\n";

#[test]
fn inshop_reads_train_query_gallery() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "Eval/list_eval_partition.txt", PARTITION);
    let s = inshop::load(root).unwrap();
    // Categories sorted: MEN/Denim = 0, WOMEN/Dresses = 1.
    assert_eq!(rows(&s.train), vec![vec![2, 1], vec![2, 1], vec![80, 0]]);
    assert_eq!(rows(&s.test.query), vec![vec![7, 1], vec![90, 0]]);
    assert_eq!(rows(&s.test.gallery), vec![vec![7, 1], vec![90, 0]]);
    assert_eq!(
        s.test.query.paths()[0],
        root.join("Img/img/WOMEN/Dresses/id_00000007/01_1_front.jpg")
    );

    // Flattened layout.
    let flat = tempfile::tempdir().unwrap();
    write(flat.path(), "list_eval_partition.txt", PARTITION);
    let f = inshop::load(flat.path()).unwrap();
    assert_eq!(
        f.train.paths()[2],
        flat.path().join("img/MEN/Denim/id_00000080/01_1_front.jpg")
    );

    let list = "Eval/list_eval_partition.txt";
    write(
        root,
        list,
        PARTITION.replace("id_00000080 train", "id_00000080 val"),
    );
    let e = err_text(inshop::load(root));
    assert!(
        e.contains("list_eval_partition.txt:5") && e.contains("evaluation_status"),
        "{e}"
    );
    write(root, list, PARTITION.replacen('7', "8", 1));
    let e = err_text(inshop::load(root));
    assert!(
        e.contains("list_eval_partition.txt:1") && e.contains("announces 8"),
        "{e}"
    );
    write(
        root,
        list,
        PARTITION.replace("id_00000080 train", "80 train"),
    );
    let e = err_text(inshop::load(root));
    assert!(
        e.contains("list_eval_partition.txt:5") && e.contains("item_id"),
        "{e}"
    );
    let moved = PARTITION.replace(
        "img/MEN/Denim/id_00000090/01_4_full.jpg",
        "img/WOMEN/Denim/id_00000090/01_4_full.jpg",
    );
    write(root, list, moved);
    let e = err_text(inshop::load(root));
    assert!(
        e.contains("list_eval_partition.txt:9") && e.contains("line 8"),
        "{e}"
    );
}

// ---------------------------------------------------------------- VehicleID

#[test]
fn vehicleid_reads_train_and_three_test_sets() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(
        root,
        "train_test_split/train_list.txt",
        "0000002 0\n0000003 0\n0004519 12\n",
    );
    write(
        root,
        "train_test_split/test_list_800.txt",
        "0000010 5\n0000011 5\n",
    );
    write(
        root,
        "train_test_split/test_list_1600.txt",
        "0000010 5\n0000012 6\n0000013 6\n",
    );
    write(root, "train_test_split/test_list_2400.txt", "0000014 7\n");
    let v = vehicleid::load(root).unwrap();
    assert_eq!(rows(&v.train), vec![vec![0], vec![0], vec![12]]);
    assert_eq!(v.train.paths()[2], root.join("image/0004519.jpg"));
    assert_eq!(v.test[0].len(), 2);
    assert_eq!(v.test[1].len(), 3);
    assert_eq!(v.test[2].len(), 1);
    let medium = vehicleid::load_test(root, vehicleid::TestSize::Medium).unwrap();
    assert_eq!(medium, v.test[1]);

    write(
        root,
        "train_test_split/test_list_2400.txt",
        "0000014 7\n0000015 seven\n",
    );
    let e = err_text(vehicleid::load(root));
    assert!(
        e.contains("test_list_2400.txt:2") && e.contains("vehicle_id"),
        "{e}"
    );
}

// ---------------------------------------------------------------- iNaturalist 2018

fn category(id: i64, genus: &str, family: &str, order: &str) -> String {
    format!(
        r#"{{"id": {id}, "name": "sp{id}", "supercategory": "S", "kingdom": "Animalia",
            "phylum": "Chordata", "class": "Aves", "order": "{order}", "family": "{family}",
            "genus": "{genus}"}}"#
    )
}

fn inat_fixture(root: &Path) {
    write(
        root,
        "Inat_dataset_splits/Inaturalist_train_set1.txt",
        "train_val2018/Aves/10/a.jpg\ntrain_val2018/Aves/10/b.jpg\ntrain_val2018/Aves/11/c.jpg\n\
         train_val2018/Plantae/20/d.jpg\n",
    );
    write(
        root,
        "Inat_dataset_splits/Inaturalist_test_set1.txt",
        "train_val2018/Aves/12/e.jpg\ntrain_val2018/Insecta/30/f.jpg\n",
    );
    let plant = r#"{"id": 20, "name": "sp20", "supercategory": "Plantae", "kingdom": "Plantae",
        "phylum": "Tracheophyta", "class": "Magnoliopsida", "order": "Rosales",
        "family": "Moraceae", "genus": "Morus"}"#;
    let insect = r#"{"id": 30, "name": "sp30", "supercategory": "Insecta", "kingdom": "Animalia",
        "phylum": "Arthropoda", "class": "Insecta", "order": "Diptera", "family": "Muscidae",
        "genus": "Musca"}"#;
    let cats = [
        category(10, "Morus", "Sulidae", "Suliformes"),
        category(11, "Sula", "Sulidae", "Suliformes"),
        category(12, "Corvus", "Corvidae", "Passeriformes"),
        plant.to_string(),
        insect.to_string(),
    ];
    let json = format!(
        r#"{{"info": {{"year": 2018}}, "images": [{{"id": 1, "file_name": "x"}}],
            "annotations": [], "categories": [{}], "licenses": []}}"#,
        cats.join(",")
    );
    write(root, "train2018.json", json);
}

#[test]
fn inaturalist_base_uses_the_folder_super_category() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    inat_fixture(root);
    let s = inaturalist::load(root, &inaturalist::InatConfig::base()).unwrap();
    // Super-categories sorted over both splits: Aves 0, Insecta 1, Plantae 2.
    assert_eq!(
        rows(&s.train),
        vec![vec![10, 0], vec![10, 0], vec![11, 0], vec![20, 2]]
    );
    assert_eq!(rows(&s.test), vec![vec![12, 0], vec![30, 1]]);
    assert_eq!(s.train.paths()[0], root.join("train_val2018/Aves/10/a.jpg"));
}

#[test]
fn inaturalist_full_builds_seven_levels_and_keeps_homonyms_apart() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    inat_fixture(root);
    let s = inaturalist::load(root, &inaturalist::InatConfig::full()).unwrap();
    assert_eq!(s.train.labels().num_levels(), 7);
    let gannet = s.train.labels().row(0).to_vec();
    let booby = s.train.labels().row(2).to_vec();
    let mulberry = s.train.labels().row(3).to_vec();
    // Gannet and booby: different genus, same family, order, class, phylum, kingdom.
    assert_ne!(gannet[1], booby[1]);
    assert_eq!(gannet[2..], booby[2..]);
    // The bird genus Morus and the plant genus Morus are two genera.
    assert_ne!(gannet[1], mulberry[1]);
    assert_ne!(gannet[6], mulberry[6]);
    // Keyed by name alone (HAPPIER's code) the homonym breaks the tree.
    let by_name = inaturalist::InatConfig {
        taxon_key: inaturalist::TaxonKey::Name,
        ..inaturalist::InatConfig::full()
    };
    let e = err_text(inaturalist::load(root, &by_name));
    assert!(
        e.contains("Inaturalist_train_set1.txt") && e.contains("hierarchy"),
        "{e}"
    );

    // The bare list of categories.json gives the same labels.
    let json = fs::read_to_string(root.join("train2018.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    fs::remove_file(root.join("train2018.json")).unwrap();
    write(root, "categories.json", v["categories"].to_string());
    let t = inaturalist::load(root, &inaturalist::InatConfig::full()).unwrap();
    assert_eq!(t, s);
}

#[test]
fn inaturalist_errors_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    inat_fixture(root);
    let list = "Inat_dataset_splits/Inaturalist_test_set1.txt";
    write(
        root,
        list,
        "train_val2018/Aves/12/e.jpg\ntrain_val2018/Aves/99/g.jpg\n",
    );
    let e = err_text(inaturalist::load(root, &inaturalist::InatConfig::full()));
    assert!(
        e.contains("Inaturalist_test_set1.txt:2") && e.contains("category 99"),
        "{e}"
    );
    write(root, list, "train_val2018/Aves/12/e.jpg\n\ne.jpg\n");
    let e = err_text(inaturalist::load(root, &inaturalist::InatConfig::base()));
    assert!(e.contains("Inaturalist_test_set1.txt:3"), "{e}");
    write(root, list, "train_val2018/Aves/twelve/e.jpg\n");
    let e = err_text(inaturalist::load(root, &inaturalist::InatConfig::base()));
    assert!(
        e.contains("Inaturalist_test_set1.txt:1") && e.contains("category id"),
        "{e}"
    );
    write(
        root,
        "train2018.json",
        r#"{"categories": [{"id": 10, "genus": "x"}]}"#,
    );
    write(root, list, "train_val2018/Aves/10/e.jpg\n");
    let e = err_text(inaturalist::load(root, &inaturalist::InatConfig::full()));
    assert!(
        e.contains("train2018.json") && e.contains("'family'"),
        "{e}"
    );
}

// ---------------------------------------------------------------- DyML

/// The distributed header has no line break before the first data row (module doc of `dyml`).
const DYML_TRAIN: &str = "fname, coarse_id, middle_id, fine_id0.jpg, 0, 3, 100\n\
1.jpg, 0, 3, 100\n\
2.jpg, 0, 3, 101\n\
3.jpg, 1, 4, 102\n";

#[test]
fn dyml_train_recovers_the_row_glued_to_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "train/label.csv", DYML_TRAIN);
    let keep = dyml::load_train(root, dyml::GluedRow::Keep).unwrap();
    assert_eq!(
        rows(&keep),
        vec![
            vec![100, 3, 0],
            vec![100, 3, 0],
            vec![101, 3, 0],
            vec![102, 4, 1]
        ]
    );
    assert_eq!(keep.paths()[0], root.join("train/imgs/0.jpg"));
    let drop = dyml::load_train(root, dyml::GluedRow::Drop).unwrap();
    assert_eq!(drop.len(), 3);
    assert_eq!(drop.paths()[0], root.join("train/imgs/1.jpg"));

    // A clean header (with its line break) in another column order reads the same.
    write(
        root,
        "train/label.csv",
        "fname, fine_id, middle_id, coarse_id\n0.jpg, 100, 3, 0\n",
    );
    let clean = dyml::load_train(root, dyml::GluedRow::Drop).unwrap();
    assert_eq!(rows(&clean), vec![vec![100, 3, 0]]);

    write(
        root,
        "train/label.csv",
        DYML_TRAIN.replace("2.jpg, 0, 3, 101", "2.jpg, 0, 101"),
    );
    let e = err_text(dyml::load_train(root, dyml::GluedRow::Keep));
    assert!(
        e.contains("label.csv:3") && e.contains("4 comma-separated"),
        "{e}"
    );
    write(root, "train/label.csv", DYML_TRAIN.replace("fname", "file"));
    let e = err_text(dyml::load_train(root, dyml::GluedRow::Keep));
    assert!(e.contains("label.csv:1") && e.contains("'file'"), "{e}");
}

#[test]
fn dyml_test_scales_and_product_test() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for (k, scale) in ["fine", "middle", "coarse"].iter().enumerate() {
        write(
            root,
            &format!("bmk_{scale}/query.csv"),
            format!("fname, labels0.jpg, {k}\n1.jpg, {k}\n"),
        );
        write(
            root,
            &format!("bmk_{scale}/gallery.csv"),
            format!("fname, labels0.jpg, {k}\n1.jpg, 9\n2.jpg, {k}\n"),
        );
    }
    let scales = dyml::load_test_scales(root, dyml::GluedRow::Keep).unwrap();
    assert_eq!(scales.len(), 3);
    assert_eq!(scales[1].scale, "middle");
    assert_eq!(rows(&scales[1].sets.query), vec![vec![1], vec![1]]);
    assert_eq!(
        rows(&scales[2].sets.gallery),
        vec![vec![2], vec![9], vec![2]]
    );
    assert_eq!(
        scales[0].sets.gallery.paths()[2],
        root.join("bmk_fine/gallery/2.jpg")
    );
    let dropped = dyml::load_test_scales(root, dyml::GluedRow::Drop).unwrap();
    assert_eq!(dropped[0].sets.query.len(), 1);

    write(root, "mini-bmk_all_in_one/label.csv", DYML_TRAIN);
    let p = dyml::load_product_test(root, dyml::GluedRow::Keep).unwrap();
    assert_eq!(p.len(), 4);
    assert_eq!(p.paths()[3], root.join("mini-bmk_all_in_one/imgs/3.jpg"));

    write(
        root,
        "bmk_middle/query.csv",
        "fname, labels0.jpg, 1\n1.jpg, one\n",
    );
    let e = err_text(dyml::load_test_scales(root, dyml::GluedRow::Keep));
    assert!(e.contains("query.csv:2") && e.contains("labels"), "{e}");
}

// ---------------------------------------------------------------- revisited Oxford / Paris

fn check_gnd(d: &revisited::RevisitedDataset, images: &Path) {
    assert_eq!(d.database.len(), 6);
    assert_eq!(d.database[0], images.join("all_souls_000000.jpg"));
    assert_eq!(d.queries[2], images.join("bodleian_000107.jpg"));
    assert_eq!(d.ground_truth.len(), 3);
    assert_eq!(d.ground_truth[0].easy, vec![0, 1]);
    assert_eq!(d.ground_truth[0].hard, vec![5]);
    assert_eq!(d.ground_truth[0].junk, vec![2]);
    assert_eq!(d.ground_truth[1].junk, vec![3, 4]);
    assert!(d.ground_truth[2].easy.is_empty());
    assert_eq!(d.query_boxes[0], [136.5, 34.1, 648.5, 955.7]);
    assert_eq!(d.query_boxes[1], [0.0, 0.0, 10.0, 20.25]);
}

#[test]
fn revisited_reads_the_pickled_ground_truth_of_any_protocol() {
    for name in [
        "gnd_p2.pkl",
        "gnd_p3.pkl",
        "gnd_p4.pkl",
        "gnd_numpy_p2.pkl",
        "gnd_numpy_p4.pkl",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("rparis6k")).unwrap();
        fs::copy(fixture(name), root.join("rparis6k/gnd_rparis6k.pkl")).unwrap();
        let d = revisited::load(root, revisited::Landmarks::Paris6k)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        check_gnd(&d, &root.join("rparis6k/jpg"));
    }
}

#[test]
fn revisited_reads_the_older_matlab_ground_truth() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("roxford5k")).unwrap();
    fs::copy(
        fixture("gnd_mat.mat"),
        root.join("roxford5k/gnd_roxford5k.mat"),
    )
    .unwrap();
    let d = revisited::load(root, revisited::Landmarks::Oxford5k).unwrap();
    check_gnd(&d, &root.join("roxford5k/jpg"));
}

#[test]
fn revisited_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("roxford5k")).unwrap();
    let bytes = fs::read(fixture("gnd_p3.pkl")).unwrap();
    fs::write(
        root.join("roxford5k/gnd_roxford5k.pkl"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let e = err_text(revisited::load(root, revisited::Landmarks::Oxford5k));
    assert!(
        e.contains("gnd_roxford5k.pkl") && e.contains("pickle"),
        "{e}"
    );

    // An index outside the database.
    let mut v = pickle::parse_pickle(&bytes).unwrap();
    if let pickle::PickleValue::Dict(entries) = &mut v {
        for (k, val) in entries.iter_mut() {
            if k.as_str() == Some("imlist") {
                if let pickle::PickleValue::List(l) = val {
                    l.truncate(5);
                }
            }
        }
    }
    let e = revisited::parse_ground_truth(&v, Path::new("jpg")).unwrap_err();
    assert!(e.contains("gnd[0]['hard']") && e.contains("index 5"), "{e}");
}

// ---------------------------------------------------------------- few-shot sets

fn touch_images(root: &Path, part: &str, class: &str, n: usize) {
    for i in 0..n {
        write(root, &format!("{part}/{class}/{class}_{i:03}.jpg"), b"jpg");
    }
}

#[test]
fn fewshot_class_folders_give_disjoint_parts() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch_images(root, "train", "n01532829", 3);
    touch_images(root, "train", "n01558993", 2);
    touch_images(root, "val", "n01855672", 2);
    touch_images(root, "test", "n01930112", 2);
    touch_images(root, "test", "n01981276", 1);
    write(root, "train/.DS_Store", b"");
    let s = fewshot_sets::load_folders(root).unwrap();
    assert_eq!(
        rows(&s.base),
        vec![vec![0], vec![0], vec![0], vec![1], vec![1]]
    );
    assert_eq!(rows(&s.val), vec![vec![2], vec![2]]);
    assert_eq!(rows(&s.novel), vec![vec![3], vec![3], vec![4]]);
    assert_eq!(
        s.base.paths()[0],
        root.join("train/n01532829/n01532829_000.jpg")
    );

    write(root, "val/n01855672/notes.txt", b"?");
    let e = err_text(fewshot_sets::load_folders(root));
    assert!(e.contains("notes.txt"), "{e}");
    fs::remove_file(root.join("val/n01855672/notes.txt")).unwrap();
    touch_images(root, "val", "n01532829", 1);
    let e = err_text(fewshot_sets::load_folders(root));
    assert!(
        e.contains("n01532829") && e.contains("train and val"),
        "{e}"
    );
}

#[test]
fn fewshot_ravi_csv_and_cifar_fs_lists() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(
        root,
        "train.csv",
        "filename,label\nn0153282900000005.jpg,n01532829\nn0155899300000001.jpg,n01558993\n",
    );
    write(
        root,
        "val.csv",
        "filename,label\nn0185567200000003.jpg,n01855672\n",
    );
    write(
        root,
        "test.csv",
        "filename,label\nn0193011200000002.jpg,n01930112\n",
    );
    let s = fewshot_sets::load_ravi_csv(root).unwrap();
    assert_eq!(rows(&s.base), vec![vec![0], vec![1]]);
    assert_eq!(rows(&s.novel), vec![vec![3]]);
    assert_eq!(s.val.paths()[0], root.join("images/n0185567200000003.jpg"));
    write(root, "val.csv", "filename,label\nn0185567200000003.jpg\n");
    let e = err_text(fewshot_sets::load_ravi_csv(root));
    assert!(e.contains("val.csv:2"), "{e}");

    let c = tempfile::tempdir().unwrap();
    let croot = c.path();
    for class in ["apple", "bear", "cloud", "dolphin"] {
        touch_images(croot, "images", class, 2);
    }
    write(croot, "splits/train.txt", "apple\nbear\n");
    write(croot, "splits/val.txt", "cloud\n");
    write(croot, "splits/test.txt", "dolphin\n");
    let s = fewshot_sets::load_split_lists(croot.join("images"), croot.join("splits")).unwrap();
    assert_eq!(s.base.len(), 4);
    assert_eq!(rows(&s.novel), vec![vec![3], vec![3]]);
    write(croot, "splits/test.txt", "dolphin\nwhale\n");
    let e = err_text(fewshot_sets::load_split_lists(
        croot.join("images"),
        croot.join("splits"),
    ));
    assert!(e.contains("test.txt:2") && e.contains("whale"), "{e}");
}

#[test]
fn fewshot_validation_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let ep = r#"[{"Support": [["a/1.jpg"], ["b/1.jpg"]], "Query": [["a/2.jpg", "a/3.jpg"], ["b/2.jpg", "b/3.jpg"]]},
                 {"Support": [["c/1.jpg"], ["a/1.jpg"]], "Query": [["c/2.jpg", "c/3.jpg"], ["a/4.jpg", "a/5.jpg"]]}]"#;
    let json = write(root, "val1000Episode_5_way_1_shot_15_query.json", ep);
    let eps = fewshot_sets::load_val_episodes(&json, root.join("val")).unwrap();
    assert_eq!(eps.len(), 2);
    assert_eq!(eps[1].support[0][0], root.join("val/c/1.jpg"));
    assert_eq!(eps[0].query[1].len(), 2);
    let bad = ep.replace(r#"["a/4.jpg", "a/5.jpg"]"#, r#"["a/4.jpg"]"#);
    write(root, "val1000Episode_5_way_1_shot_15_query.json", bad);
    let e = err_text(fewshot_sets::load_val_episodes(&json, root.join("val")));
    assert!(e.contains("episode 1"), "{e}");
}

// ---------------------------------------------------------------- Fashion-MNIST (IDX)

fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b.extend_from_slice(data);
    b
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
fn fashion_mnist_decodes_idx_files_gzipped_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let pixels: Vec<u8> = (0..3 * 2 * 4).map(|v| (v * 10) as u8).collect();
    write(
        root,
        "train-images-idx3-ubyte.gz",
        gz(&idx(&[3, 2, 4], &pixels)),
    );
    write(
        root,
        "train-labels-idx1-ubyte.gz",
        gz(&idx(&[3], &[9, 0, 4])),
    );
    write(
        root,
        "t10k-images-idx3-ubyte",
        idx(&[1, 2, 4], &pixels[..8]),
    );
    write(root, "t10k-labels-idx1-ubyte", idx(&[1], &[7]));
    let f = fashion_mnist::load(root).unwrap();
    assert_eq!(f.train.len(), 3);
    assert_eq!(f.train.image_shape(), (1, 2, 4));
    assert_eq!(f.train.labels().column(0), vec![9, 0, 4]);
    assert_eq!(f.train.image(1)[0], 80.0 / 255.0);
    assert_eq!(f.test.len(), 1);
    assert_eq!(f.test.labels().fine(0), 7);

    write(root, "t10k-labels-idx1-ubyte", idx(&[1], &[10]));
    let e = err_text(fashion_mnist::load(root));
    assert!(
        e.contains("t10k-labels-idx1-ubyte") && e.contains("label 10"),
        "{e}"
    );
    write(root, "t10k-labels-idx1-ubyte", idx(&[2], &[1, 2]));
    let e = err_text(fashion_mnist::load(root));
    assert!(e.contains("2 labels for 1 images"), "{e}");
    write(
        root,
        "train-images-idx3-ubyte.gz",
        gz(&idx(&[3, 2, 4], &pixels[..20])),
    );
    let e = err_text(fashion_mnist::load(root));
    assert!(
        e.contains("train-images-idx3-ubyte.gz") && e.contains("need 24 bytes"),
        "{e}"
    );
    fs::remove_file(root.join("train-labels-idx1-ubyte.gz")).unwrap();
    let e = err_text(fashion_mnist::load(root));
    assert!(e.contains("train-labels-idx1-ubyte"), "{e}");
}

/// Runs only where Debian's `dataset-fashion-mnist` is installed (it is not required).
#[test]
fn fashion_mnist_debian_package_when_installed() {
    let root = Path::new(fashion_mnist::DEBIAN_ROOT);
    if !root.join("train-images-idx3-ubyte.gz").is_file() {
        eprintln!("{} not installed; skipped", root.display());
        return;
    }
    let f = fashion_mnist::load(root).unwrap();
    assert_eq!((f.train.len(), f.test.len()), (60_000, 10_000));
    assert_eq!(f.train.image_shape(), (1, 28, 28));
    for (set, per_class) in [(&f.train, 6_000), (&f.test, 1_000)] {
        let mut counts = [0usize; 10];
        for c in set.labels().column(0) {
            counts[c as usize] += 1;
        }
        assert_eq!(counts, [per_class; 10]);
    }
}

// ---------------------------------------------------------------- pickle reader

#[test]
fn pickle_reads_every_plain_type_in_every_protocol() {
    use pickle::PickleValue as V;
    for p in 0..=5 {
        let v = pickle::read_pickle(fixture(&format!("kitchen_p{p}.pkl")))
            .unwrap_or_else(|e| panic!("protocol {p}: {e}"));
        assert_eq!(v.get("none"), Some(&V::None), "protocol {p}");
        assert_eq!(v.get("t").unwrap().as_i64(), Some(1));
        assert_eq!(v.get("f"), Some(&V::Bool(false)));
        let ints: Vec<i64> = v
            .get("ints")
            .unwrap()
            .as_list()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect();
        assert_eq!(
            ints,
            vec![
                0,
                255,
                256,
                65535,
                65536,
                -1,
                -(1 << 31),
                1 << 31,
                i64::MAX,
                i64::MIN
            ],
            "protocol {p}"
        );
        let floats: Vec<f64> = v
            .get("floats")
            .unwrap()
            .as_list()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(
            floats,
            vec![0.5, -1e-300, 1e300, f64::INFINITY],
            "protocol {p}"
        );
        let text: Vec<&str> = v
            .get("text")
            .unwrap()
            .as_list()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert_eq!(
            text,
            vec!["", "ascii", "café — 😀", "back\\slash\nnewline"],
            "protocol {p}"
        );
        assert_eq!(
            v.get("bytes"),
            Some(&V::List(vec![
                V::Bytes(vec![]),
                V::Bytes(b"\x00\xff\x80abc".to_vec())
            ])),
            "protocol {p}"
        );
        assert_eq!(
            v.get("tuple"),
            Some(&V::Tuple(vec![
                V::Int(1),
                V::Tuple(vec![V::Int(2), V::Int(3)]),
                V::Tuple(vec![])
            ]))
        );
        assert_eq!(v.get("set"), Some(&V::Set(vec![V::Int(3)])), "protocol {p}");
        let shared = v.get("shared").unwrap().as_list().unwrap();
        assert_eq!(shared[0], shared[1]);
        assert_eq!(shared[0], V::List(vec![V::Int(1), V::Int(2)]));
        let c = v
            .get("nested")
            .unwrap()
            .get("a")
            .unwrap()
            .get("b")
            .unwrap()
            .as_list()
            .unwrap()[0]
            .get("c")
            .unwrap()
            .as_i64();
        assert_eq!(c, Some(1));
    }
}

#[test]
fn pickle_turns_numpy_arrays_and_scalars_into_lists_and_numbers() {
    use pickle::PickleValue as V;
    let ints = |v: &[i64]| V::List(v.iter().map(|&x| V::Int(x)).collect());
    for p in [0, 2, 4] {
        let v = pickle::read_pickle(fixture(&format!("kitchen_numpy_p{p}.pkl")))
            .unwrap_or_else(|e| panic!("protocol {p}: {e}"));
        assert_eq!(
            v.get("c2d"),
            Some(&V::List(vec![ints(&[0, 1, 2]), ints(&[3, 4, 5])])),
            "protocol {p}"
        );
        let f = |v: &[f64]| V::List(v.iter().map(|&x| V::Float(x)).collect());
        assert_eq!(
            v.get("f2d"),
            Some(&V::List(vec![f(&[0.0, 0.25, 0.5]), f(&[0.75, 1.0, 1.25])])),
            "protocol {p}: Fortran order"
        );
        assert_eq!(
            v.get("bools"),
            Some(&V::List(vec![V::Bool(true), V::Bool(false), V::Bool(true)]))
        );
        assert_eq!(v.get("u8"), Some(&ints(&[0, 200, 255])));
        assert_eq!(
            v.get("be16"),
            Some(&ints(&[-2, 300])),
            "protocol {p}: big-endian"
        );
        assert_eq!(v.get("empty"), Some(&V::List(vec![])));
        assert_eq!(v.get("i64"), Some(&V::Int(-7)));
        assert_eq!(v.get("f64"), Some(&V::Float(2.5)));
    }
}

#[test]
fn matlab_reader_reads_struct_and_cell_arrays() {
    use rankwise::data::loaders::matlab::{read_mat, MatValue};
    let m = read_mat(fixture("cars_annos.mat")).unwrap();
    let ann = m.get("annotations").unwrap();
    assert_eq!(ann.len(), 6);
    assert_eq!(
        ann.field(2, "relative_im_path")
            .unwrap()
            .as_string()
            .unwrap(),
        "car_ims/000003.jpg"
    );
    assert_eq!(ann.field(2, "bbox_x1").unwrap().as_scalar(), Some(12.0));
    assert_eq!(ann.field(5, "test").unwrap().as_scalar(), Some(1.0));
    let MatValue::Cell { items, dims } = m.get("class_names").unwrap() else {
        panic!("class_names is a cell array")
    };
    assert_eq!(dims, &vec![1, 4]);
    assert_eq!(items[3].as_string().unwrap(), "Acura TL Type-S 2008");
}

// ---------------------------------------------------------------- data_scripts/

/// The download scripts cannot run here (no internet); check that they parse, are executable,
/// and are all listed in the README.
#[test]
fn data_scripts_have_valid_syntax_and_are_documented() {
    use std::process::Command;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data_scripts");
    let readme = fs::read_to_string(dir.join("README.md")).unwrap();
    let mut scripts: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("sh" | "py")))
        .collect();
    scripts.sort();
    assert!(scripts.len() >= 12, "{scripts:?}");
    let have = |cmd: &str| Command::new(cmd).arg("--version").output().is_ok();
    for s in &scripts {
        let name = s.file_name().unwrap().to_str().unwrap();
        let is_python = name.ends_with(".py");
        if name != "common.sh" {
            assert!(
                readme.contains(&format!("`{name}`")),
                "{name} is not in the README"
            );
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = fs::metadata(s).unwrap().permissions().mode();
                assert!(mode & 0o111 != 0, "{name} is not executable");
            }
        }
        let (cmd, args): (&str, Vec<String>) = if is_python {
            // Like `python3 -m py_compile`, without writing a __pycache__ folder.
            let code = "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')";
            (
                "python3",
                vec!["-c".into(), code.into(), s.display().to_string()],
            )
        } else {
            ("bash", vec!["-n".into(), s.display().to_string()])
        };
        if !have(cmd) {
            eprintln!("{cmd} not installed; syntax of {name} not checked");
            continue;
        }
        let out = Command::new(cmd).args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
