//! The experiments of every paper at the `tiny` scale: every row of every table trains and is
//! evaluated, every cell is a finite number in its unit, and the run cache returns the same
//! results without training again.

use rankwise::experiments::{self, ExperimentRecipe, Runner, Scale};
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn check(cells: &[rankwise::report::Measured], what: &str) {
    assert!(!cells.is_empty(), "{what}: no cell");
    for c in cells {
        if what == "rambo" && c.table == experiments::rambo::TABLE_COST {
            // RaMBO's Table 6 times the ranking on random scores, in milliseconds.
            assert_eq!(
                c.unit,
                rankwise::report::Unit::Milliseconds,
                "{what}: {c:?}"
            );
            assert!(c.value.is_finite() && c.value > 0.0, "{what}: {c:?}");
            assert_eq!(c.provenance.dataset, "random scores", "{what}: {c:?}");
            continue;
        }
        // Our metrics are fractions; the comparison converts them to the paper's unit.
        assert_eq!(c.unit, rankwise::report::Unit::Fraction, "{what}: {c:?}");
        assert!(
            c.value.is_finite() && (0.0..=1.0 + 1e-9).contains(&c.value),
            "{what}: {c:?}"
        );
        assert_eq!(c.provenance.scale, "tiny", "{what}: {c:?}");
        // RaMBO's Fig. 2 is about the metric on fixed scores: synthetic embeddings.
        let data = if c.table == experiments::rambo::FIG_2 {
            "synthetic embeddings"
        } else {
            "embedded shapes"
        };
        assert_eq!(c.provenance.dataset, data, "{what}: {c:?}");
    }
}

#[test]
fn every_experiment_runs_at_tiny_scale_and_is_cached() {
    let cache = tempfile::tempdir().unwrap();
    let runner = Runner::new(Some(cache.path().to_path_buf()), false);
    let papers: [(&str, experiments::table::MeasureFn); 4] = [
        ("smooth_ap", experiments::smooth_ap::measure),
        ("fastap", experiments::fastap::measure),
        ("rambo", experiments::rambo::measure),
        ("happier", experiments::happier::measure),
    ];
    for (paper, measure) in papers {
        let recipe = ExperimentRecipe::for_paper(root(), paper).unwrap();
        let m = measure(&runner, &recipe, Scale::Tiny).unwrap();
        check(&m.cells, paper);
        // Every row ran each of the recipe's tiny seeds; its cell is their mean.
        let seeds = recipe.seeds(Scale::Tiny).unwrap();
        assert_eq!(seeds.len(), 2, "{paper}");
        // Not trained: Fig. 2 (fixed embeddings) and Table 6 (timings) of RaMBO.
        let trained = |c: &&rankwise::report::Measured| {
            paper != "rambo"
                || (c.table != experiments::rambo::FIG_2
                    && c.table != experiments::rambo::TABLE_COST)
        };
        for c in m.cells.iter().filter(trained) {
            assert_eq!(c.samples.len(), seeds.len(), "{paper}: {c:?}");
            assert_eq!(c.provenance.seeds, seeds, "{paper}: {c:?}");
            assert_eq!(c.provenance.device, "cpu", "{paper}: {c:?}");
            assert_eq!(
                c.provenance.code,
                experiments::runs::RUN_CODE,
                "{paper}: {c:?}"
            );
            let mean = c.samples.iter().sum::<f64>() / c.samples.len() as f64;
            assert!((c.value - mean).abs() < 1e-15, "{paper}: {c:?}");
        }
        for r in &m.runs {
            let ran: Vec<u64> = r.runs.iter().map(|x| x.seed).collect();
            assert_eq!(ran, seeds, "{paper}: {} {}", r.method, r.setting);
        }
        if paper == "happier" {
            // Table 4's fine-only rows train on the same images, split and fine labels as
            // Table 3's (only the label levels differ), so their fine values are the same bits.
            use experiments::happier::{TABLE_3, TABLE_4};
            for method in ["TL_SH [57]", "NSM [59]", "Smooth-AP [2]", "ROADMAP [42]"] {
                for (t3, t4) in [("Fine R@1", "Species R@1"), ("Fine AP", "Species AP")] {
                    let three = m.sample(TABLE_3, method, "", t3).unwrap().values;
                    let six = m.sample(TABLE_4, method, "", t4).unwrap().values;
                    assert_eq!(three, six, "{method} {t3}");
                }
            }
            // Table 1 stands beside iNat-base and iNat-full, each with its own runs.
            let on = |d: &str| {
                m.sample_on("Table 1", d, "HAPPIER", "", "H-AP")
                    .unwrap()
                    .values
            };
            assert_ne!(on("iNat-base"), on("iNat-full"));
        }
        // Every run evaluated the metrics of every table column, once per table row.
        let rows: usize = m.runs.len();
        assert!(rows >= 2, "{paper}: {rows} rows");
        // A second pass is served from the cache: identical cells (the timings of RaMBO's
        // Table 6 are measured again: the same cells, other times).
        let again = measure(&runner, &recipe, Scale::Tiny).unwrap();
        let key = |c: &rankwise::report::Measured| {
            (
                c.table.clone(),
                c.method.clone(),
                c.metric.clone(),
                c.setting.clone(),
            )
        };
        assert_eq!(
            again.cells.iter().map(key).collect::<Vec<_>>(),
            m.cells.iter().map(key).collect::<Vec<_>>(),
            "{paper}"
        );
        let values = |cells: &[rankwise::report::Measured]| -> Vec<rankwise::report::Measured> {
            cells.iter().filter(trained).cloned().collect()
        };
        assert_eq!(values(&again.cells), values(&m.cells), "{paper}");
    }
    // Every claim of every paper could be checked (every row it needs was measured).
    let recipe = |p: &str| ExperimentRecipe::for_paper(root(), p).unwrap();
    let tiny = |p: &str| recipe(p).base(Scale::Tiny).unwrap();
    let claims = [
        experiments::smooth_ap::claims(
            &experiments::smooth_ap::measure(&runner, &recipe("smooth_ap"), Scale::Tiny).unwrap(),
        ),
        experiments::fastap::claims(
            &experiments::fastap::measure(&runner, &recipe("fastap"), Scale::Tiny).unwrap(),
            &tiny("fastap"),
        ),
        experiments::rambo::claims(
            &experiments::rambo::measure(&runner, &recipe("rambo"), Scale::Tiny).unwrap(),
        ),
        experiments::happier::claims(
            &experiments::happier::measure(&runner, &recipe("happier"), Scale::Tiny).unwrap(),
        ),
    ];
    for c in claims.iter().flatten() {
        assert_ne!(c.verdict, experiments::Verdict::NotMeasured, "{c:?}");
    }
    // Shared rows were trained once: fewer cached runs than table rows overall.
    let files = std::fs::read_dir(cache.path()).unwrap().count();
    assert!(files > 10, "{files} cached runs");
}

