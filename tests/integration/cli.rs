//! End-to-end tests of the `rankwise` binary: file formats in, results out, and bad input.
//!
//! Every test runs the built binary on files in a temporary folder. The data is the library's
//! small synthetic set (600 items, D = 64, two label levels) or a slice of it, so each run takes
//! well under a second.

use candle_core::{Device, Tensor};
use polars::prelude::{df, ParquetWriter};
use rankwise::io::{LabelledEmbeddings, ResultTable};
use rankwise::rerank::query_expansion::QueryExpansion;
use rankwise::rerank::{RerankMethod, Reranker};
use rankwise::retrieval::{evaluate, EvalOptions, EvalReport};
use rankwise::synthetic_embeddings::{SyntheticSet, SyntheticSpec};
use rankwise::Labels;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The R@k list used by the tests (the SOP default 1,10,100,1000 would exceed 600 items).
const RECALL_AT: &str = "1,2,4,8";

/// The binary under test: `$RANKWISE_BIN` if set (e.g. a release build), else the one cargo
/// built for these tests.
fn bin() -> PathBuf {
    std::env::var_os("RANKWISE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_rankwise")))
}

fn rankwise(args: &[&str]) -> Output {
    rankwise_env(args, &[])
}

/// Runs the binary with extra environment variables.
fn rankwise_env(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("cannot run the rankwise binary")
}

