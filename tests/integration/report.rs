//! The `report` module end to end: the published CSVs of the repository, the paper-vs-ours
//! tables written to disk, and one figure of every kind rendered to PNG and SVG.
//!
//! Set `RANKWISE_FIGURE_DIR` to keep the rendered figures there (to look at them); by default
//! they go to a temporary folder.

use rankwise::metrics::fewshot::accuracy_interval;
use rankwise::metrics::hierarchical_pr_curve;
use rankwise::metrics::pr_curve::{mean_interpolated_precision, recall_levels};
use rankwise::metrics::precision_recall_curve;
use rankwise::report::*;
use rankwise::train::MetricsLog;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn load(paper: &str) -> Published {
    Published::for_key(published_dir(), paper).unwrap()
}

fn counts(p: &Published) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in p.rows() {
        *m.entry(r.table.clone()).or_insert(0) += 1;
    }
    m
}

fn value(
    p: &Published,
    table: &str,
    method: &str,
    dataset: &str,
    metric: &str,
    setting: &str,
) -> f64 {
    p.get(table, method, dataset, metric, setting)
        .unwrap_or_else(|| panic!("no {table}/{method}/{dataset}/{metric}/{setting}"))
        .value
}

fn expect_counts(p: &Published, want: &[(&str, usize)]) {
    let want: BTreeMap<String, usize> = want.iter().map(|(t, n)| (t.to_string(), *n)).collect();
    assert_eq!(counts(p), want, "{}", p.path().display());
}

#[test]
fn happier_csv_has_every_table_of_the_digest() {
    let p = load("happier");
    // Table 1: 10 methods × 3 datasets × 3 metrics; Table 2: 8 × 3 × 3; Table 3: 8 × 6;
    // Table 4: 8 × 8; Table 9: the two values the seed kept; Fig. 4: table values at the
    // default and HAPPIER_F settings.
    expect_counts(
        &p,
        &[
            ("Table 1", 90),
            ("Table 2", 72),
            ("Table 3", 48),
            ("Table 4", 64),
            ("Table 5", 3),
            ("Table 6", 6),
            ("Table 9", 2),
            ("Fig. 4a", 2),
            ("Fig. 4b", 2),
        ],
    );
    assert_eq!(value(&p, "Table 1", "HAPPIER", "SOP", "H-AP", ""), 59.4);
    assert_eq!(
        value(&p, "Table 1", "TL_SH [57]", "iNat-full", "NDCG", ""),
        89.8
    );
    let r = p.get("Table 2", "TL_SH [57]", "DyML-P", "mAP", "").unwrap();
    assert_eq!((r.printed.as_str(), r.decimals()), ("36.32", 2));
    assert_eq!(
        value(&p, "Table 4", "HAPPIER_F", "iNat-full", "Kingdom AP", ""),
        83.1
    );
    assert_eq!(
        value(
            &p,
            "Table 5",
            "HAPPIER",
            "iNat-base",
            "H-AP",
            "surrogate=ours;clustering=off"
        ),
        53.1
    );
    // The garbled rows of Table 3 are flagged, and only those there.
    let t3 = p.table("Table 3");
    let flagged: Vec<&str> = t3
        .iter()
        .filter(|r| r.is_uncertain())
        .map(|r| r.method.as_str())
        .collect();
    assert_eq!(flagged.len(), 12);
    assert!(flagged.iter().all(|m| m.starts_with("HAPPIER")));
    assert!(p.rows().iter().all(|r| r.unit == Unit::Percent));
}