#[test]
fn recipes_parse_at_every_scale_and_paper_scale_without_section_is_a_clear_error() {
    for paper in ["smooth_ap", "fastap", "rambo", "happier"] {
        let recipe = ExperimentRecipe::for_paper(root(), paper).unwrap();
        assert_eq!(recipe.base(Scale::Quick).unwrap().epochs, 4);
        // The standard scale is the quick recipe trained longer with a cosine decay to zero at
        // the last epoch: 24 epochs fine-tuning the scale's pretrained backbone at small rates
        // (the backbone at a tenth of the pretraining's, the head at 10x the backbone's), or 16
        // from random weights where the recipe has no `[pretraining.standard]`.
        let standard = recipe.base(Scale::Standard).unwrap();
        let mut quick = recipe.base(Scale::Quick).unwrap();
        let pretraining = recipe.pretraining(Scale::Standard).unwrap();
        let epochs = if pretraining.is_some() { 24 } else { 16 };
        assert_eq!(standard.epochs, epochs, "{paper}");
        if let Some(pre) = &pretraining {
            let (backbone, head) = (&standard.optimizer.backbone, &standard.optimizer.head);
            assert!(
                (backbone.lr * 10.0 - pre.optimizer.backbone.lr).abs() < 1e-12,
                "{paper}: {backbone:?} vs {:?}",
                pre.optimizer.backbone
            );
            assert!(
                (head.lr - 10.0 * backbone.lr).abs() < 1e-12,
                "{paper}: {head:?}"
            );
            assert_eq!(
                backbone.algorithm, pre.optimizer.backbone.algorithm,
                "{paper}"
            );
            assert_eq!(head.algorithm, pre.optimizer.head.algorithm, "{paper}");
            // The pretraining's rates are the quick ones: only the fine-tuning is slowed.
            assert_eq!(pre.optimizer, quick.optimizer, "{paper}");
        }
        match &standard.schedule.decay {
            rankwise::train::schedule::Decay::Cosine { t_max, .. } => {
                assert_eq!(
                    *t_max, epochs,
                    "{paper}: the cosine must end at the last epoch"
                )
            }
            other => panic!("{paper}: standard decay {other:?}"),
        }
        quick.epochs = standard.epochs;
        quick.schedule = standard.schedule.clone();
        quick.optimizer = standard.optimizer;
        assert_eq!(
            quick, standard,
            "{paper}: standard differs from quick beyond its schedule and rates"
        );
        // At least eight seeds (five left gaps of 1-2 points inside the noise), consecutive
        // from the base seed; and the committed standard tables ran exactly these (a recipe
        // whose seeds changed without its tables being regenerated fails here).
        let seeds = recipe.seeds(Scale::Standard).unwrap();
        let consecutive: Vec<u64> = (0..seeds.len() as u64).collect();
        assert!(
            seeds.len() >= 8 && seeds == consecutive,
            "{paper}: {seeds:?}"
        );
        let listed = seeds
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(";");
        let table = root().join(format!(
            "paper_tables/standard/measured/{paper}_standard.csv"
        ));
        let mut reader = csv::Reader::from_path(&table).unwrap();
        let column = reader
            .headers()
            .unwrap()
            .iter()
            .position(|c| c == "seeds")
            .unwrap();
        assert!(
            reader
                .records()
                .any(|r| r.unwrap().get(column) == Some(listed.as_str())),
            "{}: no row ran the recipe's seeds {listed}",
            table.display()
        );
        // The committed claims were decided at the level of the recipe's looks: its note is
        // there when the verdicts were read before, and absent otherwise.
        let claims = std::fs::read_to_string(root().join(format!(
            "paper_tables/standard/measured/{paper}_standard_claims.md"
        )))
        .unwrap();
        match experiments::claim::looks_note(&recipe.seeds.looks(Scale::Standard)) {
            Some(note) => assert!(claims.contains(&note), "{paper}: missing {note}"),
            None => assert!(!claims.contains("Sequential design"), "{paper}"),
        }
        if recipe.paper.is_none() {
            let e = recipe.base(Scale::Paper).unwrap_err().to_string();
            assert!(e.contains("[paper]"), "{e}");
        }
    }
    let e = ExperimentRecipe::for_paper(root(), "no_such_paper")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no_such_paper.toml"), "{e}");
    assert!("medium".parse::<Scale>().is_err());
    assert_eq!("standard".parse::<Scale>().unwrap(), Scale::Standard);
    // SSR's standard scale: the quick recipe with a converged backbone (24 epochs fine-tuning
    // the pretrained one at the training papers' rates, 16 from random weights) and 16
    // replicates.
    let ssr = experiments::ssr::SsrRecipe::for_root(root()).unwrap();
    let standard = ssr.at(Scale::Standard).unwrap();
    let mut quick = ssr.at(Scale::Quick).unwrap();
    let (b, q) = (
        standard.backbone.as_ref().unwrap(),
        quick.backbone.as_mut().unwrap(),
    );
    let pretrains = ssr.pretraining(Scale::Standard).unwrap().is_some();
    assert_eq!((q.epochs, b.epochs), (4, if pretrains { 24 } else { 16 }));
    q.epochs = b.epochs;
    q.schedule = b.schedule.clone();
    q.optimizer = b.optimizer;
    assert_eq!(
        quick, standard,
        "SSR: standard differs from quick beyond the backbone"
    );
    assert_eq!(
        (
            ssr.seeds.count(Scale::Quick),
            ssr.seeds.count(Scale::Standard)
        ),
        (3, 16)
    );
    let mut no_standard = ssr.clone();
    no_standard.standard = None;
    let e = no_standard.at(Scale::Standard).unwrap_err().to_string();
    assert!(e.contains("[standard]"), "{e}");
    let dirs = experiments::ReproduceDirs::defaults(root(), Scale::Standard);
    assert!(dirs.tables.ends_with("paper_tables/standard"), "{dirs:?}");
    assert_eq!("Quick".parse::<Scale>().unwrap(), Scale::Quick);
}