/// Runs the binary, expecting success; returns stdout.
fn succeeds(args: &[&str]) -> String {
    let out = rankwise(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rankwise {args:?} failed:\n{stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// Runs the binary, expecting a clean failure (exit status 1, `error: …`, no panic); returns
/// stderr.
fn fails(args: &[&str]) -> String {
    let out = rankwise(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "rankwise {args:?}: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn small_set() -> SyntheticSet {
    SyntheticSpec::small().generate().unwrap()
}

/// An `.npy` file as `np.save` writes it (format 1.0, header padded to 64 bytes), by hand.
fn npy_bytes(descr: &str, fortran: bool, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let shape = match shape {
        [n] => format!("({n},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let order = if fortran { "True" } else { "False" };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend_from_slice(data);
    out
}

fn f32_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f64_bytes(values: impl IntoIterator<Item = f64>) -> Vec<u8> {
    values.into_iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn labels_csv(dir: &Path, name: &str, labels: &Labels) -> PathBuf {
    let mut text = String::from("class_id,super_class_id\n");
    for i in 0..labels.len() {
        let r = labels.row(i);
        text.push_str(&format!("{},{}\n", r[0], r[1]));
    }
    write(dir, name, text.as_bytes())
}

/// Writes `rows` (one embedding each) as an f32 `.npy` file in `dir`.
fn npy_rows(dir: &Path, name: &str, rows: &[Vec<f32>]) -> PathBuf {
    let values = rows.iter().flatten().copied();
    let shape = [rows.len(), rows[0].len()];
    write(
        dir,
        name,
        &npy_bytes("<f4", false, &shape, &f32_bytes(values)),
    )
}

/// The even items (queries) and the odd items (references) of 0..n.
fn even_odd(n: usize) -> (Vec<usize>, Vec<usize>) {
    ((0..n).step_by(2).collect(), (1..n).step_by(2).collect())
}

/// The rows of `x` at `idx`.
fn pick_rows(x: &[Vec<f32>], idx: &[usize]) -> Vec<Vec<f32>> {
    idx.iter().map(|&i| x[i].clone()).collect()
}

/// The even items of `x` as queries against the odd ones: the four files (`{tag}q.npy`,
/// `{tag}r.npy` and their labels) in `dir`, in the order of [`split_flags`].
fn even_odd_files(dir: &Path, x: &[Vec<f32>], labels: &Labels, tag: &str) -> [PathBuf; 4] {
    let (even, odd) = even_odd(x.len());
    [
        npy_rows(dir, &format!("{tag}q.npy"), &pick_rows(x, &even)),
        npy_rows(dir, &format!("{tag}r.npy"), &pick_rows(x, &odd)),
        labels_csv(dir, &format!("{tag}ql.csv"), &labels.select(&even).unwrap()),
        labels_csv(dir, &format!("{tag}rl.csv"), &labels.select(&odd).unwrap()),
    ]
}

/// The flags naming the files of [`even_odd_files`].
fn split_flags(files: &[PathBuf; 4]) -> [&str; 8] {
    [
        "--queries",
        s(&files[0]),
        "--references",
        s(&files[1]),
        "--query-labels",
        s(&files[2]),
        "--reference-labels",
        s(&files[3]),
    ]
}

/// Evaluates through the CLI and returns the parsed JSON results.
fn eval_json(dir: &Path, inputs: &[&str]) -> ResultTable {
    let out = dir.join(format!("results-{}.json", rand_name()));
    let mut args = vec![
        "eval",
        "--quiet",
        "--recall-at",
        RECALL_AT,
        "--out",
        s(&out),
    ];
    args.extend_from_slice(inputs);
    succeeds(&args);
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
}

fn rand_name() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed).to_string()
}

/// A metric row as the tests compare it: name, level, the value's bits, counts.
type RowKey = (String, Option<usize>, u64, usize, usize);

fn row_key(metric: &str, level: Option<usize>, value: f64, counts: (usize, usize)) -> RowKey {
    (
        metric.to_owned(),
        level,
        value.to_bits(),
        counts.0,
        counts.1,
    )
}

/// The rows of a results file.
fn rows(t: &ResultTable) -> Vec<RowKey> {
    t.rows
        .iter()
        .map(|r| row_key(&r.metric, r.level, r.value, (r.queries, r.skipped)))
        .collect()
}

/// The rows of a library report, as [`rows`] gives a results file's.
fn report_rows(r: &EvalReport) -> Vec<RowKey> {
    r.rows
        .iter()
        .map(|r| row_key(&r.metric, r.level, r.value, (r.queries, r.skipped)))
        .collect()
}

#[test]
fn gen_embeddings_then_eval_matches_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("demo");
    let stdout = succeeds(&[
        "gen-embeddings",
        "--preset",
        "small",
        "--out-dir",
        s(&out_dir),
    ]);
    assert!(stdout.contains("embeddings.npy"), "{stdout}");
    let (emb, lab) = (out_dir.join("embeddings.npy"), out_dir.join("labels.csv"));

    // The files hold exactly the generated set.
    let set = small_set();
    let read = LabelledEmbeddings::read(&emb, &lab, None, None).unwrap();
    assert_eq!(
        read.embeddings.to_vec2::<f32>().unwrap(),
        set.embeddings.to_vec2::<f32>().unwrap()
    );
    assert_eq!(read.labels, set.labels);
    assert_eq!(read.level_names, ["class_id", "super_class_id"]);

    let json = eval_json(dir.path(), &["--embeddings", s(&emb), "--labels", s(&lab)]);
    // The CLI's defaults are the library's: only the R@k list differs.
    let opts = EvalOptions {
        recall_ks: vec![1, 2, 4, 8],
        ..EvalOptions::default()
    };
    let direct = evaluate(&read.embeddings, &read.labels, None, &opts).unwrap();
    assert_eq!(json.num_queries, 600);
    assert_eq!(direct.num_queries, 600);
    assert_eq!(rows(&json), report_rows(&direct));
    for metric in ["mAP@R", "R@1", "H-AP"] {
        assert!(
            json.rows.iter().any(|r| r.metric == metric),
            "no {metric} row"
        );
    }
    // Binary rows are named after the CSV column of their level.
    let r1 = json.rows.iter().find(|r| r.metric == "R@1").unwrap();
    assert_eq!(r1.level_name.as_deref(), Some("class_id"));
    assert!(r1.value > 0.0 && r1.value < 1.0, "{}", r1.value);

    // The CSV output holds the same values, to the last bit.
    let csv_out = dir.path().join("results.csv");
    let table = succeeds(&[
        "eval",
        "--quiet",
        "--recall-at",
        RECALL_AT,
        "--embeddings",
        s(&emb),
        "--labels",
        s(&lab),
        "--out",
        s(&csv_out),
    ]);
    assert!(
        table.contains("class_id") && table.contains("R@1"),
        "{table}"
    );
    let text = std::fs::read_to_string(&csv_out).unwrap();
    let values: Vec<f64> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(3).unwrap().parse().unwrap())
        .collect();
    let json_values: Vec<f64> = json.rows.iter().map(|r| r.value).collect();
    assert_eq!(values, json_values);
}

#[test]
fn example_runs_in_memory() {
    let stdout = succeeds(&["eval", "--example", "--quiet", "--recall-at", RECALL_AT]);
    assert!(
        stdout.contains("R@1") && stdout.contains("H-AP"),
        "{stdout}"
    );
    // The in-memory set is the one gen-embeddings writes.
    let dir = tempfile::tempdir().unwrap();
    succeeds(&["gen-embeddings", "--out-dir", s(dir.path())]);
    let from_files = succeeds(&[
        "eval",
        "--quiet",
        "--recall-at",
        RECALL_AT,
        "--embeddings",
        s(&dir.path().join("embeddings.npy")),
        "--labels",
        s(&dir.path().join("labels.csv")),
    ]);
    assert_eq!(stdout, from_files);
}

#[test]
fn reads_npy_as_numpy_writes_it_f32_f64_c_and_fortran_order() {
    let dir = tempfile::tempdir().unwrap();
    let set = small_set();
    let x = set.embeddings.to_vec2::<f32>().unwrap();
    let (n, d) = (x.len(), x[0].len());
    let c_f32 = write(
        dir.path(),
        "c32.npy",
        &npy_bytes(
            "<f4",
            false,
            &[n, d],
            &f32_bytes(x.iter().flatten().copied()),
        ),
    );
    // Every f32 is exactly a f64, so the f64 file must give the very same results.
    let c_f64 = write(
        dir.path(),
        "c64.npy",
        &npy_bytes(
            "<f8",
            false,
            &[n, d],
            &f64_bytes(x.iter().flatten().map(|&v| v as f64)),
        ),
    );
    let column_major = (0..d).flat_map(|j| x.iter().map(move |row| row[j]));
    let f_f32 = write(
        dir.path(),
        "f32.npy",
        &npy_bytes("<f4", true, &[n, d], &f32_bytes(column_major)),
    );
    let labels = labels_csv(dir.path(), "labels.csv", &set.labels);

    let reference = eval_json(
        dir.path(),
        &["--embeddings", s(&c_f32), "--labels", s(&labels)],
    );
    for file in [&c_f64, &f_f32] {
        let other = eval_json(
            dir.path(),
            &["--embeddings", s(file), "--labels", s(&labels)],
        );
        assert_eq!(rows(&other), rows(&reference), "{}", file.display());
    }
}

#[test]
fn safetensors_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let set = small_set();
    let npy = dir.path().join("e.npy");
    rankwise::io::write_npy(&npy, &set.embeddings).unwrap();
    let st = dir.path().join("e.safetensors");
    set.embeddings.save_safetensors("embeddings", &st).unwrap();
    let labels = labels_csv(dir.path(), "labels.csv", &set.labels);
    let a = eval_json(
        dir.path(),
        &["--embeddings", s(&npy), "--labels", s(&labels)],
    );
    let b = eval_json(
        dir.path(),
        &["--embeddings", s(&st), "--labels", s(&labels)],
    );
    assert_eq!(rows(&a), rows(&b));
    // A file with several tensors: pick one by name.
    let mut many = std::collections::HashMap::new();
    many.insert("feats".to_string(), set.embeddings.clone());
    many.insert(
        "logits".to_string(),
        Tensor::zeros((600, 3), candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    let st2 = dir.path().join("many.safetensors");
    candle_core::safetensors::save(&many, &st2).unwrap();
    let e = fails(&["eval", "--embeddings", s(&st2), "--labels", s(&labels)]);
    assert!(e.contains("feats, logits"), "{e}");
    let c = eval_json(
        dir.path(),
        &[
            "--embeddings",
            s(&st2),
            "--tensor",
            "feats",
            "--labels",
            s(&labels),
        ],
    );
    assert_eq!(rows(&a), rows(&c));
}

#[test]
fn parquet_labels_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let set = small_set();
    let npy = dir.path().join("e.npy");
    rankwise::io::write_npy(&npy, &set.embeddings).unwrap();
    let csv = labels_csv(dir.path(), "labels.csv", &set.labels);
    let pq = dir.path().join("labels.parquet");
    let n = set.labels.len();
    let mut frame = df!(
        "path" => (0..n).map(|i| format!("img{i}.jpg")).collect::<Vec<_>>(),
        "super_class_id" => set.labels.column(1).iter().map(|&c| c as i32).collect::<Vec<_>>(),
        "class_id" => set.labels.column(0),
    )
    .unwrap();
    ParquetWriter::new(std::fs::File::create(&pq).unwrap())
        .finish(&mut frame)
        .unwrap();
    let a = eval_json(dir.path(), &["--embeddings", s(&npy), "--labels", s(&csv)]);
    let b = eval_json(
        dir.path(),
        &[
            "--embeddings",
            s(&npy),
            "--labels",
            s(&pq),
            "--label-columns",
            "class_id,super_class_id",
        ],
    );
    assert_eq!(rows(&a), rows(&b));
    assert_eq!(b.settings["label_levels"], "class_id,super_class_id");
}

#[test]
fn queries_against_references() {
    let dir = tempfile::tempdir().unwrap();
    let set = small_set();
    let x = set.embeddings.to_vec2::<f32>().unwrap();
    // Even items are queries, odd items references.
    let pick = |parity: usize| -> (Vec<f32>, Vec<usize>) {
        let idx: Vec<usize> = (0..x.len()).filter(|i| i % 2 == parity).collect();
        (idx.iter().flat_map(|&i| x[i].clone()).collect(), idx)
    };
    let (q, qi) = pick(0);
    let (r, ri) = pick(1);
    let d = x[0].len();
    let qf = write(
        dir.path(),
        "q.npy",
        &npy_bytes("<f4", false, &[qi.len(), d], &f32_bytes(q)),
    );
    let rf = write(
        dir.path(),
        "r.npy",
        &npy_bytes("<f4", false, &[ri.len(), d], &f32_bytes(r)),
    );
    let ql = labels_csv(dir.path(), "q.csv", &set.labels.select(&qi).unwrap());
    let rl = labels_csv(dir.path(), "r.csv", &set.labels.select(&ri).unwrap());
    let t = eval_json(
        dir.path(),
        &[
            "--queries",
            s(&qf),
            "--references",
            s(&rf),
            "--query-labels",
            s(&ql),
            "--reference-labels",
            s(&rl),
        ],
    );
    assert_eq!(t.num_queries, 300);
    // Dimensions that differ are refused before ranking.
    let r_small = write(
        dir.path(),
        "r8.npy",
        &npy_bytes(
            "<f4",
            false,
            &[ri.len(), 8],
            &f32_bytes(vec![0.5; ri.len() * 8]),
        ),
    );
    let e = fails(&[
        "eval",
        "--queries",
        s(&qf),
        "--references",
        s(&r_small),
        "--query-labels",
        s(&ql),
        "--reference-labels",
        s(&rl),
    ]);
    assert!(
        e.contains("dimension 64") && e.contains("dimension 8"),
        "{e}"
    );
}

#[test]
fn rerank_scores_the_librarys_reranker_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let set = small_set();
    let opts = EvalOptions {
        recall_ks: vec![1, 2, 4, 8],
        progress: false,
        ..EvalOptions::default()
    };
    // The set against itself (k-reciprocal), and even items against odd ones (αQE): the CLI's
    // rows are the library's re-ranker's, bit for bit, and the results name the method with
    // every parameter.
    let json = eval_json(
        dir.path(),
        &["--example", "--rerank", "k-reciprocal:10,3,0.3"],
    );
    let direct = "k-reciprocal:10,3,0.3"
        .parse::<RerankMethod>()
        .unwrap()
        .fit(&set.embeddings, None)
        .unwrap()
        .evaluate(&set.labels, None, &opts)
        .unwrap();
    assert_eq!(rows(&json), report_rows(&direct));
    assert_eq!(json.settings["rerank"], "k-reciprocal:10,3,0.3");
    // Re-ranking changed the ranking: the plain evaluation differs.
    let plain = eval_json(dir.path(), &["--example"]);
    assert_eq!(plain.settings["rerank"], "none");
    assert_ne!(rows(&plain), rows(&json));

    let x = set.embeddings.to_vec2::<f32>().unwrap();
    let (even, odd) = even_odd(x.len());
    let (ql, rl) = (
        set.labels.select(&even).unwrap(),
        set.labels.select(&odd).unwrap(),
    );
    let split = even_odd_files(dir.path(), &x, &set.labels, "");
    let files = split_flags(&split);
    let json = eval_json(
        dir.path(),
        &[&files[..], &["--rerank", "alpha-qe:3"]].concat(),
    );
    let pick = |idx: &[usize]| {
        let i = Tensor::new(
            idx.iter().map(|&i| i as u32).collect::<Vec<_>>(),
            &Device::Cpu,
        );
        set.embeddings.index_select(&i.unwrap(), 0).unwrap()
    };
    let direct = QueryExpansion::alpha_qe(3)
        .fit(&pick(&even), Some(&pick(&odd)))
        .unwrap()
        .evaluate(&ql, Some(&rl), &opts)
        .unwrap();
    assert_eq!(json.num_queries, 300);
    assert_eq!(rows(&json), report_rows(&direct));
    assert_eq!(json.settings["rerank"], "alpha-qe:3,3");

    // What the re-rankers cannot honour, and a method that is not one, fail naming the flag.
    for (extra, needle) in [
        (&["--similarity", "euclidean"][..], "drop --similarity"),
        (&["--self-match", "none"][..], "drop --self-match"),
    ] {
        let e = fails(
            &[
                &["eval", "--quiet", "--example", "--rerank", "aqe:2"][..],
                extra,
            ]
            .concat(),
        );
        assert!(e.contains(needle), "{e}");
    }
    let e = fails(
        &[
            &["eval", "--quiet"][..],
            &files[..],
            &["--rerank", "k-reciprocal:700,6,0.3"],
        ]
        .concat(),
    );
    assert!(
        e.contains("re-ranking (k-reciprocal:700,6,0.3) failed") && e.contains("k1"),
        "{e}"
    );
    let out = rankwise(&["eval", "--example", "--rerank", "ssr:3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--rerank") && stderr.contains("unknown method \"ssr\""),
        "{stderr}"
    );
}

/// `--concat`: several models' embeddings of the same items evaluated as one, as the library's
/// ensemble does it; `--versus` then sets one model beside the ensemble.
#[test]
fn concat_evaluates_several_models_as_one_as_the_library_does() {
    use rankwise::retrieval::ensemble::{concatenate, TestEmbeddings};
    let dir = tempfile::tempdir().unwrap();
    let set = small_set();
    let x = set.embeddings.to_vec2::<f32>().unwrap();
    let d = x[0].len();
    // Two other models: the first 40 and the last 40 coordinates, each scaled differently (the
    // ensemble weighs each model the same whatever its scale).
    let part = |from: usize, scale: f32| -> Vec<Vec<f32>> {
        x.iter()
            .map(|r| r[from..from + 40].iter().map(|v| v * scale).collect())
            .collect()
    };
    let (b, c) = (part(0, 10.0), part(d - 40, 0.1));
    let files = [
        npy_rows(dir.path(), "a.npy", &x),
        npy_rows(dir.path(), "b.npy", &b),
        npy_rows(dir.path(), "c.npy", &c),
    ];
    let lab = labels_csv(dir.path(), "labels.csv", &set.labels);
    let json = eval_json(
        dir.path(),
        &[
            "--embeddings",
            s(&files[0]),
            "--labels",
            s(&lab),
            "--concat",
            s(&files[1]),
            "--concat",
            s(&files[2]),
            "--versus",
            s(&files[0]),
        ],
    );
    let model = |rows: &[Vec<f32>]| TestEmbeddings {
        queries: Tensor::new(rows.concat(), &Device::Cpu)
            .unwrap()
            .reshape((rows.len(), rows[0].len()))
            .unwrap(),
        query_labels: set.labels.clone(),
        gallery: None,
    };
    let opts = EvalOptions {
        recall_ks: vec![1, 2, 4, 8],
        progress: false,
        ..EvalOptions::default()
    };
    let together = concatenate(&[model(&x), model(&b), model(&c)])
        .unwrap()
        .evaluate(&opts)
        .unwrap();
    assert_eq!(rows(&json), report_rows(&together));
    assert_eq!(
        json.settings["concat"],
        format!("{},{}", s(&files[1]), s(&files[2]))
    );
    // --versus: the first model alone, the second column.
    let alone = evaluate(&set.embeddings, &set.labels, None, &opts).unwrap();
    for (row, a) in json.rows.iter().zip(&alone.rows) {
        assert_eq!(
            row.versus.as_ref().unwrap().value.to_bits(),
            a.value.to_bits()
        );
    }
    // Another number of items fails naming both files.
    let short = npy_rows(dir.path(), "short.npy", &x[..599]);
    let e = fails(&[
        "eval",
        "--quiet",
        "--embeddings",
        s(&files[0]),
        "--labels",
        s(&lab),
        "--concat",
        s(&short),
    ]);
    assert!(
        e.contains("--concat")
            && e.contains("short.npy has 599 rows")
            && e.contains("a.npy has 600"),
        "{e}"
    );

    // The split protocol: each other model's queries and references, paired in order.
    let split = [
        even_odd_files(dir.path(), &x, &set.labels, ""),
        even_odd_files(dir.path(), &b, &set.labels, "b"),
        even_odd_files(dir.path(), &c, &set.labels, "c"),
    ];
    let concat_flags = [
        "--concat-queries",
        s(&split[1][0]),
        "--concat-references",
        s(&split[1][1]),
        "--concat-queries",
        s(&split[2][0]),
        "--concat-references",
        s(&split[2][1]),
    ];
    let json = eval_json(
        dir.path(),
        &[&split_flags(&split[0])[..], &concat_flags[..]].concat(),
    );
    let (even, odd) = even_odd(x.len());
    let model = |rows: &[Vec<f32>]| {
        let part = |idx: &[usize]| {
            let r = pick_rows(rows, idx);
            Tensor::new(r.concat(), &Device::Cpu)
                .unwrap()
                .reshape((r.len(), r[0].len()))
                .unwrap()
        };
        TestEmbeddings {
            queries: part(&even),
            query_labels: set.labels.select(&even).unwrap(),
            gallery: Some((part(&odd), set.labels.select(&odd).unwrap())),
        }
    };
    let together = concatenate(&[model(&x), model(&b), model(&c)])
        .unwrap()
        .evaluate(&opts)
        .unwrap();
    assert_eq!(json.num_queries, 300);
    assert_eq!(rows(&json), report_rows(&together));
    assert_eq!(
        json.settings["concat_references"],
        format!("{},{}", s(&split[1][1]), s(&split[2][1]))
    );
    // A model's references of another width than its queries (b's queries, a's references),
    // or a queries file without its references, fail naming the model or the flags.
    let e = fails(
        &[
            &["eval", "--quiet"][..],
            &split_flags(&split[0])[..],
            &[
                "--concat-queries",
                s(&split[1][0]),
                "--concat-references",
                s(&split[0][1]),
            ],
        ]
        .concat(),
    );
    assert!(
        e.contains(
            "model 1's query embeddings have 40 dimensions but its gallery embeddings \
             have 64"
        ),
        "{e}"
    );
    let e = fails(
        &[
            &["eval", "--quiet"][..],
            &split_flags(&split[0])[..],
            &concat_flags[..6],
        ]
        .concat(),
    );
    assert!(
        e.contains("2 --concat-queries but 1 --concat-references"),
        "{e}"
    );
}

#[test]
fn versus_compares_two_models_query_by_query_as_the_library_does() {
    let dir = tempfile::tempdir().unwrap();
    let set = small_set();
    let x = set.embeddings.to_vec2::<f32>().unwrap();
    let (n, d) = (x.len(), x[0].len());
    // Model B: model A's embeddings with every other coordinate of every other item scrambled,
    // in another dimension (a paired comparison does not need the same one).
    let b: Vec<Vec<f32>> = x
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let mut r: Vec<f32> = row.iter().copied().take(d - 8).collect();
            if i % 2 == 1 {
                for (j, v) in r.iter_mut().enumerate().step_by(2) {
                    *v = ((i * 31 + j * 17) % 13) as f32 / 13.0 - 0.5;
                }
            }
            r
        })
        .collect();
    let (af, bf) = (
        npy_rows(dir.path(), "a.npy", &x),
        npy_rows(dir.path(), "b.npy", &b),
    );
    let lab = labels_csv(dir.path(), "labels.csv", &set.labels);
    let json = eval_json(
        dir.path(),
        &[
            "--embeddings",
            s(&af),
            "--labels",
            s(&lab),
            "--versus",
            s(&bf),
        ],
    );
    let opts = EvalOptions {
        recall_ks: vec![1, 2, 4, 8],
        progress: false,
        ..EvalOptions::default()
    };
    let b_t = Tensor::new(b.concat(), &Device::Cpu)
        .unwrap()
        .reshape((n, d - 8))
        .unwrap();
    let ra = evaluate(&set.embeddings, &set.labels, None, &opts).unwrap();
    let rb = evaluate(&b_t, &set.labels, None, &opts).unwrap();
    let want = rankwise::retrieval::paired_differences(&ra, &rb).unwrap();
    assert_eq!(rows(&json), report_rows(&ra));
    assert_eq!(json.settings["versus"], s(&bf));
    for (row, w) in json.rows.iter().zip(&want) {
        let v = row.versus.as_ref().unwrap();
        assert_eq!(v.value.to_bits(), w.b.to_bits(), "{}", row.metric);
        assert_eq!(v.difference.to_bits(), w.difference.to_bits());
        assert_eq!((v.interval_low, v.interval_high), w.interval);
        assert_eq!((v.p, v.queries), (w.p, w.queries));
    }
    // The scrambled half loses R@1 beyond the noise of the 600 queries.
    let r1 = json.rows.iter().find(|r| r.metric == "R@1").unwrap();
    let v = r1.versus.as_ref().unwrap();
    assert!(v.difference > 0.0 && v.p < 0.05, "{v:?}");
    // Against itself: no difference anywhere.
    let same = eval_json(
        dir.path(),
        &[
            "--embeddings",
            s(&af),
            "--labels",
            s(&lab),
            "--versus",
            s(&af),
        ],
    );
    for row in &same.rows {
        let v = row.versus.as_ref().unwrap();
        assert_eq!((v.difference, v.p), (0.0, 1.0), "{}", row.metric);
    }
    // The split protocol: the second model's queries and references.
    let split = even_odd_files(dir.path(), &x, &set.labels, "");
    let files = split_flags(&split);
    let versus = even_odd_files(dir.path(), &b, &set.labels, "b");
    let json = eval_json(
        dir.path(),
        &[
            &files[..],
            &[
                "--versus-queries",
                s(&versus[0]),
                "--versus-references",
                s(&versus[1]),
            ],
        ]
        .concat(),
    );
    assert_eq!(json.num_queries, 300);
    assert!(json
        .rows
        .iter()
        .all(|r| r.versus.as_ref().unwrap().queries == r.queries));

    // Another number of items, or half of the split pair, fails naming the files or flags.
    let short = npy_rows(dir.path(), "short.npy", &x[..599]);
    let e = fails(&[
        "eval",
        "--quiet",
        "--embeddings",
        s(&af),
        "--labels",
        s(&lab),
        "--versus",
        s(&short),
    ]);
    assert!(
        e.contains("short.npy has 599 rows") && e.contains("a.npy has 600"),
        "{e}"
    );
    let e = fails(
        &[
            &["eval", "--quiet"][..],
            &files[..],
            &[
                "--versus-queries",
                s(&versus[0]),
                "--versus-references",
                s(&split[0]),
            ],
        ]
        .concat(),
    );
    assert!(
        e.contains("dimension 56") && e.contains("dimension 64"),
        "{e}"
    );
    let out = rankwise(
        &[
            &["eval"][..],
            &files[..],
            &["--versus-queries", s(&versus[0])],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--versus-references"));
}

#[test]
fn bad_input_fails_cleanly_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    let labels = Labels::new((0..6).map(|i| vec![i / 2, i / 4]).collect()).unwrap();
    let lab = labels_csv(p, "labels.csv", &labels);
    let eval =
        |emb: &Path, lab: &Path| fails(&["eval", "--embeddings", s(emb), "--labels", s(lab)]);

    let one_d = write(
        p,
        "one_d.npy",
        &npy_bytes("<f4", false, &[6], &f32_bytes(vec![1.0; 6])),
    );
    let e = eval(&one_d, &lab);
    assert!(
        e.contains("one_d.npy") && e.contains("2-D") && e.contains("1-D"),
        "{e}"
    );

    let three_d = write(
        p,
        "three_d.npy",
        &npy_bytes("<f4", false, &[6, 2, 2], &f32_bytes(vec![1.0; 24])),
    );
    let e = eval(&three_d, &lab);
    assert!(e.contains("three_d.npy") && e.contains("3-D"), "{e}");

    let mut values = vec![0.5f32; 12];
    values[4 * 2 + 1] = f32::NAN;
    let nan = write(
        p,
        "nan.npy",
        &npy_bytes("<f4", false, &[6, 2], &f32_bytes(values)),
    );
    let e = eval(&nan, &lab);
    assert!(
        e.contains("nan.npy") && e.contains("row 4") && e.contains("NaN"),
        "{e}"
    );

    let seven = write(
        p,
        "seven.npy",
        &npy_bytes("<f4", false, &[7, 2], &f32_bytes(vec![0.5; 14])),
    );
    let e = eval(&seven, &lab);
    assert!(e.contains("7 embeddings") && e.contains("6 labels"), "{e}");

    let good = write(
        p,
        "good.npy",
        &npy_bytes("<f4", false, &[6, 2], &f32_bytes(vec![0.5; 12])),
    );
    let malformed = write(
        p,
        "malformed.csv",
        b"class_id,super_class_id\n0,0\n0,0\n1,0\n1,0\n2;1\n2,1\n",
    );
    let e = eval(&good, &malformed);
    assert!(e.contains("malformed.csv:6:") && e.contains("field"), "{e}");

    let not_int = write(
        p,
        "not_int.csv",
        b"class_id,super_class_id\n0,0\n0,0\n1,0\nshoe,0\n2,1\n2,1\n",
    );
    let e = eval(&good, &not_int);
    assert!(
        e.contains("not_int.csv:5:") && e.contains("column 'class_id'") && e.contains("'shoe'"),
        "{e}"
    );

    let e = eval(&p.join("missing.npy"), &lab);
    assert!(e.contains("missing.npy"), "{e}");

    let e = fails(&[
        "eval",
        "--embeddings",
        s(&good),
        "--labels",
        s(&lab),
        "--relevance",
        "wap",
    ]);
    assert!(e.contains("--wap-weights"), "{e}");
    let e = fails(&[
        "eval",
        "--embeddings",
        s(&good),
        "--labels",
        s(&lab),
        "--relevance",
        "wap",
        "--wap-weights",
        "1",
    ]);
    assert!(e.contains("one weight per level"), "{e}");
    let e = fails(&[
        "eval",
        "--embeddings",
        s(&good),
        "--labels",
        s(&lab),
        "--relevance",
        "level",
        "--no-count-query",
    ]);
    assert!(e.contains("only applies to --relevance pop"), "{e}");
    let e = fails(&[
        "eval",
        "--embeddings",
        s(&good),
        "--labels",
        s(&lab),
        "--out",
        s(&p.join("r.txt")),
    ]);
    assert!(e.contains(".json or .csv"), "{e}");
    let e = fails(&["eval"]);
    assert!(e.contains("nothing to evaluate"), "{e}");
}

#[test]
fn fortran_order_npy_matches_c_order_through_the_reader() {
    // The same 3 × 2 matrix in both orders, read by the library directly.
    let dir = tempfile::tempdir().unwrap();
    let c = write(
        dir.path(),
        "c.npy",
        &npy_bytes("<f4", false, &[3, 2], &f32_bytes([1., 2., 3., 4., 5., 6.])),
    );
    let f = write(
        dir.path(),
        "f.npy",
        &npy_bytes("<f4", true, &[3, 2], &f32_bytes([1., 3., 5., 2., 4., 6.])),
    );
    let a = rankwise::io::read_npy(&c)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let b = rankwise::io::read_npy(&f)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(a, vec![vec![1., 2.], vec![3., 4.], vec![5., 6.]]);
    assert_eq!(a, b);
}

/// A recipe small enough for a test (seconds): 16 fine classes × 6 images of 16 × 16 of the
/// embedded dataset, a two-stage small CNN, Smooth-AP.
const TINY_RECIPE: &str = r#"
seed = 3
epochs = 2
[dataset]
kind = "embedded"
families = 2
variants_per_family = 2
fine_per_variant = 4
images_per_class = 6
image_size = 16
[model.backbone]
kind = "small_cnn"
widths = [4, 8]
[model.head]
dim = 16
[loss]
kind = "smooth_ap"
tau = 0.01
[sampler]
kind = "m_per_class"
batch_size = 8
samples_per_class = 2
[eval]
recall_ks = [1, 2]
batch_size = 32
"#;

fn read_run_results(dir: &Path) -> rankwise::train::RunResults {
    rankwise::train::read_results(dir).unwrap()
}

#[test]
fn train_resume_embed_eval_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let run = dir.path().join("run");
    let out = succeeds(&[
        "train",
        "--config",
        s(&recipe),
        "--out",
        s(&run),
        "-q",
        "--set",
        "epochs=1",
        "--set",
        "loss.tau=0.05",
        "--set",
        "optimizer.head.lr=5e-3",
    ]);
    assert!(out.contains("R@1"), "{out}");
    // The resolved configuration, the metrics, the checkpoint and the results are there.
    let config = rankwise::train::TrainConfig::from_toml_file(run.join("config.toml")).unwrap();
    assert_eq!(config.epochs, 1);
    assert_eq!(config.optimizer.head.lr, 5e-3);
    assert!(std::fs::read_to_string(run.join("config.toml"))
        .unwrap()
        .contains("tau = 0.05"));
    for f in [
        "metrics.csv",
        "metrics.parquet",
        "checkpoint.safetensors",
        "results.json",
    ] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    let r1 = read_run_results(&run);
    assert_eq!((r1.epochs, r1.final_epoch), (1, 1));
    let (before, after) = (r1.r_at_1_untrained.unwrap(), r1.r_at_1_final.unwrap());
    assert!((0.0..=1.0).contains(&before) && (0.0..=1.0).contains(&after));
    assert!(!r1.untrained_metrics.is_empty() && !r1.final_metrics.is_empty());
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert!(csv.lines().count() > 5 && csv.contains("R@1"), "{csv}");

    // Resume for one more epoch: the log goes on, the untrained evaluation is kept.
    succeeds(&[
        "train",
        "--config",
        s(&recipe),
        "--out",
        s(&run),
        "-q",
        "--resume",
        "--set",
        "epochs=2",
        "--set",
        "loss.tau=0.05",
        "--set",
        "optimizer.head.lr=5e-3",
    ]);
    let r2 = read_run_results(&run);
    assert_eq!((r2.epochs, r2.final_epoch), (2, 2));
    assert_eq!(r2.r_at_1_untrained, Some(before));
    // Another loss than the checkpoint's: refused, naming the field.
    let e = fails(&[
        "train",
        "--config",
        s(&recipe),
        "--out",
        s(&run),
        "-q",
        "--resume",
        "--set",
        "epochs=3",
    ]);
    assert!(
        e.contains("checkpoint.safetensors") && e.contains("`loss`"),
        "{e}"
    );

    // Embed the test split with the checkpoint, then evaluate the files with `rankwise eval`:
    // the same R@1 as the trainer's own final evaluation.
    let emb = dir.path().join("emb.npy");
    let labels = dir.path().join("labels.csv");
    let set = [
        "--set",
        "epochs=2",
        "--set",
        "loss.tau=0.05",
        "--set",
        "optimizer.head.lr=5e-3",
    ];
    let mut args = vec!["embed", "--config", s(&recipe), "--checkpoint"];
    let ckpt = run.join("checkpoint.safetensors");
    args.extend([
        s(&ckpt),
        "--split",
        "test",
        "--out",
        s(&emb),
        "--labels-out",
        s(&labels),
        "-q",
    ]);
    args.extend(set);
    succeeds(&args);
    let header = std::fs::read_to_string(&labels).unwrap();
    assert!(header.starts_with("fine,variant,family\n"), "{header}");
    let table = eval_json(
        dir.path(),
        &[
            "--embeddings",
            s(&emb),
            "--labels",
            s(&labels),
            "--recall-at",
            "1,2",
        ],
    );
    let ours = table
        .rows
        .iter()
        .find(|r| r.metric == "R@1" && r.level == Some(0))
        .unwrap()
        .value;
    let trainer = r2
        .final_metrics
        .iter()
        .find(|r| r.split == "test" && r.metric == "R@1" && r.level == Some(0))
        .unwrap()
        .value;
    assert!(
        (ours - trainer).abs() < 1e-9,
        "eval {ours} vs trainer {trainer}"
    );
    assert_eq!(Some(trainer), r2.r_at_1_final);
    let n_test = table.num_queries;
    assert_eq!(n_test, 48, "8 test classes × 6 images");

    // The training split has the other half of the classes.
    let train_emb = dir.path().join("train.npy");
    let mut args = vec!["embed", "--config", s(&recipe), "--checkpoint", s(&ckpt)];
    args.extend(["--split", "train", "--out", s(&train_emb), "-q"]);
    args.extend(set);
    succeeds(&args);
    let t = rankwise::io::read_npy(&train_emb).unwrap();
    assert_eq!(t.dims(), &[48, 16]);
    // No gallery in this protocol; a wrong output extension; a missing checkpoint.
    let mut args = vec!["embed", "--config", s(&recipe), "--checkpoint", s(&ckpt)];
    args.extend(["--split", "gallery", "--out", s(&emb), "-q"]);
    args.extend(set);
    let e = fails(&args);
    assert!(e.contains("`gallery`") && e.contains("train, test"), "{e}");
    // Nor a separate query set: `query` is refused, not silently the test split.
    let mut args = vec!["embed", "--config", s(&recipe), "--checkpoint", s(&ckpt)];
    args.extend(["--split", "query", "--out", s(&emb), "-q"]);
    args.extend(set);
    let e = fails(&args);
    assert!(
        e.contains("`query`") && e.contains("no separate query set"),
        "{e}"
    );
    let e = fails(&[
        "embed",
        "--config",
        s(&recipe),
        "--checkpoint",
        s(&ckpt),
        "--split",
        "test",
        "--out",
        "emb.txt",
    ]);
    assert!(e.contains("emb.txt") && e.contains(".npy"), "{e}");
    let e = fails(&[
        "embed",
        "--config",
        s(&recipe),
        "--checkpoint",
        "nope.safetensors",
        "--split",
        "test",
        "--out",
        s(&emb),
    ]);
    assert!(e.contains("nope.safetensors"), "{e}");
}