#[test]
fn smooth_ap_csv_has_every_table_of_the_digest() {
    let p = load("smooth_ap");
    expect_counts(
        &p,
        &[
            ("Table 2", 31),
            ("Table 3 left", 28),
            ("Table 3 right", 24),
            ("Table 4", 16),
            ("Table 5 tau", 6),
            ("Table 5 positives", 6),
            ("Table 5 batch", 6),
            ("Table S1", 6),
        ],
    );
    assert_eq!(
        value(&p, "Table 2", "Smooth-AP", "SOP", "R@1", "batch=384"),
        80.1
    );
    assert_eq!(
        value(
            &p,
            "Table 3 right",
            "Smooth-AP",
            "iNaturalist",
            "R@1",
            "batch=384"
        ),
        67.2
    );
    assert_eq!(
        value(
            &p,
            "Table 3 left",
            "Smooth-AP",
            "VehicleID Large",
            "R@5",
            "batch=384"
        ),
        96.2
    );
    let r = p
        .get("Table 5 tau", "Smooth-AP", "IJB-C", "mAP", "tau=0.001")
        .unwrap();
    assert_eq!(
        (r.value, r.unit, r.printed.as_str()),
        (0.733, Unit::Fraction, "0.733")
    );
    assert_eq!(
        p.get("Table S1", "Smooth-AP", "SOP", "loss time", "batch=112")
            .unwrap()
            .unit,
        Unit::Milliseconds
    );
    // MIC printed no R@1000: no row, not a zero.
    assert!(p.get("Table 2", "MIC [56]", "SOP", "R@1000", "").is_none());
}

#[test]
fn fastap_rambo_and_ssr_csvs_have_every_table_of_the_digest() {
    let f = load("fastap");
    expect_counts(&f, &[("Poster", 83)]);
    let m96 = "backbone=ResNet-50;batch=96;dim=512";
    let m256 = "backbone=ResNet-50;batch=256;dim=512";
    assert_eq!(value(&f, "Poster", "FastAP", "SOP", "R@1", m96), 75.8);
    assert_eq!(value(&f, "Poster", "FastAP", "SOP", "R@1", m256), 76.4);
    assert_eq!(
        value(&f, "Poster", "FastAP", "VehicleID Medium", "R@5", m256),
        95.9
    );

    let r = load("rambo");
    expect_counts(
        &r,
        &[
            ("Table 2", 64),
            ("Table 3", 72),
            ("Table 4", 49),
            ("Table 5", 8),
            ("Table 6", 8),
            ("Table 7", 7),
            ("Table 8", 5),
        ],
    );
    let r50 = "backbone=R50;dim=512";
    assert_eq!(
        value(&r, "Table 2", "RaMBO log log", "SOP", "R@1", r50),
        78.6
    );
    assert_eq!(
        value(&r, "Table 7", "RaMBO", "SOP", "R@1", "memory=off"),
        72.4
    );
    assert!(
        r.get("Table 7", "RaMBO", "SOP", "R@1", "margin=off")
            .is_none(),
        "printed x"
    );
    let t6 = r.get(
        "Table 6",
        "RaMBO AP loss",
        "",
        "forward+backward time",
        "length=100M;device=CPU",
    );
    assert_eq!(t6.map(|x| (x.value, x.unit)), Some((36.4, Unit::Seconds)));
    let python = r.get(
        "Table 4",
        "FastAP-Python [5]",
        "In-Shop",
        "R@1",
        "backbone=R50;dim=512",
    );
    assert!(python.unwrap().is_uncertain(), "printed with '?'");

    let s = load("ssr");
    expect_counts(
        &s,
        &[
            ("Table 1", 164),
            ("Table 2", 252),
            ("Table 3", 8),
            ("Table 4", 10),
        ],
    );
    assert_eq!(
        value(
            &s,
            "Table 1",
            "Feat + SSR",
            "SOP",
            "mAP@R",
            "feature=PNCA++"
        ),
        60.6
    );
    assert_eq!(
        value(
            &s,
            "Table 1",
            "k-reciprocal [75] † + SSR",
            "rParis6K",
            "mAP Hard",
            "feature=[17]"
        ),
        75.9
    );
    let wrn = "backbone=WRN-28-10";
    assert_eq!(
        value(
            &s,
            "Table 2",
            "+ Ours",
            "mini-ImageNet",
            "1-shot accuracy",
            wrn
        ),
        72.4
    );
    assert_eq!(
        value(&s, "Table 2", "+ Ours", "mini-ImageNet", "1-shot CI95", wrn),
        0.6
    );
    assert_eq!(
        value(
            &s,
            "Table 3",
            "w.o local sort",
            "CARS",
            "mAP@R",
            "feature=GL;N=100"
        ),
        32.2
    );
}