/// A finished run holding only `metrics` (for the functions that read a run's metrics).
fn run_with(metrics: Vec<experiments::MetricValue>) -> experiments::RunResult {
    experiments::RunResult {
        label: "x".into(),
        recipe: String::new(),
        metrics,
        log: Vec::new(),
        seconds: 0.0,
        test_queries: 1,
        seed: 0,
        device: "cpu".into(),
        code: String::new(),
    }
}

#[test]
fn happier_sum_weighted_ap_follows_property_1() {
    use rankwise::experiments::MetricValue;
    let run = run_with(
        (0..3)
            .map(|l| MetricValue {
                metric: "mAP".into(),
                level: Some(l),
                value: [0.3, 0.5, 0.9][l],
            })
            .collect(),
    );
    // w_p ∝ p/3 for p = 1 (coarsest, column 2), 2 (column 1), 3 (fine, column 0).
    let expect = (1.0 * 0.9 + 2.0 * 0.5 + 3.0 * 0.3) / 6.0;
    let got = experiments::happier::sum_weighted_ap(&run, 3).unwrap();
    assert!((got - expect).abs() < 1e-15, "{got} vs {expect}");
}

#[test]
fn recipe_changes_merge_over_the_file_key_by_key() {
    // A table merges, any other value replaces.
    let mut base: toml::Table = toml::from_str("a = 1\n[t]\nx = 1\ny = [1, 2]\n").unwrap();
    let changes: toml::Table = toml::from_str("[t]\ny = [3]\nz = 'new'\n").unwrap();
    experiments::recipe::merge_toml(&mut base, changes);
    let want: toml::Table = toml::from_str("a = 1\n[t]\nx = 1\ny = [3]\nz = 'new'\n").unwrap();
    assert_eq!(base, want);

    // A paper's recipe with one quick key changed: that key differs, nothing else does.
    let plain = ExperimentRecipe::for_paper(root(), "fastap").unwrap();
    let changed =
        ExperimentRecipe::for_paper_with(root(), "fastap", "[quick]\nepochs = 9\n").unwrap();
    let mut quick = plain.base(Scale::Quick).unwrap();
    assert_ne!(quick.epochs, 9);
    quick.epochs = 9;
    assert_eq!(changed.base(Scale::Quick).unwrap(), quick);
    assert_eq!(
        changed.base(Scale::Tiny).unwrap(),
        plain.base(Scale::Tiny).unwrap()
    );
    // Comments only: no change (a notebook's recipe cell holds a commented example).
    assert!(!experiments::recipe::has_changes(
        "\n# [quick]\n# epochs = 8\n"
    ));
    assert!(experiments::recipe::has_changes("[quick]\nepochs = 8"));
    assert_eq!(
        ExperimentRecipe::for_paper_with(root(), "fastap", "# [quick]\n").unwrap(),
        plain
    );
    // SSR's recipe reads the same way.
    let ssr = experiments::ssr::SsrRecipe::for_root_with(root(), "[seeds]\nquick = 2\n").unwrap();
    assert_eq!(ssr.seeds.count(Scale::Quick), 2);

    // Bad changes are errors that say where: not TOML, an unknown key, an invalid value.
    let e = ExperimentRecipe::for_paper_with(root(), "fastap", "[quick\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("recipe changes"), "{e}");
    let e = ExperimentRecipe::for_paper_with(root(), "fastap", "[quick]\nepochz = 9\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("epochz") && e.contains("recipe changes merged"),
        "{e}"
    );
    let e = ExperimentRecipe::for_paper_with(root(), "fastap", "[quick]\nepochs = 0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("[quick]") && e.contains("fastap.toml"), "{e}");
}

#[test]
fn the_readme_verdict_table_follows_only_the_committed_tables() {
    use experiments::summary::{claims_csv_path, markers};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (start, end) = markers(Scale::Quick);
    let readme = root.join("README.md");
    std::fs::write(&readme, format!("intro\n{start}\nSTALE\n{end}\nrest\n")).unwrap();
    let write_claims = |tables: &Path| {
        let path = claims_csv_path(tables, "fastap", Scale::Quick);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            &path,
            "claim,verdict,evidence\nM = 256 beats M = 96,holds,p=0.001\n",
        )
        .unwrap();
    };
    // A scratch folder (a notebook run with --out-dir) leaves the README alone.
    let scratch = root.join("scratch").join("paper_tables");
    write_claims(&scratch);
    assert!(!experiments::update_committed_readme(root, &scratch, Scale::Quick).unwrap());
    // The committed quick tables rewrite the table between the markers, nothing else.
    let tables = root.join("paper_tables");
    write_claims(&tables);
    assert!(!experiments::update_committed_readme(root, &tables, Scale::Tiny).unwrap());
    assert!(experiments::update_committed_readme(root, &tables, Scale::Quick).unwrap());
    let text = std::fs::read_to_string(&readme).unwrap();
    assert!(
        text.starts_with("intro\n") && text.ends_with("rest\n"),
        "{text}"
    );
    assert!(
        !text.contains("STALE") && text.contains("M = 256 beats M = 96"),
        "{text}"
    );
    assert!(
        text.contains("(paper_tables/measured/fastap_quick_claims.md)"),
        "{text}"
    );
}

#[test]
fn happier_dyml_averages_each_metric_over_the_label_columns() {
    use rankwise::experiments::MetricValue;
    let value = |metric: &str, level: usize, value: f64| MetricValue {
        metric: metric.into(),
        level: Some(level),
        value,
    };
    let mut metrics = Vec::new();
    for (l, (ap, asi, r1)) in [(0.2, 0.3, 0.5), (0.4, 0.5, 0.7), (0.9, 0.7, 0.9)]
        .into_iter()
        .enumerate()
    {
        metrics.extend([
            value("mAP", l, ap),
            value("ASI", l, asi),
            value("R@1", l, r1),
        ]);
    }
    // The hierarchical ASI (no column) must not enter the binary average.
    metrics.push(MetricValue {
        metric: "ASI".into(),
        level: None,
        value: 0.0,
    });
    let run = run_with(metrics);
    let avg = |m: &str| experiments::happier::dyml_average(&run, m, 3).unwrap();
    assert!((avg("mAP") - 0.5).abs() < 1e-15);
    assert!((avg("ASI") - 0.5).abs() < 1e-15);
    assert!((avg("R@1") - 0.7).abs() < 1e-15);
    // A run evaluated without the column's metric is an error, not a silent 0.
    assert!(experiments::happier::dyml_average(&run, "ASI", 4).is_err());
}

#[test]
fn reproduce_paper_joins_the_published_values_and_writes_tables_and_figures() {
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let runner = Runner::new(Some(cache.path().to_path_buf()), false);
    for paper in experiments::keys() {
        let r = experiments::reproduce_paper(paper, root(), &runner, Scale::Tiny).unwrap();
        // Our cells must land beside the paper's: every table the paper has gets at least one
        // cell with both sides (a mistyped method, setting or dataset would leave ours alone).
        let published: Vec<&str> = r
            .tables
            .iter()
            .filter(|t| !t.table.contains("(ours)"))
            .map(|t| t.table.as_str())
            .collect();
        assert!(!published.is_empty(), "{paper}");
        for t in &r.tables {
            let both = t
                .comparison
                .rows()
                .iter()
                .filter(|row| row.status == rankwise::report::Status::Both)
                .count();
            if t.table.contains("(ours)") {
                assert_eq!(both, 0, "{paper} {}", t.table);
            } else {
                assert!(both > 0, "{paper} {}: no cell joined the paper's", t.table);
            }
        }
        assert!(!r.figures.is_empty(), "{paper}");
        let tables_dir = out.path().join("paper_tables");
        let figures_dir = out.path().join("figures");
        let (page, pngs) = experiments::write_paper(&tables_dir, &figures_dir, &r).unwrap();
        let md = std::fs::read_to_string(&page).unwrap();
        assert!(md.contains("`tiny` scale"), "{md}");
        assert!(md.contains("## The paper's claims on our numbers"), "{md}");
        for png in &pngs {
            let bytes = std::fs::read(png).unwrap();
            assert!(bytes.starts_with(b"\x89PNG"), "{}", png.display());
            assert!(md.contains(&format!(
                "../figures/{}",
                png.file_name().unwrap().to_string_lossy()
            )));
        }
        for t in &r.tables {
            let stem = experiments::publish::slug(&t.table);
            let csv = tables_dir.join(paper).join(format!("{stem}.csv"));
            assert!(csv.exists(), "{}", csv.display());
        }
    }
}

#[test]
fn measure_paper_writes_cells_and_claims() {
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let runner = Runner::new(Some(cache.path().to_path_buf()), false);
    let (m, claims) = experiments::measure_paper("rambo", root(), &runner, Scale::Tiny).unwrap();
    experiments::write_measurements(out.path(), "rambo", Scale::Tiny, &m, &claims).unwrap();
    let csv = std::fs::read_to_string(out.path().join("rambo_tiny.csv")).unwrap();
    assert_eq!(csv.lines().count(), m.cells.len() + 1);
    assert!(csv.starts_with(
        "table,method,dataset,metric,setting,value,ci95,n,samples,unit,our_data,scale,\
             seeds,device,run_code,detail\n"
    ));
    let md = std::fs::read_to_string(out.path().join("rambo_tiny_claims.md")).unwrap();
    assert_eq!(md.matches("\n| ").count(), claims.len() + 1);
    let e = experiments::measure_paper("ssr2", root(), &runner, Scale::Tiny)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ssr2"), "{e}");
}

/// What every paper notebook calls: one run that writes under the output folder, the tables as
/// Markdown with the scale, the checks a notebook asserts, and clear errors for a wrong name.
#[test]
fn notebook_run_writes_under_the_output_folder_and_shows_tables() {
    use experiments::notebook::{self, NotebookPaths};
    let out = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut paths = NotebookPaths::new(root().to_path_buf(), out.path().to_path_buf(), Scale::Tiny);
    assert!(paths.cache.ends_with("target/rankwise-runs/tiny"));
    paths.cache = cache.path().to_path_buf();
    let r = notebook::run_paper("rambo", Scale::Tiny, &paths).unwrap();
    notebook::check_results(&r).unwrap();
    assert!(out.path().join("paper_tables").join("rambo.md").exists());
    for f in &r.figures {
        let png = out.path().join("figures").join(format!("{}.png", f.stem));
        assert!(png.exists(), "{}", png.display());
    }
    let md = notebook::table_markdown(&r, "Table 2").unwrap();
    assert!(md.contains("Scale of ours: `tiny`"), "{md}");
    // The table shows each mean with its interval over the 2 tiny seeds.
    assert!(md.contains(" ± ") && md.contains("2 seeds (0, 1)"), "{md}");
    // The reading is generated from the verdicts: every claim appears in it, under its verdict.
    let reading = notebook::reading(&r);
    assert!(
        reading.contains("2 seeds per row") && reading.contains("`tiny` scale"),
        "{reading}"
    );
    for c in &r.claims {
        assert!(reading.contains(&c.claim), "{reading}");
    }
    assert!(md.contains("| method |"), "{md}");
    let e = notebook::table_markdown(&r, "Table 99")
        .unwrap_err()
        .to_string();
    assert!(e.contains("Table 99") && e.contains("Table 2"), "{e}");
    let e = notebook::show_figure(&r, "no_such_figure")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no_such_figure") && e.contains("rambo_"), "{e}");
    // A table with the paper's values only (nothing of ours joined) must not pass as
    // reproduced, nor a result without tables.
    let published = rankwise::report::Published::for_key(
        root().join("paper_tables").join("published"),
        "rambo",
    )
    .unwrap();
    let mut paper_only = r.clone();
    paper_only.tables[0].comparison =
        rankwise::report::Comparison::build("paper only", &published.table("Table 2"), &[])
            .unwrap();
    let e = notebook::check_results(&paper_only)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no value of ours"), "{e}");
    let mut empty = r.clone();
    empty.tables.clear();
    let e = notebook::check_results(&empty).unwrap_err().to_string();
    assert!(e.contains("no table"), "{e}");
}

/// SSR's tiny-scale measurements, shared by the tests that read them.
fn ssr_tiny() -> &'static experiments::Measurements {
    static M: std::sync::OnceLock<experiments::Measurements> = std::sync::OnceLock::new();
    M.get_or_init(|| experiments::ssr::measure(root(), Scale::Tiny).unwrap())
}