#[test]
fn train_overrides_and_bad_input_fail_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let run = dir.path().join("run");
    let train = |extra: &[&str]| train_tiny_fails(&recipe, &run, &[&["-q"], extra].concat());
    // An unknown key (optimizer has backbone / head / loss groups, no `lr`).
    let e = train(&["--set", "epochs=1", "--set", "optimizer.lr=1e-4"]);
    assert!(
        e.contains("--set optimizer.lr=1e-4") && e.contains("`lr`"),
        "{e}"
    );
    assert!(
        e.contains("backbone"),
        "the error lists the known keys: {e}"
    );
    let e = train(&["--set", "epochz=1"]);
    assert!(e.contains("--set epochz=1") && e.contains("epochz"), "{e}");
    // A value of the wrong type, an invalid value, a value that is not TOML, no `=`.
    let e = train(&["--set", "epochs=abc"]);
    assert!(e.contains("--set epochs=abc"), "{e}");
    let e = train(&["--set", "loss.tau=0.05", "--set", "epochs=0"]);
    assert!(e.contains("--set epochs=0") && e.contains("epochs"), "{e}");
    let e = train(&["--set", "eval.recall_ks=[1,"]);
    assert!(
        e.contains("--set eval.recall_ks=[1,") && e.contains("not a TOML value"),
        "{e}"
    );
    let e = train(&["--set", "epochs"]);
    assert!(e.contains("--set epochs") && e.contains("key=value"), "{e}");
    let e = train(&["--set", "epochs.x=1"]);
    assert!(
        e.contains("--set epochs.x=1") && e.contains("not a table"),
        "{e}"
    );
    // A bare word is a string: a loss kind that does not exist is named.
    let e = train(&["--set", "loss.kind=nosuchloss"]);
    assert!(
        e.contains("--set loss.kind=nosuchloss") && e.contains("nosuchloss"),
        "{e}"
    );
    // Nothing was trained: no results.
    assert!(!run.join("results.json").exists());
    // --resume without a checkpoint, a missing recipe, a bad recipe, a bad device.
    let e = train(&["--resume"]);
    assert!(
        e.contains("checkpoint.safetensors") && e.contains("--resume"),
        "{e}"
    );
    let e = fails(&["train", "--config", "no/such.toml", "-q"]);
    assert!(e.contains("no/such.toml"), "{e}");
    let bad = write(dir.path(), "bad.toml", b"epochs = 1\nepochz = 2\n");
    let e = fails(&["train", "--config", s(&bad), "-q"]);
    assert!(e.contains("bad.toml") && e.contains("epochz"), "{e}");
    let e = train(&["--device", "gpu"]);
    assert!(e.contains("--device") && e.contains("gpu"), "{e}");
}