#[test]
fn comparison_tables_are_written_with_their_scale() {
    let p = load("smooth_ap");
    let quick = Provenance::new(
        "embedded shapes",
        "quick",
        "3,840 test queries, small CNN, 5 epochs",
    );
    let measured = vec![
        Measured::new(
            "Table 5 batch",
            "Smooth-AP",
            "VGGFace2-Test",
            "mAP",
            0.61,
            Unit::Fraction,
            quick.clone(),
        )
        .with_setting("batch=64"),
        Measured::new(
            "Table 5 batch",
            "Smooth-AP",
            "VGGFace2-Test",
            "mAP",
            0.64,
            Unit::Fraction,
            quick.clone(),
        )
        .with_setting("batch=128"),
        Measured::new(
            "Table 5 batch",
            "Smooth-AP",
            "VGGFace2-Test",
            "mAP",
            0.66,
            Unit::Fraction,
            quick,
        )
        .with_setting("batch=512"),
    ];
    let c = Comparison::build(
        "Smooth-AP Table 5: batch size",
        &p.table("Table 5 batch"),
        &measured,
    )
    .unwrap();
    let long = c.to_dataframe().unwrap();
    assert_eq!(long.height(), 7, "6 published + 1 measured only");
    let dir = tempfile::tempdir().unwrap();
    let files = c
        .write(dir.path(), "smooth_ap_table5_batch", SettingPlacement::Rows)
        .unwrap();
    let md = std::fs::read_to_string(&files.md).unwrap();
    assert!(md.contains("Scale of ours: `quick`."), "{md}");
    assert!(
        md.contains("| Smooth-AP | batch=64 | 0.824 / 0.610 | 0.726 / – |"),
        "{md}"
    );
    assert!(
        md.contains("| Smooth-AP | batch=512 | – / 0.660 |  |"),
        "{md}"
    );
    let csv = std::fs::read_to_string(&files.csv).unwrap();
    assert_eq!(csv.lines().count(), 8);
    assert!(csv.contains(",ours only\n"), "{csv}");

    let sweep = Sweep::from_rows(
        "VGGFace2-Test mAP",
        c.rows()
            .iter()
            .filter(|r| r.paper_dataset == "VGGFace2-Test"),
        "batch",
    )
    .unwrap();
    assert_eq!(sweep.paper, [(64.0, 0.824), (128.0, 0.844), (256.0, 0.853)]);
    assert_eq!(sweep.ours, [(64.0, 0.61), (128.0, 0.64), (512.0, 0.66)]);
}

fn figure_dir() -> (Option<tempfile::TempDir>, PathBuf) {
    match std::env::var_os("RANKWISE_FIGURE_DIR") {
        Some(d) => (None, PathBuf::from(d)),
        None => {
            let t = tempfile::tempdir().unwrap();
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    }
}

/// Decodes the PNG header and pixels; returns (width, height, distinct colours seen).
fn check_png(path: &Path) -> (u32, u32, usize) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let mut colours: Vec<&[u8]> = buf[..info.buffer_size()].chunks(3).collect();
    colours.sort();
    colours.dedup();
    (info.width, info.height, colours.len())
}

fn check_written(files: &FigureFiles) {
    let (w, h, colours) = check_png(&files.png);
    assert_eq!((w, h), DEFAULT_SIZE, "{}", files.png.display());
    assert!(
        colours > 10,
        "{} looks blank ({colours} colours)",
        files.png.display()
    );
    let svg = std::fs::read_to_string(&files.svg).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
        "{}",
        files.svg.display()
    );
}