#[test]
fn ssr_runs_at_tiny_scale_with_every_claim_measurable() {
    let m = ssr_tiny();
    check(&m.cells, "ssr");
    // Table 2: Baseline, k-reciprocal and SSR, accuracy and CI at 1 and 5 shots; Table 1: six
    // rows and the Sec. 2.3 k-reciprocal-input row × (mAP@R, R@1).
    let t2 = m.cells.iter().filter(|c| c.table == "Table 2").count();
    let t1 = m.cells.iter().filter(|c| c.table == "Table 1").count();
    assert_eq!((t1, t2), (14, 12), "{:?}", m.cells);
    for c in experiments::ssr::claims(m) {
        assert_ne!(c.verdict, experiments::Verdict::NotMeasured, "{c:?}");
        // Every row is scored on the same episodes or queries: the comparisons are paired.
        assert!(c.evidence.contains("paired p"), "{c:?}");
    }
    // `[seeds] tiny = 2`: two replicates, each per-episode / per-query cell keeps both (its
    // n is the replicates), every single-valued cell has one value per replicate.
    let recipe = experiments::ssr::SsrRecipe::for_root(root()).unwrap();
    assert_eq!(recipe.seeds.tiny, 2);
    for c in &m.cells {
        let s = c.sample();
        assert_eq!(s.n(), 2, "{c:?}");
        match &c.units {
            Some(u) => {
                assert_eq!(u.replicates(), 2);
                assert_eq!(u.replicate.len(), c.samples.len());
            }
            None => assert_eq!(c.samples.len(), 2, "{c:?}"),
        }
        assert!((c.value - s.mean()).abs() < 1e-12, "{c:?}");
        // `[pretraining.tiny]`: every backbone fine-tuned the pretrained one, and says so.
        assert!(
            c.provenance.detail.contains("pretrained by norm_softmax"),
            "{}",
            c.provenance.detail
        );
    }
    // The selected modules are checkpointed and load back.
    let dir = tempfile::tempdir().unwrap();
    let again =
        experiments::ssr::measure_recipe(&recipe.tiny, Scale::Tiny, Some(dir.path())).unwrap();
    assert_eq!(again.cells.len(), m.cells.len());
    // One replicate is the first replicate of `measure`: merging it with itself twice gives the
    // same means and two replicates of the same per-unit values.
    let first: Vec<f64> = again.cells.iter().map(|c| c.sample().mean()).collect();
    let twice = experiments::ssr::merge_replicates(vec![again.clone(), again.clone()]).unwrap();
    for (c, v) in twice.cells.iter().zip(&first) {
        assert!((c.value - v).abs() < 1e-12, "{c:?}");
        assert_eq!(c.sample().n(), 2);
    }
    let mut other = again.clone();
    other.cells.pop();
    assert!(experiments::ssr::merge_replicates(vec![again.clone(), other]).is_err());
    for f in ["fewshot_1shot", "fewshot_5shot", "retrieval"] {
        let loaded =
            rankwise::rerank::ssr::SsrModel::load(&dir.path().join(format!("{f}.safetensors")));
        assert!(loaded.is_ok(), "{f}: {:?}", loaded.err());
    }
    assert!(recipe.at(Scale::Quick).is_ok());
    // The paper scale reads features from files that are not shipped (tests/integration/ssr_features.rs).
    assert!(recipe.at(Scale::Paper).unwrap().features.is_some());
}