#[test]
fn trains_from_pretrained_weights_in_the_hugging_face_cache() {
    use candle_core::DType;
    use rankwise::models::{ParamStore, ResNet, ResNetConfig, ResNetDepth};
    let dir = tempfile::tempdir().unwrap();
    // A miniature ResNet-18 state dict with torchvision's names, in a fake HF cache, as
    // `huggingface_hub` lays it out: refs/main holds the commit of the snapshot.
    let mut cfg = ResNetConfig::new(ResNetDepth::Resnet18, true);
    cfg.base_width = 2;
    let store = ParamStore::new(11);
    ResNet::new(&cfg, store.var_builder(DType::F32, &Device::Cpu)).unwrap();
    let mut tensors: std::collections::HashMap<String, Tensor> = store
        .all()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().copy().unwrap()))
        .collect();
    tensors.insert(
        "fc.weight".into(),
        Tensor::zeros((10, 16), DType::F32, &Device::Cpu).unwrap(),
    );
    let cache = dir.path().join("hub");
    let repo = cache.join("models--someone--tiny-resnet18");
    let snapshot = repo.join("snapshots").join("0123abcd");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), "0123abcd").unwrap();
    candle_core::safetensors::save(&tensors, snapshot.join("model.safetensors")).unwrap();
    let recipe = format!(
        "pretrained = \"hf:someone/tiny-resnet18/model.safetensors\"\ninput_norm = \"imagenet\"\n{}",
        TINY_RECIPE.replace(
            "kind = \"small_cnn\"\nwidths = [4, 8]",
            "kind = \"resnet\"\ndepth = \"resnet18\"\nbase_width = 2\nfrozen_bn = true",
        )
    );
    let recipe_path = write(dir.path(), "pre.toml", recipe.as_bytes());
    let run = dir.path().join("run");
    let args = [
        "train",
        "--config",
        s(&recipe_path),
        "--out",
        s(&run),
        "-q",
        "--set",
        "epochs=1",
    ];
    // Offline and cached: used without the network.
    let out = rankwise_env(
        &args,
        &[("HF_HUB_CACHE", &cache), ("HF_HUB_OFFLINE", Path::new("1"))],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The untrained network is the pretrained one: its checkpoint (after one epoch of training
    // with frozen BN) keeps the pretrained running statistics.
    let (saved, _) =
        rankwise::train::checkpoint::load(&run.join("checkpoint.safetensors"), &Device::Cpu)
            .unwrap();
    let want: Vec<f32> = tensors["layer2.0.bn1.running_mean"].to_vec1().unwrap();
    let got: Vec<f32> = saved["model.backbone.layer2.0.bn1.running_mean"]
        .to_vec1()
        .unwrap();
    assert_eq!(want, got);
    // Not cached, offline: a clear error naming the repository and the cache, no hang.
    let empty = dir.path().join("empty-cache");
    std::fs::create_dir_all(&empty).unwrap();
    let mut args = args.to_vec();
    args.push("--overwrite");
    let out = rankwise_env(
        &args,
        &[("HF_HUB_CACHE", &empty), ("HF_HUB_OFFLINE", Path::new("1"))],
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains("hf:someone/tiny-resnet18")
            && e.contains("empty-cache")
            && e.contains("HF_HUB_OFFLINE"),
        "{e}"
    );
}

#[test]
fn reproduce_tiny_writes_one_paper_into_given_folders() {
    let dir = tempfile::tempdir().unwrap();
    let (tables, figures, runs) = (
        dir.path().join("tables"),
        dir.path().join("figures"),
        dir.path().join("runs"),
    );
    let root = env!("CARGO_MANIFEST_DIR");
    // `reproduce --scale tiny PAPER` into the temporary folders, then `extra` arguments.
    let args = |paper: &'static str, extra: &[&'static str]| {
        let mut a = vec![
            "reproduce",
            "--scale",
            "tiny",
            paper,
            "--root",
            root,
            "--tables-dir",
            s(&tables),
            "--figures-dir",
            s(&figures),
            "--runs-dir",
            s(&runs),
        ];
        a.extend(extra);
        a
    };
    let out = succeeds(&args("smooth_ap", &[]));
    assert!(out.contains("== smooth_ap (tiny)"), "{out}");
    assert!(tables.join("smooth_ap.md").is_file(), "{out}");
    assert!(tables.join("measured").join("smooth_ap_tiny.csv").is_file());
    assert!(std::fs::read_dir(&figures).unwrap().count() > 0);
    assert!(
        std::fs::read_dir(&runs).unwrap().count() > 0,
        "runs are cached"
    );
    // Read back by run code: this build's own runs are found and nothing trains; another
    // code's are absent, and nothing trains in their place.
    let code = rankwise::experiments::runs::RUN_CODE;
    let again = succeeds(&args("smooth_ap", &["--runs-of", code]));
    assert!(
        again.contains("cached") && !again.contains(": training ("),
        "{again}"
    );
    let e = fails(&args("smooth_ap", &["--runs-of", "00000000000000aa"]));
    assert!(
        e.contains("00000000000000aa") && e.contains("never trained"),
        "{e}"
    );
    // Two codes, this build's second: every run is this build's and cached, so none trains;
    // a run removed from the cache is the one that trains (what a table gained since).
    let both = ["--runs-of", "00000000000000aa", "--runs-of", code];
    let again = succeeds(&args("smooth_ap", &both));
    assert!(
        again.contains("those none has trained now") && !again.contains(": training ("),
        "{again}"
    );
    let one_run = std::fs::read_dir(&runs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .unwrap();
    std::fs::remove_file(&one_run).unwrap();
    let again = succeeds(&args("smooth_ap", &both));
    assert_eq!(again.matches(": training (").count(), 1, "{again}");
    assert!(one_run.is_file(), "the run trained again is cached again");
    let e = fails(&args("ssr", &["--runs-of", "00000000000000aa"]));
    assert!(e.contains("SSR") && e.contains("00000000000000aa"), "{e}");
    let e = fails(&args("ssr", &both));
    assert!(e.contains("SSR") && e.contains("00000000000000aa"), "{e}");
    let e = fails(&args("smooth_ap", &["--runs-of", "not-a-code"]));
    assert!(e.contains("16 hex digits"), "{e}");
    let e = fails(&[
        "reproduce",
        "--scale",
        "tiny",
        "nosuchpaper",
        "--root",
        root,
    ]);
    assert!(e.contains("nosuchpaper") && e.contains("smooth_ap"), "{e}");
    let e = fails(&["reproduce", "--scale", "huge", "--root", root]);
    assert!(e.contains("huge"), "{e}");
    let e = fails(&["reproduce", "--scale", "tiny", "--root", s(dir.path())]);
    assert!(e.contains("configs/experiments"), "{e}");
}

/// Runs `rankwise train` on the tiny recipe into `run` with `extra` arguments.
fn train_args<'a>(recipe: &'a Path, run: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["train", "--config", s(recipe), "--out", s(run)];
    a.extend_from_slice(extra);
    a
}