#[test]
fn every_figure_kind_is_written_as_png_and_svg() {
    let (_keep, dir) = figure_dir();

    // Training curves from a trainer's log.
    let mut log = MetricsLog::default();
    for e in 1..=8u64 {
        let x = e as f64;
        log.push(e, e * 10, "train", "loss_mean", None, 0.9 / x.sqrt());
        log.push(e, e * 10, "test", "R@1", Some(0), 0.1 + 0.06 * x.ln_1p());
        log.push(e, e * 10, "test", "H-AP", None, 0.2 + 0.05 * x.ln_1p());
    }
    let chart = training_curves(
        &log,
        "Training curves (made-up data)",
        "test metric",
        &[
            LogCurve::new("test", "R@1", Some(0), "R@1 (fine)"),
            LogCurve::new("test", "H-AP", None, "H-AP"),
        ],
    )
    .unwrap();
    check_written(&line_chart(&chart, &dir, "training_curves").unwrap());
    let e = training_curves(
        &log,
        "t",
        "y",
        &[LogCurve::new("test", "R@2", Some(0), "x")],
    )
    .unwrap_err();
    assert!(e.to_string().contains("test/R@2"), "{e}");

    // Precision–recall: one query's binary curve, the mean over queries, and the hierarchical one.
    let lists: Vec<Vec<u8>> = vec![
        vec![2, 2, 1, 0, 2, 1, 0, 0, 1, 2, 0, 1],
        vec![2, 0, 1, 2, 0, 0, 1, 0, 2, 0, 0, 1],
        vec![1, 2, 0, 2, 1, 0, 2, 0, 0, 1, 0, 0],
    ];
    let binary: Vec<Vec<(f64, f64)>> = lists.iter().map(|l| precision_recall_curve(l, 2)).collect();
    let mean = mean_interpolated_precision(&binary, &recall_levels(20));
    let rel = [0.0, 0.5, 1.0];
    let chart = precision_recall(
        "Precision-recall (made-up rankings)",
        vec![
            ("query 1".into(), binary[0].clone()),
            ("mean of 3 queries (interpolated)".into(), mean),
        ],
        false,
    );
    check_written(&line_chart(&chart, &dir, "precision_recall").unwrap());
    let chart = precision_recall(
        "Hierarchical precision-recall (made-up rankings)",
        lists
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("query {}", i + 1), hierarchical_pr_curve(l, &rel)))
            .collect(),
        true,
    );
    check_written(&line_chart(&chart, &dir, "hierarchical_precision_recall").unwrap());

    // Sweeps: α (linear) and batch size (log axis), paper markers beside our lines.
    let alpha = Sweep {
        name: "iNat-base fine AP".into(),
        paper: vec![(1.0, 36.7), (3.0, 37.8)],
        ours: vec![(1.0, 30.1), (2.0, 30.9), (3.0, 31.4), (5.0, 31.2)],
        // Means over seeds: drawn with error bars.
        ours_ci: vec![0.5, 0.4, 0.6, 0.3],
    };
    let lambda = Sweep {
        name: "iNat-base H-AP".into(),
        paper: vec![(0.0, 53.1), (0.1, 54.3)],
        ours: vec![
            (0.0, 40.0),
            (0.1, 41.0),
            (0.3, 41.2),
            (0.5, 40.8),
            (0.9, 38.0),
        ],
        ours_ci: vec![],
    };
    let chart = sweep(
        "HAPPIER Fig. 4a: relevance alpha (made-up ours)",
        "alpha",
        "AP (%)",
        &[alpha],
        false,
    )
    .unwrap();
    check_written(&line_chart(&chart, &dir, "sweep_alpha").unwrap());
    let chart = sweep(
        "HAPPIER Fig. 4b: lambda (made-up ours)",
        "lambda",
        "H-AP (%)",
        &[lambda],
        false,
    )
    .unwrap();
    check_written(&line_chart(&chart, &dir, "sweep_lambda").unwrap());
    let batch = [
        Sweep {
            name: "VGGFace2-Test".into(),
            paper: vec![(64.0, 0.824), (128.0, 0.844), (256.0, 0.853)],
            ours: vec![(32.0, 0.58), (64.0, 0.61), (128.0, 0.64), (256.0, 0.65)],
            ours_ci: vec![],
        },
        Sweep {
            name: "IJB-C".into(),
            paper: vec![(64.0, 0.726), (128.0, 0.736), (256.0, 0.754)],
            ours: vec![],
            ours_ci: vec![],
        },
    ];
    let chart = sweep(
        "Smooth-AP Table 5: batch size (made-up ours)",
        "batch size",
        "mAP",
        &batch,
        true,
    )
    .unwrap();
    check_written(&line_chart(&chart, &dir, "sweep_batch_size").unwrap());
    assert!(sweep(
        "empty",
        "x",
        "y",
        &[Sweep {
            name: "a".into(),
            paper: vec![],
            ours: vec![],
            ours_ci: vec![],
        }],
        false
    )
    .is_err());

    // Few-shot accuracy with 95% intervals (error bars), and a band.
    let episodes = |mean: f64, spread: f64| -> Vec<f64> {
        (0..200)
            .map(|i| mean + spread * (((i * 37) % 100) as f64 / 50.0 - 1.0))
            .collect()
    };
    let methods = vec![
        (
            "baseline".to_string(),
            vec![
                (1.0, accuracy_interval(&episodes(52.0, 20.0)).unwrap()),
                (5.0, accuracy_interval(&episodes(69.0, 15.0)).unwrap()),
            ],
        ),
        (
            "+ SSR".to_string(),
            vec![
                (1.0, accuracy_interval(&episodes(60.0, 25.0)).unwrap()),
                (5.0, accuracy_interval(&episodes(72.0, 15.0)).unwrap()),
            ],
        ),
    ];
    let mut chart = accuracy_with_intervals(
        "5-way few-shot accuracy (made-up episodes)",
        "shots",
        "accuracy (%)",
        methods,
    );
    chart.x_range = Some((0.0, 6.0));
    check_written(&line_chart(&chart, &dir, "fewshot_accuracy").unwrap());
    let band = Series::line(
        "mean ± 95% CI",
        (1..=10)
            .map(|e| (e as f64, 50.0 + (e as f64).ln() * 5.0))
            .collect(),
    )
    .with_intervals(
        (1..=10).map(|e| 4.0 / (e as f64).sqrt()).collect(),
        IntervalStyle::Band,
    );
    let chart = LineChart::new(
        "Validation accuracy over epochs (made-up)",
        "epoch",
        "accuracy (%)",
        vec![band],
    );
    check_written(&line_chart(&chart, &dir, "band").unwrap());
}

#[test]
fn bad_figures_are_errors_not_panics() {
    let (_keep, dir) = figure_dir();
    let nan = LineChart::new(
        "nan",
        "x",
        "y",
        vec![Series::line("s", vec![(0.0, f64::NAN)])],
    );
    let e = line_chart(&nan, &dir, "nan").unwrap_err().to_string();
    assert!(e.contains("non-finite") && e.contains("\"s\""), "{e}");
    let mut log_zero = LineChart::new("log", "x", "y", vec![Series::line("s", vec![(0.0, 1.0)])]);
    log_zero.log_x = true;
    assert!(line_chart(&log_zero, &dir, "log")
        .unwrap_err()
        .to_string()
        .contains("log axis"));
    let bars = Series::line("s", vec![(1.0, 1.0)]).with_intervals(vec![], IntervalStyle::Bars);
    let e = render_png(&LineChart::new("t", "x", "y", vec![bars]), DEFAULT_SIZE).unwrap_err();
    assert!(e.to_string().contains("1 points but 0 intervals"), "{e}");
    assert!(render_svg(&LineChart::new("t", "x", "y", vec![]), DEFAULT_SIZE).is_err());
    assert!(!dir.join("nan.png").exists());
}