#[test]
fn ssr_tables_3_and_4_have_the_papers_rows_at_tiny_scale() {
    use experiments::ssr::{
        few_shot_ablation_rows, retrieval_ablation_rows, FEWSHOT_ABLATION_SETTING,
        RETRIEVAL_ABLATION_SETTING,
    };
    let m = ssr_tiny();
    let rows = |table: &str, metric: &str| -> Vec<(String, String)> {
        m.cells
            .iter()
            .filter(|c| c.table == table && c.metric == metric)
            .map(|c| (c.method.clone(), c.setting.clone()))
            .collect()
    };
    // Table 3: the baseline, then Ours, w.o sample, w.o query, w.o other, w.o local sort,
    // w.o subgraph, w.o feat. update, all beside the paper's CARS / GL / N = 100 column.
    let t3 = rows("Table 3", "mAP@R");
    let mut expect = vec!["Baseline (features)".to_string()];
    expect.extend(retrieval_ablation_rows().iter().map(|r| r.0.to_string()));
    assert_eq!(expect.len(), 8);
    assert_eq!(t3.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), expect);
    assert!(
        t3.iter().all(|r| r.1 == RETRIEVAL_ABLATION_SETTING),
        "{t3:?}"
    );
    // Table 4 (1-shot): the baseline, the six M_i variants and the three ablations, accuracy
    // and CI95 each.
    let t4 = rows("Table 4", "1-shot accuracy");
    assert_eq!(t4.len(), 10, "{t4:?}");
    assert_eq!(
        t4[0],
        (
            "Baseline (features)".to_string(),
            FEWSHOT_ABLATION_SETTING.to_string()
        )
    );
    for ((method, setting, _), (m4, s4)) in few_shot_ablation_rows().iter().zip(&t4[1..]) {
        assert_eq!(
            (*method, format!("{FEWSHOT_ABLATION_SETTING};{setting}")),
            (m4.as_str(), s4.clone())
        );
    }
    assert_eq!(rows("Table 4", "1-shot CI95").len(), 10);
    // The rows join the published values (same table, method, dataset, setting, metric).
    let published =
        rankwise::report::Published::for_key(root().join("paper_tables").join("published"), "ssr")
            .unwrap();
    for table in ["Table 3", "Table 4"] {
        let paper = published.table(table);
        let joined = m
            .cells
            .iter()
            .filter(|c| c.table == table && !c.metric.ends_with("CI95"))
            .filter(|c| {
                paper.iter().any(|p| {
                    p.method == c.method
                        && p.setting == c.setting
                        && p.metric == c.metric
                        && p.dataset == c.dataset
                })
            })
            .count();
        assert_eq!(joined, if table == "Table 3" { 8 } else { 10 }, "{table}");
    }
    // Baseline rows repeat Tables 1–2's baseline.
    let v =
        |t: &str, method: &str, setting: &str, metric: &str| m.value(t, method, setting, metric);
    assert_eq!(
        v(
            "Table 3",
            "Baseline (features)",
            RETRIEVAL_ABLATION_SETTING,
            "mAP@R"
        ),
        v("Table 1", "Feat. only", "feature=GL", "mAP@R")
    );
    assert_eq!(
        v(
            "Table 4",
            "Baseline (features)",
            FEWSHOT_ABLATION_SETTING,
            "1-shot accuracy"
        ),
        v(
            "Table 2",
            "Baseline",
            "backbone=Conv-4-64",
            "1-shot accuracy"
        )
    );
}