fn train_tiny(recipe: &Path, run: &Path, extra: &[&str]) -> Output {
    rankwise(&train_args(recipe, run, extra))
}

/// [`train_tiny`], expecting a clean failure ([`fails`]); returns stderr.
fn train_tiny_fails(recipe: &Path, run: &Path, extra: &[&str]) -> String {
    fails(&train_args(recipe, run, extra))
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn run_folders_are_never_silently_overwritten_shared_or_trusted_when_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let run = dir.path().join("run");
    // Not quiet, and stderr is a pipe (not a terminal): one line per epoch all the same.
    let out = train_tiny(&recipe, &run, &["--set", "epochs=2"]);
    let err = stderr_of(&out);
    assert!(out.status.success(), "{err}");
    for epoch in ["epoch 1/2: loss ", "epoch 2/2: loss "] {
        assert!(err.contains(epoch), "no `{epoch}` line in:\n{err}");
    }
    assert!(err.contains("test R@1 ") && err.contains("ETA"), "{err}");
    let snapshot = |names: &[&str]| -> Vec<Vec<u8>> {
        names
            .iter()
            .map(|n| std::fs::read(run.join(n)).unwrap())
            .collect()
    };
    let files = ["config.toml", "checkpoint.safetensors", "results.json"];
    let before = snapshot(&files);

    // The same folder again: refused, naming both ways out; nothing changed.
    let e = train_tiny_fails(&recipe, &run, &["-q", "--set", "epochs=1"]);
    assert!(
        e.contains("holds a run") && e.contains("--resume") && e.contains("--overwrite"),
        "{e}"
    );
    // --resume with fewer epochs than the run has done: an error before anything is written.
    let e = train_tiny_fails(&recipe, &run, &["-q", "--resume", "--set", "epochs=1"]);
    assert!(
        e.contains("--set epochs=1") && e.contains("already trained 2 epochs"),
        "{e}"
    );
    assert_eq!(snapshot(&files), before, "a refused run changed the folder");

    // A second writer is refused while the folder's lock is held (here by this test process).
    let lock = rankwise::train::RunLock::acquire(&run).unwrap();
    let e = train_tiny_fails(&recipe, &run, &["-q", "--resume", "--set", "epochs=3"]);
    assert!(
        e.contains("in use by another process")
            && e.contains(&format!("pid {}", std::process::id())),
        "{e}"
    );
    drop(lock);
    assert!(
        !run.join("run.lock").exists(),
        "the lock file outlives its lock"
    );

    // Temporary files of saves killed before their rename (kill -9) are removed by the next run.
    for tmp in [
        ".checkpoint.safetensors.x1Yz9q.tmp",
        "checkpoint.safetensors.tmp.4242",
    ] {
        std::fs::write(run.join(tmp), b"partial").unwrap();
    }
    std::fs::write(run.join("notes.txt"), b"mine").unwrap();
    let out = train_tiny(&recipe, &run, &["--resume", "--set", "epochs=3"]);
    let e = stderr_of(&out);
    assert!(out.status.success(), "{e}");
    assert!(e.contains("removed 2 temporary file(s)"), "{e}");
    assert!(!run.join("checkpoint.safetensors.tmp.4242").exists());
    assert!(!run.join(".checkpoint.safetensors.x1Yz9q.tmp").exists());
    assert!(run.join("notes.txt").exists(), "a user's file was removed");
    assert_eq!(read_run_results(&run).epochs, 3);

    // results.json holds numbers, not strings; the overrides are recorded.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("results.json")).unwrap()).unwrap();
    assert!(json["final_metrics"][0]["value"].is_number(), "{json}");
    assert!(json["r_at_1_final"].is_number(), "{json}");
    assert_eq!(json["overrides"][0], "epochs=3");

    // A flipped byte in the checkpoint: refused on resume, naming the damaged tensor.
    let ckpt = run.join("checkpoint.safetensors");
    let mut bytes = std::fs::read(&ckpt).unwrap();
    let at = bytes.len() - 5;
    bytes[at] ^= 0x01;
    std::fs::write(&ckpt, &bytes).unwrap();
    let e = train_tiny_fails(&recipe, &run, &["-q", "--resume", "--set", "epochs=4"]);
    assert!(
        e.contains("checkpoint.safetensors") && e.contains("is damaged"),
        "{e}"
    );

    // --overwrite replaces the run: the old files go, the new run's are written.
    let out = train_tiny(&recipe, &run, &["-q", "--overwrite", "--set", "epochs=1"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let r = read_run_results(&run);
    assert_eq!((r.epochs, r.final_epoch), (1, 1));
    assert!(run.join("notes.txt").exists());
    // -q: nothing on stderr.
    assert_eq!(stderr_of(&out), "");
    let out = train_tiny(&recipe, &run, &["--resume", "--overwrite"]);
    assert!(!out.status.success());
    assert!(stderr_of(&out).contains("--overwrite"));
}

#[test]
fn two_trainings_into_one_new_folder_leave_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let run = dir.path().join("run");
    let spawn = |seed: &str| train_tiny(&recipe, &run, &["-q", "--set", "epochs=1", "--set", seed]);
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| spawn("seed=1"));
        let b = scope.spawn(|| spawn("seed=2"));
        (a.join().unwrap(), b.join().unwrap())
    });
    let ok: Vec<&Output> = [&a, &b]
        .into_iter()
        .filter(|o| o.status.success())
        .collect();
    assert_eq!(ok.len(), 1, "{}\n{}", stderr_of(&a), stderr_of(&b));
    let loser = if a.status.success() { &b } else { &a };
    let e = stderr_of(loser);
    assert!(
        e.contains("in use by another process") || e.contains("holds a run"),
        "{e}"
    );
    // The folder's configuration and results belong to the same run.
    let config = rankwise::train::TrainConfig::from_toml_file(run.join("config.toml")).unwrap();
    let winner_seed = if a.status.success() { 1 } else { 2 };
    assert_eq!(config.seed, winner_seed);
    assert_eq!(
        read_run_results(&run).overrides[1],
        format!("seed={winner_seed}")
    );
}

#[test]
fn recipe_errors_come_before_any_folder_and_name_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let run = dir.path().join("run");
    for (set, field) in [
        ("sampler.batch_size=7", "batch_size"),
        ("optimizer.backbone.lr=-1", "optimizer.backbone.lr"),
        ("optimizer.head.lr=nan", "optimizer.head.lr"),
    ] {
        let e = train_tiny_fails(&recipe, &run, &["-q", "--set", set]);
        assert!(
            e.contains(&format!("--set {set}")) && e.contains(field),
            "{e}"
        );
        assert!(!run.exists(), "{set}: a refused run left a folder");
    }
    // A batch larger than the data: found when the data is loaded, still before the folder.
    let e = train_tiny_fails(&recipe, &run, &["-q", "--set", "sampler.batch_size=400"]);
    assert!(e.contains("--set sampler.batch_size=400"), "{e}");
    assert!(!run.exists());
    if !cfg!(feature = "cuda") {
        let e = train_tiny_fails(&recipe, &run, &["-q", "--device", "cuda"]);
        assert!(
            e.contains("--device cuda") && e.contains("--features cuda"),
            "{e}"
        );
        assert!(!run.exists());
    }
    // An --out that cannot be a folder.
    let file = write(dir.path(), "a_file", b"x");
    let e = train_tiny_fails(&recipe, &file, &["-q"]);
    assert!(e.contains("a_file") && e.contains("not a folder"), "{e}");
}

#[test]
fn outputs_are_checked_before_the_work_and_os_errors_print_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir/r.json");
    let e = fails(&["eval", "--example", "--out", s(&missing)]);
    assert!(
        e.contains("no/such/dir") && e.contains("does not exist"),
        "{e}"
    );
    // Failed before ranking anything: no table on stdout.
    let out = rankwise(&["eval", "--example", "--out", s(&missing)]);
    assert!(out.stdout.is_empty(), "the evaluation ran before the check");
    let e = fails(&["eval", "--example", "--out", s(dir.path())]);
    assert!(
        e.contains("is a folder") || e.contains("results format"),
        "{e}"
    );
    // An OS error appears once in the message, not once per cause.
    let nowhere = dir.path().join("nowhere.npy");
    let labels = dir.path().join("nowhere.csv");
    let e = fails(&["eval", "--embeddings", s(&nowhere), "--labels", s(&labels)]);
    assert_eq!(e.matches("No such file or directory").count(), 1, "{e}");
}

#[test]
fn long_tasks_show_progress_lines_without_a_terminal() {
    // stderr is a pipe here; a zero interval makes the short tasks print their lines.
    let zero = Path::new("0");
    let out = rankwise_env(
        &["eval", "--example"],
        &[("RANKWISE_PROGRESS_SECONDS", zero)],
    );
    let e = stderr_of(&out);
    assert!(out.status.success(), "{e}");
    assert!(
        e.contains("evaluating: ") && e.contains(" queries (") && e.contains(", done"),
        "{e}"
    );
    let out = rankwise_env(
        &["eval", "--example", "-q"],
        &[("RANKWISE_PROGRESS_SECONDS", zero)],
    );
    assert_eq!(stderr_of(&out), "");
    // The default interval (10 s): a task of a second prints no progress line.
    let out = rankwise(&["eval", "--example"]);
    assert!(!stderr_of(&out).contains("evaluating: "));
}

#[test]
fn help_shows_examples_and_every_paper() {
    for cmd in [
        "train",
        "embed",
        "eval",
        "reproduce",
        "gen-embeddings",
        "synth-data",
        "fewshot",
    ] {
        let out = succeeds(&[cmd, "--help"]);
        assert!(out.contains("Examples:"), "{cmd} --help:\n{out}");
    }
    let out = succeeds(&["reproduce", "--help"]);
    for key in rankwise::experiments::keys() {
        assert!(out.contains(key), "reproduce --help omits {key}:\n{out}");
    }
}

/// `classes` fine classes of `per_class` items (pairs of fine classes share a coarse one) in
/// `dim` dimensions, each class a direction plus a fixed pseudo-random noise: accuracies between
/// chance and 100%.
fn fewshot_set(classes: usize, per_class: usize, dim: usize) -> (Vec<Vec<f32>>, Labels) {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f32 / (1u64 << 53) as f32 - 0.5
    };
    let mut x = Vec::new();
    let mut rows = Vec::new();
    for c in 0..classes {
        for _ in 0..per_class {
            x.push(
                (0..dim)
                    .map(|j| if j == c % dim { 1.0 } else { 0.0 } + 1.5 * next())
                    .collect(),
            );
            rows.push(vec![c as i64, (c / 2) as i64]);
        }
    }
    (x, Labels::new(rows).unwrap())
}

#[test]
fn fewshot_scores_the_librarys_classifiers_on_shared_episodes() {
    use rankwise::io::fewshot_results::FewShotTable;
    use rankwise::rerank::episode_method::compare_methods;
    use rankwise::rerank::EpisodeMethod;
    use rankwise::samplers::episodes::EpisodeConfig;

    let dir = tempfile::tempdir().unwrap();
    let (x, labels) = fewshot_set(12, 14, 16);
    let feats = npy_rows(dir.path(), "novel.npy", &x);
    let lab = labels_csv(dir.path(), "novel.csv", &labels);
    let json = dir.path().join("fewshot.json");
    let episodes_csv = dir.path().join("episodes.csv");
    let classifiers = ["prototype", "soft-kmeans:2,10", "k-reciprocal:10,5,0.2"];
    let mut args = vec![
        "fewshot",
        "--features",
        s(&feats),
        "--labels",
        s(&lab),
        "--shots",
        "1,3",
        "--queries",
        "5",
        "--episodes",
        "40",
        "--seed",
        "3",
        "--out",
        s(&json),
        "--per-episode",
        s(&episodes_csv),
    ];
    for c in &classifiers {
        args.extend(["--classifier", c]);
    }
    let stdout = succeeds(&args);
    let table: FewShotTable =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(table.rows.len(), 6);
    assert_eq!(table.settings["level"], "0 (class_id)");
    // The per-episode file: every classifier on every episode, in order.
    let mut reader = csv::Reader::from_path(&episodes_csv).unwrap();
    assert_eq!(
        reader.headers().unwrap(),
        vec!["ways", "shots", "episode", "classifier", "accuracy"]
    );
    let per_episode: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(per_episode.len(), 2 * 3 * 40);
    // The library on the same features (as the binary reads them) and the same episodes.
    let set = LabelledEmbeddings::read(&feats, &lab, None, None).unwrap();
    let methods: Vec<EpisodeMethod> = classifiers.iter().map(|c| c.parse().unwrap()).collect();
    for (k, shots) in [1usize, 3].into_iter().enumerate() {
        let config = EpisodeConfig {
            ways: 5,
            shots,
            queries: 5,
            ..EpisodeConfig::default()
        };
        let lib = compare_methods(&methods, &set.embeddings, &set.labels, &config, 40, 3).unwrap();
        for (i, r) in lib.iter().enumerate() {
            let row = &table.rows[k * 3 + i];
            for (e, acc) in r.run.accuracies.iter().enumerate() {
                let line = &per_episode[(k * 3 + i) * 40 + e];
                assert_eq!((&line[1], &line[2]), (&*shots.to_string(), &*e.to_string()));
                assert_eq!(&line[3], r.run.method);
                assert_eq!(line[4].parse::<f64>().unwrap(), *acc);
            }
            assert_eq!(
                (row.ways, row.shots, row.queries, row.episodes),
                (5, shots, 5, 40)
            );
            assert_eq!(row.classifier, r.run.method);
            assert_eq!(
                (row.accuracy, row.std, row.half_width),
                (r.accuracy.mean, r.accuracy.std, r.accuracy.half_width)
            );
            match (&row.versus, &r.versus_first) {
                (None, None) => assert_eq!(i, 0),
                (Some(v), Some(d)) => {
                    assert_eq!(v.classifier, "prototype");
                    assert_eq!(
                        (v.difference, v.interval_low, v.interval_high, v.p),
                        (d.mean, d.interval.0, d.interval.1, d.p)
                    );
                }
                other => panic!("row {i}: {other:?}"),
            }
        }
        assert!(
            stdout.contains(&format!("5-way {shots}-shot  prototype")),
            "{stdout}"
        );
    }
    // Not every classifier is a coin toss or perfect on these features.
    assert!(table
        .rows
        .iter()
        .all(|r| r.accuracy > 20.0 && r.accuracy < 100.0));

    // CSV: a header and the six rows; the coarse level draws its own (6) classes.
    let csv = dir.path().join("fewshot.csv");
    succeeds(&[
        "fewshot",
        "--features",
        s(&feats),
        "--labels",
        s(&lab),
        "--level",
        "1",
        "--shots",
        "2",
        "--queries",
        "10",
        "--episodes",
        "10",
        "--classifier",
        "protonet",
        "--classifier",
        "k-reciprocal:grid",
        "--out",
        s(&csv),
        "-q",
    ]);
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[2].contains("k-reciprocal:grid,\"k-reciprocal:"),
        "{text}"
    );

    // Bad input: clean errors naming what is wrong.
    let base = [
        "fewshot",
        "--features",
        s(&feats),
        "--labels",
        s(&lab),
        "-q",
    ];
    fn joined<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [base, extra].concat()
    }
    let with = |extra: &[&'static str]| joined(&base, extra);
    let e = fails(&with(&["--level", "2"]));
    assert!(e.contains("--level 2") && e.contains("novel.csv"), "{e}");
    let e = fails(&with(&["--ways", "13", "--shots", "1"]));
    assert!(e.contains("13-way episodes need 13 classes"), "{e}");
    let e = fails(&with(&["--queries", "14", "--shots", "1"]));
    assert!(e.contains("shots + queries = 15"), "{e}");
    let e = fails(&with(&["--out", "results.txt"]));
    assert!(e.contains("results.txt"), "{e}");
    let e = fails(&with(&["--per-episode", "episodes.json"]));
    assert!(
        e.contains("--per-episode episodes.json") && e.contains(".csv"),
        "{e}"
    );
    for (bad, says) in [
        ("nearest", "unknown classifier"),
        (
            "ssr:/nonexistent/ssr.safetensors",
            "/nonexistent/ssr.safetensors",
        ),
    ] {
        let out = rankwise(&with(&["--classifier", bad]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(says) && !stderr.contains("panicked"),
            "{stderr}"
        );
    }
}

/// `rankwise compare` on the tiny recipe: `seeds` seeds of a baseline and a τ = 0.1 arm, one
/// epoch, R@1 and H-AP, cached in `cache`, written to `out`.
fn compare_args<'a>(
    recipe: &'a Path,
    cache: &'a Path,
    seeds: &'a str,
    out: &'a Path,
) -> Vec<&'a str> {
    vec![
        "compare",
        "--config",
        s(recipe),
        "--cache",
        s(cache),
        "--seeds",
        seeds,
        "--arm",
        "base",
        "--arm",
        "tau: loss.tau=0.1",
        "--set",
        "epochs=1",
        "--metric",
        "R@1",
        "--metric",
        "H-AP",
        "--jobs",
        "2",
        "--out",
        s(out),
    ]
}