/// The quoted names that follow `call` in `source` (`show_table(&results, "Table 2")` →
/// `Table 2`).
fn quoted_after(source: &str, call: &str) -> Vec<String> {
    source
        .match_indices(call)
        .filter_map(|(i, _)| {
            let rest = &source[i + call.len()..];
            let start = rest.find('"')? + 1;
            let end = start + rest[start..].find('"')?;
            Some(rest[start..end].to_string())
        })
        .collect()
}

/// Every paper notebook names tables and figures that the paper's experiment produces: the
/// notebooks are not executed by CI (the evcxr build is too slow for it), so this is what keeps a
/// renamed table or figure from breaking a notebook silently. Each notebook's paper runs through
/// the same `run_paper` call at the `tiny` scale.
#[test]
fn every_paper_notebook_names_what_its_experiment_produces() {
    use experiments::notebook::{self, NotebookPaths};
    let out = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(root().join("notebooks"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ipynb"))
        .collect();
    files.sort();
    for path in files {
        let nb: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let source: String = nb["cells"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["cell_type"] == "code")
            .flat_map(|c| c["source"].as_array().unwrap().iter())
            .map(|line| line.as_str().unwrap())
            .collect();
        let papers = quoted_after(&source, "notebook::run_paper_with(");
        let Some(paper) = papers.first() else {
            continue; // the quickstart and the tutorial
        };
        assert_eq!(papers.len(), 1, "{}", path.display());
        let mut paths =
            NotebookPaths::new(root().to_path_buf(), out.path().to_path_buf(), Scale::Tiny);
        paths.cache = cache.path().to_path_buf();
        // The recipe cell shows the file the run starts from.
        assert_eq!(
            quoted_after(&source, "notebook::show_recipe("),
            std::slice::from_ref(paper),
            "{}",
            path.display()
        );
        let recipe = notebook::recipe_markdown(paper, &paths).unwrap();
        let file =
            std::fs::read_to_string(experiments::recipe::recipe_path(root(), paper)).unwrap();
        assert!(recipe.contains(file.trim_end()), "{}", path.display());
        // ... and the shared pretraining recipe its standard scale extends.
        let shared = std::fs::read_to_string(
            root().join("configs/experiments/shared/pretraining_standard.toml"),
        )
        .unwrap();
        assert!(recipe.contains(shared.trim_end()), "{}", path.display());
        let r = notebook::run_paper(paper, Scale::Tiny, &paths)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        notebook::check_results(&r).unwrap();
        let tables = quoted_after(&source, "notebook::show_table(&results,");
        let figures = quoted_after(&source, "notebook::show_figure(&results,");
        assert!(
            !tables.is_empty() && !figures.is_empty(),
            "{}",
            path.display()
        );
        for t in &tables {
            notebook::table_markdown(&r, t).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        // The notebook shows every table and figure its paper produces.
        assert_eq!(tables.len(), r.tables.len(), "{}", path.display());
        for f in &figures {
            assert!(r.figure(f).is_some(), "{}: no figure {f}", path.display());
        }
        assert_eq!(figures.len(), r.figures.len(), "{}", path.display());
        seen.push(paper.clone());
    }
    seen.sort();
    let mut all: Vec<String> = experiments::keys().iter().map(|p| p.to_string()).collect();
    all.sort();
    assert_eq!(seen, all, "one notebook per paper");
}

/// Runs trained side by side (two at a time, each on a pool of its own share of the threads)
/// give the bits the same runs give alone on the whole pool, or on pools of 1 and 3 threads,
/// and a repeated recipe trains once.
#[test]
fn runs_side_by_side_equal_runs_alone() {
    use experiments::RunSpec;
    let base = ExperimentRecipe::for_paper(root(), "smooth_ap")
        .unwrap()
        .base(Scale::Tiny)
        .unwrap();
    let spec = |seed: u64, label: &str| {
        let mut config = base.clone();
        config.seed = seed;
        RunSpec {
            label: label.into(),
            config,
        }
    };
    let specs = [spec(3, "a"), spec(4, "b"), spec(3, "a again")];
    let runner = Runner::new(None, false);
    let alone: Vec<_> = specs[..2].iter().map(|s| runner.run(s).unwrap()).collect();
    let together = runner.run_many(&specs, 2).unwrap();
    assert_eq!(together.len(), 3);
    // Everything but the timings.
    let logged = |r: &experiments::RunResult| -> Vec<_> {
        r.log
            .iter()
            .filter(|l| !matches!(l.metric.as_str(), "images_per_s" | "epoch_seconds"))
            .cloned()
            .collect()
    };
    for (a, t) in alone.iter().chain([&alone[0]]).zip(&together) {
        assert_eq!(a.metrics, t.metrics, "{}", t.label);
        assert_eq!(logged(a), logged(t), "{}", t.label);
        assert_eq!(a.seed, t.seed);
    }
    assert_eq!(together[2].label, "a again");
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let r = pool.install(|| runner.run(&specs[0])).unwrap();
        assert_eq!(r.metrics, alone[0].metrics, "{threads} threads");
        assert_eq!(logged(&r), logged(&alone[0]), "{threads} threads");
    }
    assert_ne!(
        together[0].metrics, together[1].metrics,
        "two seeds, two runs"
    );
    // A failing run is reported, naming it.
    let mut bad = spec(5, "bad");
    bad.config.epochs = 0;
    let e = runner
        .run_many(&[spec(3, "a"), bad], 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad"), "{e}");
}

#[test]
fn only_the_similarity_update_rows_choose_their_own_lambda() {
    use experiments::ssr::{ablation_lambdas, few_shot_ablation_rows, retrieval_ablation_rows};
    use rankwise::rerank::ssr::SsrConfig;
    let grid = [0.002, 0.01, 0.05];
    let rows = few_shot_ablation_rows()
        .into_iter()
        .map(|(_, setting, change)| (setting, change))
        .chain(
            retrieval_ablation_rows()
                .into_iter()
                .map(|(method, _, change)| (method, change)),
        );
    let mut similarity_rows = 0;
    for (name, change) in rows {
        let mut config = SsrConfig::default();
        change(&mut config);
        let lambdas = ablation_lambdas(&config, 0.01, &grid);
        if name.contains("w.o feat. update") {
            similarity_rows += 1;
            assert_eq!(lambdas, grid, "{name}");
        } else {
            assert_eq!(lambdas, [0.01], "{name}");
        }
    }
    assert_eq!(similarity_rows, 2);
}

/// The standard protocol's pretraining: one backbone trained once from `[pretraining.<scale>]`
/// (other classes: dataset seed 1, a softmax classifier), written where `load_backbone` reads
/// it, read back from the cache the second time, and every run that starts from it keyed by
/// the weights' bytes, not their path.
#[test]
fn ssr_pretrains_over_its_backbone_and_shares_the_training_papers_backbone() {
    let ssr = experiments::ssr::SsrRecipe::for_root(root()).unwrap();
    let papers = ["fastap", "happier", "rambo", "smooth_ap"]
        .map(|paper| ExperimentRecipe::for_paper(root(), paper).unwrap());
    for scale in [Scale::Tiny, Scale::Standard] {
        let pre = ssr
            .pretraining(scale)
            .unwrap()
            .expect("SSR pretrains at this scale");
        let backbone = ssr.at(scale).unwrap().backbone.unwrap();
        assert_eq!(pre.model, backbone.model);
        assert!(pre.loss.name().contains("softmax"), "{}", pre.loss.name());
        // The standard resolved recipe (configs/experiments/shared/pretraining_standard.toml)
        // is every training paper's: one cached backbone for all five.
        if scale == Scale::Standard {
            for recipe in &papers {
                assert_eq!(
                    pre.to_toml_string().unwrap(),
                    recipe
                        .pretraining(scale)
                        .unwrap()
                        .unwrap()
                        .to_toml_string()
                        .unwrap()
                );
            }
        }
    }
    assert!(ssr.pretraining(Scale::Quick).unwrap().is_none());
    // A bad section names the file and the section.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("configs/experiments/ssr.toml")).unwrap();
    let bad = dir.path().join("ssr.toml");
    // The shared pretraining file its standard section extends, beside it as in configs/.
    std::fs::create_dir(dir.path().join("shared")).unwrap();
    std::fs::copy(
        root().join("configs/experiments/shared/pretraining_standard.toml"),
        dir.path().join("shared/pretraining_standard.toml"),
    )
    .unwrap();
    std::fs::write(
        &bad,
        text.replace(
            "[pretraining.tiny]\nepochs = 1",
            "[pretraining.tiny]\nepochs = 0",
        ),
    )
    .unwrap();
    let e = experiments::ssr::SsrRecipe::from_toml_file(&bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ssr.toml") && e.contains("[pretraining.tiny]"),
        "{e}"
    );
}

#[test]
fn a_scale_pretrains_one_backbone_once_and_runs_start_from_it() {
    use experiments::RunSpec;
    let dir = tempfile::tempdir().unwrap();
    let recipe = ExperimentRecipe::for_paper(root(), "fastap").unwrap();
    let pre = recipe
        .pretraining(Scale::Tiny)
        .unwrap()
        .expect("fastap's tiny scale pretrains");
    let base = recipe.base(Scale::Tiny).unwrap();
    // The changes merged over the base: other data, the softmax classifier, the rest kept.
    assert!(matches!(
        (&pre.dataset, &base.dataset),
        (rankwise::train::DatasetConfig::Embedded(p), rankwise::train::DatasetConfig::Embedded(b))
            if p.seed == 1 && b.seed == 0 && p.families == b.families
    ));
    assert!(pre.loss.name().contains("softmax"), "{}", pre.loss.name());
    assert_eq!(
        (pre.model.clone(), pre.seed),
        (base.model.clone(), base.seed)
    );
    let runner = Runner::new(Some(dir.path().join("runs")), false);
    let spec = RunSpec {
        label: "pretraining".into(),
        config: pre,
    };
    let weights = runner.pretrained_backbone(&spec).unwrap();
    assert!(weights.starts_with(dir.path().join("runs").join("backbones")));
    let written = std::fs::read(&weights).unwrap();
    let modified = std::fs::metadata(&weights).unwrap().modified().unwrap();
    // Cached: the same file, not rewritten.
    assert_eq!(runner.pretrained_backbone(&spec).unwrap(), weights);
    assert_eq!(
        std::fs::metadata(&weights).unwrap().modified().unwrap(),
        modified
    );
    // A run from these weights is another run than one from random weights.
    let mut from = base.clone();
    from.pretrained = Some(weights.clone());
    let tuned = runner
        .run(&RunSpec {
            label: "fine-tuned".into(),
            config: from.clone(),
        })
        .unwrap();
    let scratch = runner
        .run(&RunSpec {
            label: "scratch".into(),
            config: base.clone(),
        })
        .unwrap();
    assert_ne!(tuned.metrics, scratch.metrics);
    assert!(
        !tuned.recipe.contains("backbones"),
        "keyed by content: {}",
        tuned.recipe
    );
    // The same bytes under another path: the same cached run. Other bytes at the first path:
    // a new run.
    let copy = dir.path().join("elsewhere.safetensors");
    std::fs::copy(&weights, &copy).unwrap();
    let mut moved = base.clone();
    moved.pretrained = Some(copy.clone());
    let again = runner
        .run(&RunSpec {
            label: "moved".into(),
            config: moved.clone(),
        })
        .unwrap();
    assert_eq!(
        (again.recipe.clone(), again.seconds),
        (tuned.recipe.clone(), tuned.seconds)
    );
    let mut other = written.clone();
    let last = other.len() - 1;
    other[last] ^= 1;
    std::fs::write(&copy, &other).unwrap();
    let changed = runner
        .run(&RunSpec {
            label: "changed".into(),
            config: moved,
        })
        .unwrap();
    assert_ne!(changed.recipe, tuned.recipe);
}

/// A pretraining section that does not make a valid recipe is an error naming the file and the
/// section, when the recipe is read.
#[test]
fn a_bad_pretraining_section_names_the_file_and_the_section() {
    let e = ExperimentRecipe::for_paper_with(
        root(),
        "fastap",
        "[pretraining.tiny]\nepochs = \"many\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("fastap.toml") && e.contains("[pretraining.tiny]"),
        "{e}"
    );
}