#[test]
fn compare_trains_every_arm_on_the_same_seeds_and_tests_them_as_the_library_does() {
    use rankwise::experiments::compare::{holm, Finding, SeedComparison};
    use rankwise::stats::{compare, Sample};
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let cache = dir.path().join("cache");
    let first = dir.path().join("two.json");
    let mut args = compare_args(&recipe, &cache, "2", &first);
    args.push("-q");
    let table = succeeds(&args);
    for says in [
        "2 arms × 2 seeds (0–1)",
        "base",
        "tau",
        "Holm p",
        "paired t-test",
    ] {
        assert!(table.contains(says), "no `{says}` in:\n{table}");
    }
    let read = |p: &Path| -> SeedComparison {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let c = read(&first);
    assert_eq!(c.seeds, vec![0, 1]);
    assert_eq!(c.arms.len(), 2);
    assert!(
        c.arms[1].recipe.contains("tau = 0.1"),
        "{}",
        c.arms[1].recipe
    );
    let keys: Vec<(&str, Option<usize>)> = c
        .rows
        .iter()
        .map(|r| (r.metric.as_str(), r.level))
        .collect();
    assert_eq!(keys, vec![("R@1", Some(0)), ("H-AP", None)]);

    // Each value is the run `rankwise train` gives for that arm's recipe and seed, bit for bit:
    // the arm's override and the seed reach the trainer, and nothing else changes.
    let run = dir.path().join("alone");
    succeeds(&[
        "train",
        "--config",
        s(&recipe),
        "--out",
        s(&run),
        "-q",
        "--set",
        "epochs=1",
        "--set",
        "loss.tau=0.1",
        "--set",
        "seed=1",
    ]);
    let alone = read_run_results(&run).r_at_1_final.unwrap();
    assert_eq!(alone.to_bits(), c.rows[0].arms[1].values[1].to_bits());

    // The tests are the library's paired test over the seeds, Holm-corrected over both rows.
    let sample = |v: &[f64]| Sample::new(v.to_vec()).with_seeds(vec![0, 1]);
    let p: Vec<f64> = c
        .rows
        .iter()
        .map(|r| compare(&sample(&r.arms[1].values), &sample(&r.arms[0].values)).p)
        .collect();
    let adjusted = holm(&p);
    for (r, (p, h)) in c.rows.iter().zip(p.iter().zip(&adjusted)) {
        let v = &r.versus[0];
        assert_eq!((v.p, v.p_holm), (*p, *h), "{}", r.metric);
        let d = r.arms[1]
            .values
            .iter()
            .zip(&r.arms[0].values)
            .map(|(a, b)| a - b);
        assert_eq!(v.difference, d.sum::<f64>() / 2.0);
        assert!(matches!(
            v.finding,
            Finding::Higher | Finding::Lower | Finding::InsideTheNoise
        ));
    }

    // A third seed later: the four runs of seeds 0 and 1 are read back, only seed 2 trains,
    // and the first two seeds' values are unchanged. CSV this time.
    let csv = dir.path().join("three.csv");
    let out = rankwise(&compare_args(&recipe, &cache, "3", &csv));
    let err = stderr_of(&out);
    assert!(out.status.success(), "{err}");
    for says in [
        "base seed 0: cached",
        "tau seed 1: cached",
        "base seed 2: training",
    ] {
        assert!(err.contains(says), "no `{says}` in:\n{err}");
    }
    assert!(!err.contains("seed 0: training"), "{err}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("metric,level,arm,n,mean,half_width,baseline,difference"));
    let base_r1 = lines.next().unwrap();
    assert!(base_r1.starts_with("R@1,0,base,3,"), "{base_r1}");
    let json = dir.path().join("three.json");
    let mut again = compare_args(&recipe, &cache, "3", &json);
    again.push("-q");
    succeeds(&again);
    let c3 = read(&json);
    assert_eq!(c3.rows[0].arms[1].values[..2], c.rows[0].arms[1].values[..]);
    assert_eq!(c3.rows[0].arms[0].values.len(), 3);
}

#[test]
fn compare_refuses_bad_designs_before_anything_trains() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let cache = dir.path().join("cache");
    let r = s(&recipe);
    let c = s(&cache);
    let base = |extra: &[&'static str]| -> Vec<String> {
        let mut a: Vec<String> = ["compare", "--config", r, "--cache", c, "-q"]
            .iter()
            .map(|x| x.to_string())
            .collect();
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let run = |extra: &[&'static str]| {
        let a = base(extra);
        fails(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    for (extra, says) in [
        (&["--arm", "a"][..], "at least two"),
        (
            &["--arm", "a", "--arm", "a: loss.tau=0.1"],
            "two arms are labelled `a`",
        ),
        (&["--arm", "a", "--arm", "b: epochs=2"], "same recipe"),
        (&["--arm", "a", "--arm", "b: loss.tau=abc"], "arm `b`"),
        (
            &["--arm", "a", "--arm", "b: loss.tau=0.1", "--seeds", "1"],
            "two distinct seeds",
        ),
        (
            &["--arm", "a", "--arm", "b: loss.tau=0.1", "--seeds", "0"],
            "--seeds 0",
        ),
        (
            &["--arm", "a", "--arm", "b: loss.tau=0.1", "--looks", "3"],
            "--looks",
        ),
        (
            &["--arm", "a", "--arm", "b: loss.tau=0.1", "--metric", "NDGC"],
            "not a metric",
        ),
        (
            &["--arm", "a", "--arm", "b: loss.tau=0.1", "--metric", "R@4"],
            "eval.recall_ks",
        ),
        (
            &["--arm", "a", "--arm", "b: loss.tau=0.1", "--out", "c.txt"],
            ".json or .csv",
        ),
        (
            &[
                "--arm",
                "a",
                "--arm",
                "b: loss.tau=0.1",
                "--set",
                "epochz=1",
            ],
            "epochz",
        ),
        (
            &["--arm", "a", "--arm", "b: loss.tau=0.1", "--at", "selected"],
            "arm(s) a, b have no [validation]",
        ),
        (
            &[
                "--arm",
                "a: validation.fraction=0.25",
                "--arm",
                "b: loss.tau=0.1",
                "--at",
                "selected",
            ],
            "arm(s) b have no [validation]",
        ),
        (
            &["--arm", "a", "--arm", "b: validation.metric=R@4"],
            "validation.metric",
        ),
    ] {
        let e = run(extra);
        assert!(e.contains(says), "{extra:?}: {e}");
    }
    // The tiny recipe trains 2 epochs; `b: epochs=2` is the same recipe as `a`.
    assert!(!cache.exists(), "a refused comparison trained something");
    // An arm clap cannot read is refused by clap (status 2), naming it.
    let out = rankwise(&[
        "compare",
        "--config",
        r,
        "--arm",
        ": epochs=1",
        "--arm",
        "b",
    ]);
    let err = stderr_of(&out);
    assert!(!out.status.success() && err.contains("no label"), "{err}");
}

/// `[validation]` from the command line: `rankwise train` reports the selected epoch and keeps
/// its network, `rankwise embed --split val` reads the held-out classes, and `rankwise compare
/// --at selected` compares each run's selected epoch, the same value as `rankwise train` selects.
#[test]
fn validation_selects_the_epoch_from_train_to_compare() {
    use rankwise::experiments::compare::{Reading, SeedComparison};
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let run = dir.path().join("run");
    let settings = [
        "--set",
        "validation.fraction=0.25",
        "--set",
        "loss.tau=0.1",
        "--set",
        "seed=1",
    ];
    let mut args = vec!["train", "--config", s(&recipe), "--out", s(&run), "-q"];
    args.extend(settings);
    let out = succeeds(&args);
    assert!(out.contains("selected by val R@1"), "{out}");
    let results = read_run_results(&run);
    let selection = results.selection.clone().unwrap();
    assert!(selection.epoch <= 2);
    assert!(run.join("best.safetensors").is_file());
    // Validation rows are in the log, beside the test rows.
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert!(csv.lines().any(|l| l.contains(",val,R@1,0,")), "{csv}");

    // The held-out classes embedded with the selected network: 2 of the 8 training classes.
    let best = run.join("best.safetensors");
    let npy = dir.path().join("val.npy");
    let labels = dir.path().join("val.csv");
    let mut args = vec![
        "embed",
        "--config",
        s(&recipe),
        "--checkpoint",
        s(&best),
        "--split",
        "val",
        "--out",
        s(&npy),
        "--labels-out",
        s(&labels),
        "-q",
    ];
    args.extend(settings);
    succeeds(&args);
    let text = std::fs::read_to_string(&labels).unwrap();
    let fine: std::collections::BTreeSet<&str> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!((text.lines().count() - 1, fine.len()), (12, 2), "{text}");

    // compare --at selected: every value is a run's selected test value; arm `tau` with seed 1
    // is the run above.
    let json = dir.path().join("selected.json");
    let cache = dir.path().join("cache");
    let out = succeeds(&[
        "compare",
        "--config",
        s(&recipe),
        "--cache",
        s(&cache),
        "--seeds",
        "2",
        "--arm",
        "base",
        "--arm",
        "tau: loss.tau=0.1",
        "--set",
        "validation.fraction=0.25",
        "--metric",
        "R@1",
        "--at",
        "selected",
        "--jobs",
        "2",
        "--out",
        s(&json),
        "-q",
    ]);
    assert!(
        out.contains("at the epoch each run's validation selected"),
        "{out}"
    );
    let c: SeedComparison = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(c.reading, Reading::Selected);
    assert_eq!(c.selected_epochs.len(), 2);
    assert_eq!(c.selected_epochs[1][1], selection.epoch);
    assert_eq!(
        c.rows[0].arms[1].values[1].to_bits(),
        selection.test("test", "R@1", Some(0)).unwrap().to_bits()
    );
}

/// `rankwise tune`: a grid of τ searched on the held-out classes of the tiny recipe. The choice
/// is the best mean validation value, every value is the one `rankwise compare --at selected`
/// reads from the same cached runs (nothing retrains), and the table says what was chosen.
#[test]
fn tune_chooses_on_the_held_out_classes_what_compare_reads_at_the_selected_epochs() {
    use rankwise::experiments::compare::SeedComparison;
    use rankwise::experiments::tune::Tuning;
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let cache = dir.path().join("cache");
    let json = dir.path().join("tune.json");
    let out = succeeds(&[
        "tune",
        "--config",
        s(&recipe),
        "--cache",
        s(&cache),
        "--set",
        "validation.fraction=0.25",
        "--grid",
        "loss.tau=0.01,0.1,1.0",
        "--seeds",
        "2",
        "--metric",
        "H-AP",
        "--jobs",
        "2",
        "--out",
        s(&json),
        "-q",
    ]);
    for says in [
        "3 grid points × 2 seeds (0–1)",
        "by validation R@1",
        "[chosen",
        "vs chosen (Holm p)",
        "Chosen on the held-out classes (25% of the training split's classes): loss.tau=",
    ] {
        assert!(out.contains(says), "no `{says}` in:\n{out}");
    }
    let t: Tuning = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(t.candidates.len(), 3);
    assert_eq!(t.candidates[2].overrides, ["loss.tau=1.0"]);
    // The validation's metric is reported first, beside the one asked for.
    assert_eq!(
        t.metrics,
        vec![("R@1".to_string(), Some(0)), ("H-AP".to_string(), None)]
    );
    let means: Vec<f64> = t.candidates.iter().map(|c| c.validation.mean).collect();
    let top = means.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(t.chosen, means.iter().position(|&m| m == top).unwrap());
    assert_eq!(
        out.contains("[chosen; test's choice too]"),
        t.test_choice == Some(t.chosen)
    );
    // compare --at selected on two of the points, from the cache: the same test values and
    // the same selected epochs, bit for bit.
    let cjson = dir.path().join("compare.json");
    let out = rankwise(&[
        "compare",
        "--config",
        s(&recipe),
        "--cache",
        s(&cache),
        "--seeds",
        "2",
        "--set",
        "validation.fraction=0.25",
        "--arm",
        "a: loss.tau=0.01",
        "--arm",
        "b: loss.tau=1.0",
        "--metric",
        "R@1",
        "--at",
        "selected",
        "--out",
        s(&cjson),
    ]);
    let err = stderr_of(&out);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains(": training"), "retrained:\n{err}");
    let c: SeedComparison =
        serde_json::from_str(&std::fs::read_to_string(&cjson).unwrap()).unwrap();
    for (arm, point) in [(0, 0), (1, 2)] {
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&c.rows[0].arms[arm].values),
            bits(&t.candidates[point].test[0].values)
        );
        assert_eq!(c.selected_epochs[arm], t.candidates[point].selected_epochs);
    }
}

/// `rankwise tune` with `validation.folds`: every point trains once per fold and seed, each
/// seed's values are the mean of its fold runs, and each fold run is the run `rankwise compare`
/// reads from the cache when it names that fold.
#[test]
fn tune_cross_validates_over_the_folds_of_the_training_classes() {
    use rankwise::experiments::compare::SeedComparison;
    use rankwise::experiments::tune::Tuning;
    use rankwise::retrieval::ensemble::{concatenate, TestEmbeddings};
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let cache = dir.path().join("cache");
    let json = dir.path().join("tune.json");
    let out = succeeds(&[
        "tune",
        "--config",
        s(&recipe),
        "--cache",
        s(&cache),
        "--set",
        "validation.folds=2",
        "--grid",
        "loss.tau=0.01,0.1",
        "--seeds",
        "2",
        "--metric",
        "R@1",
        "--jobs",
        "2",
        "--out",
        s(&json),
        "-q",
    ]);
    for says in [
        "2 grid points × 2 seeds (0–1) × 2 folds",
        "chosen on 2-fold cross-validation over the training split's classes",
        "the mean of its 2 fold runs",
        " | ",
        "Chosen by 2-fold cross-validation",
        "Each fold alone (mean over the seeds; * the fold's own choice):",
        "val R@1 fold 1",
    ] {
        assert!(out.contains(says), "no `{says}` in:\n{out}");
    }
    let t: Tuning = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(t.folds(), 2);
    for c in &t.candidates {
        assert_eq!(c.fold_validation.len(), 2);
        assert_eq!(c.selected_epochs.len(), 4);
        for s in 0..2 {
            let mean = (0.0 + c.fold_validation[0][s] + c.fold_validation[1][s]) / 2.0;
            assert_eq!(c.validation.values[s].to_bits(), mean.to_bits());
        }
    }
    // Each fold alone, read by compare from the same cache: nothing retrains, and the tune's
    // test values are the folds' means bit for bit.
    let fold = |f: usize| -> SeedComparison {
        let cjson = dir.path().join(format!("fold{f}.json"));
        let fold_set = format!("validation.fold={f}");
        let out = rankwise(&[
            "compare",
            "--config",
            s(&recipe),
            "--cache",
            s(&cache),
            "--seeds",
            "2",
            "--set",
            "validation.folds=2",
            "--set",
            &fold_set,
            "--arm",
            "a: loss.tau=0.01",
            "--arm",
            "b: loss.tau=0.1",
            "--metric",
            "R@1",
            "--at",
            "selected",
            "--out",
            s(&cjson),
        ]);
        let err = stderr_of(&out);
        assert!(out.status.success(), "{err}");
        assert!(!err.contains(": training"), "retrained:\n{err}");
        serde_json::from_str(&std::fs::read_to_string(&cjson).unwrap()).unwrap()
    };
    let (f0, f1) = (fold(0), fold(1));
    for p in 0..2 {
        let c = &t.candidates[p];
        assert_eq!(
            [f0.selected_epochs[p].clone(), f1.selected_epochs[p].clone()].concat(),
            c.selected_epochs
        );
        for s in 0..2 {
            let mean = (0.0 + f0.rows[0].arms[p].values[s] + f1.rows[0].arms[p].values[s]) / 2.0;
            assert_eq!(c.test[0].values[s].to_bits(), mean.to_bits());
        }
    }
    // Every fold has a choice of its own.
    assert!(
        t.fold_choices().len() == 2 && t.fold_choices().iter().all(Option::is_some),
        "{:?}",
        t.fold_choices()
    );
    // The two folds hold different classes out: their validation values differ somewhere.
    assert_ne!(
        t.candidates[0].fold_validation[0],
        t.candidates[0].fold_validation[1]
    );
    // The fold models as one: each fold run kept its selected epoch's test embeddings beside
    // its result, and each seed's concatenated value is their concatenation evaluated.
    for says in [
        "The 2 fold models as one",
        "− separated R@1 (p)",
        "Its 2 fold models as one, their embeddings concatenated",
    ] {
        assert!(out.contains(says), "no `{says}` in:\n{out}");
    }
    let mut kept: std::collections::BTreeMap<String, (u64, TestEmbeddings)> = Default::default();
    for entry in std::fs::read_dir(&cache).unwrap() {
        let path = entry.unwrap().path();
        if path
            .to_string_lossy()
            .ends_with(".test-embeddings.safetensors")
        {
            let (mut tensors, json) =
                rankwise::train::checkpoint::load(&path, &candle_core::Device::Cpu).unwrap();
            let meta: serde_json::Value = serde_json::from_str(&json).unwrap();
            let labels = tensors.remove("query_labels").unwrap();
            let (n, levels) = labels.dims2().unwrap();
            let flat: Vec<i64> = labels.flatten_all().unwrap().to_vec1().unwrap();
            let labels = Labels::from_flat(n, levels, flat).unwrap();
            let set = TestEmbeddings {
                queries: tensors.remove("queries").unwrap(),
                query_labels: labels,
                gallery: None,
            };
            let run = meta["run"].as_str().unwrap().to_string();
            kept.insert(run, (meta["epoch"].as_u64().unwrap(), set));
        }
    }
    assert_eq!(kept.len(), 2 * 2 * 2, "{:?}", kept.keys());
    let opts = rankwise::retrieval::EvalOptions {
        recall_ks: vec![1, 2],
        ..Default::default()
    };
    for (p, c) in t.candidates.iter().enumerate() {
        assert_eq!(c.concatenated.len(), t.metrics.len());
        for s in 0..2 {
            let members: Vec<TestEmbeddings> = (0..2)
                .map(|f| {
                    let (epoch, set) = &kept[&format!("{} · fold {f} seed {s}", c.label)];
                    assert_eq!(*epoch, c.selected_epochs[f * 2 + s]);
                    set.clone()
                })
                .collect();
            let r1 = concatenate(&members)
                .unwrap()
                .evaluate(&opts)
                .unwrap()
                .get("R@1", Some(0))
                .unwrap();
            assert_eq!(
                c.concatenated[0].values[s].to_bits(),
                r1.to_bits(),
                "point {p}"
            );
        }
        let gain = t.concatenation_gain(p).unwrap();
        assert_eq!(gain.n, 2);
    }
    // A fold run's result without its embeddings is a miss: that run alone trains again.
    let first = cache.join(
        std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .find(|n| n.ends_with(".test-embeddings.safetensors"))
            .unwrap(),
    );
    std::fs::remove_file(&first).unwrap();
    let again = rankwise(&[
        "tune",
        "--config",
        s(&recipe),
        "--cache",
        s(&cache),
        "--set",
        "validation.folds=2",
        "--grid",
        "loss.tau=0.01,0.1",
        "--seeds",
        "2",
        "--metric",
        "R@1",
    ]);
    let err = stderr_of(&again);
    assert!(again.status.success(), "{err}");
    assert_eq!(err.matches(": training").count(), 1, "{err}");
    assert!(first.is_file());
    let again_out = String::from_utf8_lossy(&again.stdout);
    let reading = |o: &str| {
        o[o.find("Chosen by").unwrap()..]
            .lines()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        reading(&again_out),
        reading(&out),
        "the retrained run changed the result"
    );
    // compare needs the fold named; a fraction and folds together are refused.
    let e = fails(&[
        "compare",
        "--config",
        s(&recipe),
        "--cache",
        s(&cache),
        "--set",
        "validation.folds=2",
        "--arm",
        "a",
        "--arm",
        "b: loss.tau=0.1",
        "-q",
    ]);
    assert!(
        e.contains("validation.fold") && e.contains("names no fold"),
        "{e}"
    );
    let e = fails(&[
        "tune",
        "--config",
        s(&recipe),
        "--set",
        "validation.folds=2",
        "--set",
        "validation.fraction=0.25",
        "--grid",
        "loss.tau=0.01,0.1",
        "-q",
    ]);
    assert!(
        e.contains("validation.fraction") && e.contains("not both"),
        "{e}"
    );
    // A training run names its fold (refused before it starts), and the split must have the
    // classes for the folds (refused once the data is read, naming the field).
    let run = dir.path().join("run");
    let args = |sets: &[&'static str]| {
        let mut a = vec![
            "train",
            "--config",
            s(&recipe),
            "--out",
            s(&run),
            "--overwrite",
        ];
        for set in sets {
            a.extend(["--set", *set]);
        }
        a
    };
    let e = fails(&args(&["validation.folds=2"]));
    assert!(
        e.contains("validation.fold") && e.contains("name the fold"),
        "{e}"
    );
    let out = rankwise(&args(&["validation.folds=5", "validation.fold=0"]));
    let e = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains("error: invalid --set validation.folds=5")
            && e.contains("8 fine classes")
            && e.contains("at most 4 folds")
            && !e.contains("panicked"),
        "{e}"
    );
}

/// `rankwise tune --sample`: points drawn at random from a range, the library's draws; more
/// samples with the same seed train only the new points (the first ones come back from the
/// cache); the JSON names the search.
#[test]
fn tune_draws_random_points_and_more_samples_train_only_the_new_ones() {
    use rankwise::experiments::search::{sample, Search};
    use rankwise::experiments::tune::Tuning;
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let cache = dir.path().join("cache");
    let json = dir.path().join("tune.json");
    let range = "loss.tau=loguniform(0.01,1.0)";
    let figures = dir.path().join("figures");
    let search = |samples: &str| {
        rankwise(&[
            "tune",
            "--config",
            s(&recipe),
            "--cache",
            s(&cache),
            "--set",
            "validation.fraction=0.25",
            "--sample",
            range,
            "--samples",
            samples,
            "--sample-seed",
            "3",
            "--seeds",
            "2",
            "--jobs",
            "2",
            "--out",
            s(&json),
            "--figures",
            s(&figures),
        ])
    };
    let out = search("2");
    let err = stderr_of(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches(": training").count(), 4, "{err}");
    let three = search("3");
    let (err, stdout) = (stderr_of(&three), String::from_utf8_lossy(&three.stdout));
    assert!(three.status.success(), "{err}");
    // Only the third point trains, with each of the two seeds.
    assert_eq!(err.matches(": training").count(), 2, "{err}");
    assert!(
        stdout.contains("3 random points (drawn with seed 3) × 2 seeds (0–1)"),
        "{stdout}"
    );
    // The chart along τ, of the three points.
    let svg = std::fs::read_to_string(figures.join("tune_loss_tau.svg")).unwrap();
    assert!(svg.contains("3 random points (drawn with seed 3)"), "{svg}");
    assert!(figures.join("tune_loss_tau.png").is_file());
    let t: Tuning = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let drawn = sample(&[range.parse().unwrap()], 3, 3).unwrap();
    let overrides: Vec<Vec<String>> = t.candidates.iter().map(|c| c.overrides.clone()).collect();
    assert_eq!(overrides, drawn);
    assert_eq!(
        t.search,
        Search::Random {
            ranges: vec![range.parse().unwrap()],
            samples: 3,
            seed: 3
        }
    );
    // Refused: half a random search, a grid with it, one sample, a range clap cannot read.
    let tune = [
        "tune",
        "--config",
        s(&recipe),
        "--set",
        "validation.fraction=0.25",
    ];
    for (extra, says, code) in [
        (&["--sample", range][..], "--samples", 2),
        (
            &["--samples", "3", "--grid", "loss.tau=0.1,1"],
            "--samples goes with --sample",
            1,
        ),
        (
            &[
                "--sample",
                range,
                "--samples",
                "3",
                "--grid",
                "loss.tau=0.1,1",
            ],
            "cannot be used with",
            2,
        ),
        (
            &["--sample", "loss.tau=loguniform(0,1)", "--samples", "3"],
            "LOW > 0",
            2,
        ),
        (&["--sample", range, "--samples", "1"], "at least two", 1),
        (
            &["--sample", range, "--samples", "3", "--figures", s(&json)],
            "is a file, not a folder",
            1,
        ),
    ] {
        let out = rankwise(&[&tune[..], extra].concat());
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(code), "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
    }
}

#[test]
fn tune_refuses_bad_searches_before_anything_trains() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "tiny.toml", TINY_RECIPE.as_bytes());
    let cache = dir.path().join("cache");
    let (r, c) = (s(&recipe), s(&cache));
    let held = ["--set", "validation.fraction=0.25"];
    let tau = ["--grid", "loss.tau=0.01,0.1"];
    let with = |extra: &[&[&'static str]]| -> String {
        let mut a = vec!["tune", "--config", r, "--cache", c, "-q"];
        for e in extra {
            a.extend_from_slice(e);
        }
        fails(&a)
    };
    for (extra, says) in [
        (&[&tau[..]][..], "[validation]"),
        (&[&held[..], &["--grid", "loss.tau=0.1"]], "at least two"),
        (&[&held[..], &tau, &["--grid", "loss.tau=1"]], "two axes"),
        (
            &[&held[..], &["--grid", "loss.tau=0.1,abc"]],
            "loss.tau=abc",
        ),
        (&[&held[..], &tau, &["--seeds", "1"]], "two distinct seeds"),
        (&[&held[..], &tau, &["--seeds", "0"]], "--seeds 0"),
        (&[&held[..], &tau, &["--metric", "NDGC"]], "not a metric"),
        (&[&held[..], &tau, &["--metric", "R@4"]], "eval.recall_ks"),
        (&[&held[..], &tau, &["--out", "t.txt"]], ".json or .csv"),
        (
            &[&held[..], &tau, &["--set", "validation.metric=R@4"]],
            "validation.metric",
        ),
        (&[&held[..], &tau, &["--jobs", "0"]], "--jobs"),
    ] {
        let e = with(extra);
        assert!(e.contains(says), "{extra:?}: {e}");
    }
    assert!(!cache.exists(), "a refused search trained something");
    // Axes clap cannot read are refused by clap (status 2), naming the axis.
    for (axis, says) in [
        ("seed=1,2", "not a hyperparameter"),
        ("validation.fraction=0.2,0.3", "held-out classes"),
    ] {
        let out = rankwise(&["tune", "--config", r, "--grid", axis]);
        let err = stderr_of(&out);
        assert!(!out.status.success() && err.contains(says), "{err}");
    }
}
