//! The subgraphs `M_i` of SSR (Sec. 2.2, Fig. 2b–c): for every node `i` of the similarity
//! graph, the entries of `S` that SSR's MLP reads, with the columns sorted by decreasing
//! similarity to `i` ("local sort"). The sort is computed on the current similarities and is
//! not differentiated (the authors compute it under `no_grad`); the *values* are gathered from
//! the differentiable `S` by [`SubgraphIndex::flat`], and GraphSum (Eq. 5) scatters the MLP's
//! output back to the same positions.
//!
//! The ablations of SSR Tables 3 and 4 are described by a [`SubgraphSpec`]: which node groups
//! are the rows and the columns of `M_i` ([`NodeGroup`]), whether the columns are sorted per
//! subgraph or in one shared order ([`ColumnOrder`], "w.o local sort"), and whether the graph
//! is decomposed at all ([`Decomposition`], "w.o subgraph").

use crate::error::{Error, Result};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

/// How `M_i` is laid out (where SSR's paper and its authors' code differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// The paper (Fig. 2b–c): retrieval `2 × N` (rows `i` and the query, the `N` nodes as
    /// columns, all sorted by similarity to `i`); few-shot `(|S|+1) × (|S|+|Q|)` (rows `i` and
    /// the supports, columns the supports then the queries, each block sorted separately).
    #[default]
    Paper,
    /// The authors' code (`triu_index_input`): the nodes ordered `[i, q, σ_i(db)]`
    /// (retrieval, query column first and unsorted) or `[i, σ_i(S), σ_i(Q)]` (few-shot), and
    /// the strict upper triangle of the first 2 (retrieval) or `1 + |S|` (few-shot) rows:
    /// `2k + 1` and `(C+Q+1)(C+Q)/2 − Q(Q−1)/2` entries.
    AuthorsCode,
}

/// A group of nodes, as rows or columns of `M_i` (SSR Tables 3 and 4, "M_i rows / columns").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeGroup {
    /// Node `i` itself, the centre of the subgraph (the tables' "sample").
    Sample,
    /// Retrieval: the query node; few-shot: the query set `Q` (Table 4's "Q").
    Query,
    /// Few-shot: the support set `S` (Table 4's "S"; prototypes or shots).
    Support,
    /// Retrieval: the query's top-k references (the code's "database"); as rows with the
    /// sample and the query they make Table 3's "w.o other" row, which the text describes as
    /// "considering the full graph".
    References,
}

impl NodeGroup {
    fn name(self) -> &'static str {
        match self {
            NodeGroup::Sample => "sample",
            NodeGroup::Query => "query",
            NodeGroup::Support => "support",
            NodeGroup::References => "references",
        }
    }
}

/// The order of the columns (and of multi-node row groups) of every subgraph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnOrder {
    /// The paper's local sort (Sec. 2.2): by decreasing similarity to the subgraph's node `i`,
    /// so that every subgraph sees its own neighbourhood first.
    #[default]
    Local,
    /// One order shared by every subgraph ("w.o local sort", Tables 3–4). Retrieval: by
    /// decreasing similarity to the query, as SSR's text says. Few-shot: the episode's node
    /// order (support nodes by class index, queries in the sampler's shuffled order) — no node
    /// of an episode plays the query's role, so there is no similarity to sort by that would
    /// not privilege one node; dropping the code's `argsort` leaves exactly this order.
    Shared,
}

/// Whether the graph is decomposed into subgraphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decomposition {
    /// One subgraph `M_i` per node (Sec. 2.2, Eq. 5).
    #[default]
    Subgraphs,
    /// "w.o subgraph" (Tables 3–4): the MLP reads the whole `n × n` similarity matrix (one
    /// input per graph, nodes in the [`ColumnOrder::Shared`] order) and predicts the whole
    /// update matrix.
    WholeGraph,
}

/// What the MLP reads of the graph: the layout, the rows and columns of `M_i`, their order
/// and the decomposition (the defaults are the paper's method).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SubgraphSpec {
    /// Paper or code layout.
    pub layout: Layout,
    /// Row groups of `M_i`, in order (`None`: the paper's — retrieval `[sample, query]`,
    /// few-shot `[sample, support]`).
    pub rows: Option<Vec<NodeGroup>>,
    /// Column groups of `M_i`, each block sorted separately (`None`: the paper's — retrieval
    /// every node sorted together, few-shot `[support, query]`). Retrieval has no column
    /// variant (Table 3 varies the rows only).
    pub columns: Option<Vec<NodeGroup>>,
    /// Local or shared order.
    pub order: ColumnOrder,
    /// Subgraphs or the whole matrix.
    pub decomposition: Decomposition,
}

impl SubgraphSpec {
    /// Checks what does not depend on the task: groups listed at most once, and the variants
    /// the authors' layout and the whole matrix do not have. Errors name the field.
    pub fn validate(&self) -> Result<()> {
        for (field, groups) in [("rows", &self.rows), ("columns", &self.columns)] {
            if let Some(g) = groups {
                if g.is_empty() {
                    return Err(Error::invalid(field, "list at least one node group"));
                }
                for (a, x) in g.iter().enumerate() {
                    if g[..a].contains(x) {
                        return Err(Error::invalid(
                            field,
                            format!("`{}` is listed twice", x.name()),
                        ));
                    }
                }
                if self.layout == Layout::AuthorsCode {
                    return Err(Error::invalid(
                        field,
                        "the authors' code layout (a triangle of the first rows) has no \
                         row/column variants; use layout = \"paper\"",
                    ));
                }
                if self.decomposition == Decomposition::WholeGraph {
                    return Err(Error::invalid(
                        field,
                        "decomposition = \"whole_graph\" reads the whole matrix; rows and \
                         columns only shape subgraphs",
                    ));
                }
            }
        }
        if self.decomposition == Decomposition::WholeGraph && self.layout == Layout::AuthorsCode {
            return Err(Error::invalid(
                "decomposition",
                "the whole matrix has no layout: use layout = \"paper\" with \
                 decomposition = \"whole_graph\"",
            ));
        }
        Ok(())
    }

    /// The row groups, the paper's by default.
    fn row_groups(&self, task: Task) -> Vec<NodeGroup> {
        self.rows.clone().unwrap_or_else(|| match task {
            Task::Retrieval { .. } => vec![NodeGroup::Sample, NodeGroup::Query],
            Task::FewShot { .. } => vec![NodeGroup::Sample, NodeGroup::Support],
        })
    }

    /// The column groups of the few-shot layout, the paper's by default.
    fn column_groups(&self) -> Vec<NodeGroup> {
        self.columns
            .clone()
            .unwrap_or_else(|| vec![NodeGroup::Support, NodeGroup::Query])
    }

    /// The width `D` of the MLP's input for `task` (entries of `M_i`, or `n²` for the whole
    /// matrix). Errors name the field whose groups the task does not have.
    pub fn input_dim(&self, task: Task) -> Result<usize> {
        self.validate()?;
        let (n, size) = group_sizes(task)?;
        if self.decomposition == Decomposition::WholeGraph {
            return Ok(n * n);
        }
        let rows = self.row_groups(task);
        let count = |field: &str, groups: &[NodeGroup]| -> Result<usize> {
            groups.iter().try_fold(0, |acc, &g| {
                size(g).map(|s| acc + s).ok_or_else(|| {
                    Error::invalid(
                        field,
                        format!("a {task:?} graph has no `{}` node group", g.name()),
                    )
                })
            })
        };
        let r = count("rows", &rows)?;
        match task {
            Task::Retrieval { k } => {
                if self.columns.is_some() {
                    return Err(Error::invalid(
                        "columns",
                        "retrieval subgraphs always have every node as a column (Table 3 \
                         varies the rows only)",
                    ));
                }
                Ok(match self.layout {
                    Layout::Paper => r * n,
                    Layout::AuthorsCode => 2 * k + 1,
                })
            }
            Task::FewShot { supports, queries } => {
                let cols = self.column_groups();
                if cols.contains(&NodeGroup::Sample) {
                    return Err(Error::invalid(
                        "columns",
                        "the sample is a column already (it is a support node or a query)",
                    ));
                }
                let c = count("columns", &cols)?;
                Ok(match self.layout {
                    Layout::Paper => r * c,
                    Layout::AuthorsCode => {
                        (supports + 1) * (supports + queries) - supports * (supports + 1) / 2
                    }
                })
            }
        }
    }
}

/// The node count of `task` and the size of each of its node groups (`None`: not a group of
/// this task). Errors on an empty graph.
fn group_sizes(task: Task) -> Result<(usize, impl Fn(NodeGroup) -> Option<usize>)> {
    let (n, query, support, references) = match task {
        Task::Retrieval { k } => {
            if k == 0 {
                return Err(Error::invalid("k", "re-rank at least 1 reference"));
            }
            (k + 1, 1, None, Some(k))
        }
        Task::FewShot { supports, queries } => {
            if supports == 0 || queries == 0 {
                return Err(Error::invalid(
                    "episode",
                    format!("{supports} support nodes and {queries} queries: need ≥ 1 of each"),
                ));
            }
            (supports + queries, queries, Some(supports), None)
        }
    };
    Ok((n, move |g| match g {
        NodeGroup::Sample => Some(1),
        NodeGroup::Query => Some(query),
        NodeGroup::Support => support,
        NodeGroup::References => references,
    }))
}

/// The subgraph entries of every subgraph: `flat[m·dim + e] = r·n + c` is the position in the
/// row-major `n × n` similarity matrix of entry `e` of subgraph `m` (`M_m`, or the whole
/// matrix when there is one subgraph per graph).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubgraphIndex {
    /// Number of nodes `n`.
    pub nodes: usize,
    /// Number of subgraphs (`n`, or 1 for [`Decomposition::WholeGraph`]).
    pub subgraphs: usize,
    /// Entries per subgraph `D` (the MLP's input and output width).
    pub dim: usize,
    /// `subgraphs × D` positions into the flattened `S`.
    pub flat: Vec<u32>,
}

/// `nodes` sorted by decreasing `sim[i·n + j]`, ties by index.
fn sorted_by_similarity(sim: &[f64], n: usize, i: usize, nodes: &mut [usize]) {
    nodes.sort_by(|&a, &b| sim[i * n + b].total_cmp(&sim[i * n + a]).then(a.cmp(&b)));
}

/// Puts `nodes` in the order of `order` for the subgraph of node `centre`.
fn arrange(
    sim: &[f64],
    n: usize,
    task: Task,
    order: ColumnOrder,
    centre: usize,
    nodes: &mut [usize],
) {
    match (order, task) {
        (ColumnOrder::Local, _) => sorted_by_similarity(sim, n, centre, nodes),
        // The query is node 0.
        (ColumnOrder::Shared, Task::Retrieval { .. }) => sorted_by_similarity(sim, n, 0, nodes),
        (ColumnOrder::Shared, Task::FewShot { .. }) => nodes.sort_unstable(),
    }
}

/// Input width of the retrieval variant with `k` re-ranked references (`k + 1` nodes).
pub fn retrieval_dim(layout: Layout, k: usize) -> usize {
    match layout {
        Layout::Paper => 2 * (k + 1),
        Layout::AuthorsCode => 2 * k + 1,
    }
}

/// Input width of the few-shot variant with `s` support nodes and `q` queries.
pub fn few_shot_dim(layout: Layout, s: usize, q: usize) -> usize {
    match layout {
        Layout::Paper => (s + 1) * (s + q),
        Layout::AuthorsCode => (s + 1) * (s + q) - s * (s + 1) / 2,
    }
}

/// SSR Fig. 2b: the paper's retrieval subgraphs of `n = k + 1` nodes, node 0 the query and
/// nodes `1..n` its top-k references, from the current similarities `sim` (`n × n`,
/// row-major).
pub fn retrieval_subgraphs(sim: &[f64], n: usize, layout: Layout) -> SubgraphIndex {
    let spec = SubgraphSpec {
        layout,
        ..SubgraphSpec::default()
    };
    subgraphs(sim, Task::Retrieval { k: n - 1 }, &spec)
}

/// SSR Fig. 2c: the paper's few-shot subgraphs of `s` support nodes (nodes `0..s`) and `q`
/// queries (nodes `s..s+q`), from the current similarities `sim` (`n × n`, row-major,
/// `n = s + q`).
pub fn few_shot_subgraphs(sim: &[f64], s: usize, q: usize, layout: Layout) -> SubgraphIndex {
    let spec = SubgraphSpec {
        layout,
        ..SubgraphSpec::default()
    };
    subgraphs(
        sim,
        Task::FewShot {
            supports: s,
            queries: q,
        },
        &spec,
    )
}

/// The subgraphs of `task`'s graph under `spec`, from the current similarities `sim`
/// (`n × n`, row-major). Retrieval: node 0 the query, nodes `1..n` its references; few-shot:
/// nodes `0..s` the support nodes, then the queries. `spec` must have been checked with
/// [`SubgraphSpec::input_dim`] for `task` (which [`super::SsrModel::new`] does).
pub fn subgraphs(sim: &[f64], task: Task, spec: &SubgraphSpec) -> SubgraphIndex {
    let (n, split) = match task {
        Task::Retrieval { k } => (k + 1, 1),
        Task::FewShot { supports, queries } => (supports + queries, supports),
    };
    debug_assert_eq!(sim.len(), n * n);
    if spec.decomposition == Decomposition::WholeGraph {
        let mut order: Vec<usize> = (0..n).collect();
        arrange(sim, n, task, ColumnOrder::Shared, 0, &mut order);
        let flat = order
            .iter()
            .flat_map(|&r| order.iter().map(move |&c| (r * n + c) as u32))
            .collect();
        return SubgraphIndex {
            nodes: n,
            subgraphs: 1,
            dim: n * n,
            flat,
        };
    }
    let rows = spec.row_groups(task);
    let mut flat = Vec::new();
    for i in 0..n {
        let arranged = |range: std::ops::Range<usize>| {
            let mut v: Vec<usize> = range.collect();
            arrange(sim, n, task, spec.order, i, &mut v);
            v
        };
        // The nodes of each group (retrieval: query 0 / references; few-shot: supports /
        // queries), in the subgraph's order.
        let (first, rest) = (arranged(0..split), arranged(split..n));
        let members = |g: NodeGroup| -> Vec<usize> {
            match (g, task) {
                (NodeGroup::Sample, _) => vec![i],
                (NodeGroup::Query, Task::Retrieval { .. }) => vec![0],
                (NodeGroup::References, _) | (NodeGroup::Query, Task::FewShot { .. }) => {
                    rest.clone()
                }
                (NodeGroup::Support, _) => first.clone(),
            }
        };
        match (spec.layout, task) {
            (Layout::Paper, Task::Retrieval { .. }) => {
                let cols = arranged(0..n);
                for row in rows.iter().flat_map(|&g| members(g)) {
                    flat.extend(cols.iter().map(|&c| (row * n + c) as u32));
                }
            }
            (Layout::Paper, Task::FewShot { .. }) => {
                let cols: Vec<usize> = spec.column_groups().into_iter().flat_map(members).collect();
                for row in rows.iter().flat_map(|&g| members(g)) {
                    flat.extend(cols.iter().map(|&c| (row * n + c) as u32));
                }
            }
            (Layout::AuthorsCode, Task::Retrieval { .. }) => {
                let q = 0usize;
                flat.push((i * n + q) as u32);
                flat.extend(rest.iter().map(|&c| (i * n + c) as u32));
                flat.extend(rest.iter().map(|&c| (q * n + c) as u32));
            }
            (Layout::AuthorsCode, Task::FewShot { .. }) => {
                let order: Vec<usize> = std::iter::once(i).chain(first).chain(rest).collect();
                for a in 0..=split {
                    for b in a + 1..order.len() {
                        flat.push((order[a] * n + order[b]) as u32);
                    }
                }
            }
        }
    }
    let dim = flat.len() / n;
    debug_assert_eq!(flat.len(), n * dim);
    SubgraphIndex {
        nodes: n,
        subgraphs: n,
        dim,
        flat,
    }
}
/// Row norms `‖f_i‖` (`n × 1`), unit rows `f̂` and cosine similarities `S = F̂F̂ᵀ`
/// (SSR Eq. 1 / Eq. 3).
pub fn cosine_graph(f: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let norms = f.sqr()?.sum_keepdim(1)?.sqrt()?;
    let fhat = f.broadcast_div(&norms)?;
    let s = fhat.matmul(&fhat.t()?)?;
    Ok((norms, fhat, s))
}

/// SSR Eq. 5: GraphSum — the MLP's outputs `g` (`n × D`) scatter-added to their positions of
/// the `n × n` matrix.
pub fn graph_sum(g: &Tensor, index: &SubgraphIndex, idx: &Tensor) -> Result<Tensor> {
    let n = index.nodes;
    let zeros = Tensor::zeros(n * n, g.dtype(), g.device())?;
    Ok(zeros
        .index_add(idx, &g.flatten_all()?, 0)?
        .reshape((n, n))?)
}

/// Which graphs a model refines; fixes the MLP's input width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Task {
    /// A query and its top-`k` references (Fig. 2b).
    Retrieval {
        /// References re-ranked per query.
        k: usize,
    },
    /// `supports` support nodes (class prototypes or shots) and `queries` queries (Fig. 2c).
    FewShot {
        /// Support nodes.
        supports: usize,
        /// Queries.
        queries: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(n: usize) -> Vec<f64> {
        // A symmetric matrix with distinct off-diagonal values.
        let mut s = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                s[i * n + j] = if i == j {
                    1.0
                } else {
                    ((i * 7 + j * 7 + i * j) % 11) as f64 / 11.0 + 0.001 * (i + j) as f64
                };
            }
        }
        s
    }

    #[test]
    fn widths_match_the_papers_and_the_codes() {
        // The authors' code: 2k+1 for retrieval, 465 for 5-way with 75 queries.
        assert_eq!(retrieval_dim(Layout::AuthorsCode, 100), 201);
        assert_eq!(retrieval_dim(Layout::Paper, 99), 200);
        assert_eq!(few_shot_dim(Layout::AuthorsCode, 5, 75), 465);
        assert_eq!(few_shot_dim(Layout::Paper, 5, 75), 6 * 80);
        for layout in [Layout::Paper, Layout::AuthorsCode] {
            let r = retrieval_subgraphs(&sim(6), 6, layout);
            assert_eq!(r.flat.len(), 6 * r.dim);
            let f = few_shot_subgraphs(&sim(7), 2, 5, layout);
            assert_eq!(f.flat.len(), 7 * f.dim);
            assert!(f.flat.iter().all(|&p| (p as usize) < 49));
        }
    }

    #[test]
    fn rows_are_sorted_by_similarity_to_the_centre() {
        let n = 6;
        let s = sim(n);
        let r = retrieval_subgraphs(&s, n, Layout::Paper);
        for i in 0..n {
            let row: Vec<f64> = r.flat[i * r.dim..i * r.dim + n]
                .iter()
                .map(|&p| s[p as usize])
                .collect();
            assert!(row.windows(2).all(|w| w[0] >= w[1]), "{row:?}");
            // The first row is node i's, the second the query's (node 0).
            assert!(r.flat[i * r.dim..i * r.dim + n]
                .iter()
                .all(|&p| p as usize / n == i));
            assert!(r.flat[i * r.dim + n..(i + 1) * r.dim]
                .iter()
                .all(|&p| p as usize / n == 0));
        }
        let c = retrieval_subgraphs(&s, n, Layout::AuthorsCode);
        // [s(i, q), s(i, σ_i(db))…, s(q, σ_i(db))…]
        assert_eq!(c.flat[3 * c.dim], (3 * n) as u32);
    }
    /// A hand-built 4-node graph with distinct similarities.
    fn hand() -> Vec<f64> {
        vec![
            1.0, 0.9, 0.5, 0.7, //
            0.9, 1.0, 0.2, 0.6, //
            0.5, 0.2, 1.0, 0.8, //
            0.7, 0.6, 0.8, 1.0,
        ]
    }

    /// Subgraph `m`'s positions.
    fn of(ix: &SubgraphIndex, m: usize) -> &[u32] {
        &ix.flat[m * ix.dim..(m + 1) * ix.dim]
    }

    fn spec(rows: Option<Vec<NodeGroup>>, columns: Option<Vec<NodeGroup>>) -> SubgraphSpec {
        SubgraphSpec {
            rows,
            columns,
            ..SubgraphSpec::default()
        }
    }

    #[test]
    fn retrieval_row_variants_of_table_3() {
        use NodeGroup::*;
        let task = Task::Retrieval { k: 3 };
        let s = hand();
        // Node 2's columns sorted by its similarities (1, .8, .5, .2): [2, 3, 0, 1].
        let cases: [(Option<Vec<NodeGroup>>, Vec<u32>); 4] = [
            // Ours: rows sample (2) and query (0).
            (None, vec![10, 11, 8, 9, 2, 3, 0, 1]),
            // w.o sample.
            (Some(vec![Query]), vec![2, 3, 0, 1]),
            // w.o query.
            (Some(vec![Sample]), vec![10, 11, 8, 9]),
            // w.o other ("the full graph"): sample, query, then the references sorted by
            // similarity to node 2 ([2, 3, 1]; node 2's row appears twice).
            (
                Some(vec![Sample, Query, References]),
                vec![
                    10, 11, 8, 9, 2, 3, 0, 1, 10, 11, 8, 9, 14, 15, 12, 13, 6, 7, 4, 5,
                ],
            ),
        ];
        for (rows, expect) in cases {
            let sp = spec(rows.clone(), None);
            let ix = subgraphs(&s, task, &sp);
            assert_eq!(ix.dim, sp.input_dim(task).unwrap(), "{rows:?}");
            assert_eq!((ix.subgraphs, ix.flat.len()), (4, 4 * ix.dim));
            assert_eq!(of(&ix, 2), expect.as_slice(), "{rows:?}");
        }
        // The default equals the paper's layout function.
        assert_eq!(
            subgraphs(&s, task, &SubgraphSpec::default()),
            retrieval_subgraphs(&s, 4, Layout::Paper)
        );
    }

    #[test]
    fn few_shot_row_and_column_variants_of_table_4() {
        use NodeGroup::*;
        let task = Task::FewShot {
            supports: 2,
            queries: 2,
        };
        let s = hand();
        // Node 1: supports by similarity [1, 0], queries [3, 2].
        type Groups = Option<Vec<NodeGroup>>;
        let cases: [(Groups, Groups, Vec<u32>); 6] = [
            // Ours: rows sample, S; columns S, Q (node 1 is a support: its row repeats).
            (None, None, vec![5, 4, 7, 6, 5, 4, 7, 6, 1, 0, 3, 2]),
            (
                Some(vec![Sample, Support, Query]),
                None,
                vec![
                    5, 4, 7, 6, 5, 4, 7, 6, 1, 0, 3, 2, 13, 12, 15, 14, 9, 8, 11, 10,
                ],
            ),
            (Some(vec![Support]), None, vec![5, 4, 7, 6, 1, 0, 3, 2]),
            (Some(vec![Sample]), None, vec![5, 4, 7, 6]),
            (None, Some(vec![Support]), vec![5, 4, 5, 4, 1, 0]),
            (None, Some(vec![Query]), vec![7, 6, 7, 6, 3, 2]),
        ];
        for (rows, columns, expect) in cases {
            let sp = spec(rows.clone(), columns.clone());
            let ix = subgraphs(&s, task, &sp);
            assert_eq!(ix.dim, sp.input_dim(task).unwrap(), "{rows:?} {columns:?}");
            assert_eq!(ix.flat.len(), 4 * ix.dim);
            assert_eq!(of(&ix, 1), expect.as_slice(), "{rows:?} {columns:?}");
        }
        assert_eq!(
            subgraphs(&s, task, &SubgraphSpec::default()),
            few_shot_subgraphs(&s, 2, 2, Layout::Paper)
        );
    }

    #[test]
    fn without_local_sort_every_subgraph_shares_one_order() {
        let s = hand();
        let shared = SubgraphSpec {
            order: ColumnOrder::Shared,
            ..SubgraphSpec::default()
        };
        // Retrieval: by similarity to the query (1, .9, .7, .5): [0, 1, 3, 2].
        let task = Task::Retrieval { k: 3 };
        let ix = subgraphs(&s, task, &shared);
        for i in 0..4u32 {
            let row = i * 4;
            assert_eq!(
                of(&ix, i as usize),
                &[row, row + 1, row + 3, row + 2, 0, 1, 3, 2]
            );
        }
        // The code's layout: [s(i, q), s(i, db by query)…, s(q, db by query)…].
        let code = SubgraphSpec {
            layout: Layout::AuthorsCode,
            ..shared.clone()
        };
        assert_eq!(of(&subgraphs(&s, task, &code), 2), &[8, 9, 11, 10, 1, 3, 2]);
        // Few-shot: the episode's order, supports [0, 1] then queries [2, 3].
        let task = Task::FewShot {
            supports: 2,
            queries: 2,
        };
        let ix = subgraphs(&s, task, &shared);
        assert_eq!(of(&ix, 1), &[4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(of(&ix, 3), &[12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn whole_graph_is_one_subgraph_of_every_entry() {
        let s = hand();
        let whole = SubgraphSpec {
            decomposition: Decomposition::WholeGraph,
            ..SubgraphSpec::default()
        };
        let task = Task::Retrieval { k: 3 };
        let ix = subgraphs(&s, task, &whole);
        assert_eq!((ix.subgraphs, ix.dim), (1, 16));
        assert_eq!(whole.input_dim(task).unwrap(), 16);
        // Nodes in the query's order [0, 1, 3, 2].
        assert_eq!(
            ix.flat,
            vec![0, 1, 3, 2, 4, 5, 7, 6, 12, 13, 15, 14, 8, 9, 11, 10]
        );
        let few = Task::FewShot {
            supports: 1,
            queries: 3,
        };
        let ix = subgraphs(&s, few, &whole);
        assert_eq!(ix.flat, (0..16).collect::<Vec<u32>>());
    }

    #[test]
    fn variants_a_task_or_layout_lacks_are_errors_naming_the_field() {
        use NodeGroup::*;
        let retrieval = Task::Retrieval { k: 3 };
        let few = Task::FewShot {
            supports: 2,
            queries: 2,
        };
        let err = |sp: SubgraphSpec, task: Task| sp.input_dim(task).unwrap_err().to_string();
        assert!(err(spec(Some(vec![Support]), None), retrieval).contains("rows"));
        assert!(err(spec(None, Some(vec![Query])), retrieval).contains("columns"));
        assert!(err(spec(Some(vec![References]), None), few).contains("rows"));
        assert!(err(spec(None, Some(vec![Sample])), few).contains("columns"));
        assert!(err(spec(Some(vec![]), None), few).contains("rows"));
        assert!(err(spec(Some(vec![Sample, Sample]), None), few).contains("twice"));
        let code_rows = SubgraphSpec {
            layout: Layout::AuthorsCode,
            ..spec(Some(vec![Sample]), None)
        };
        assert!(err(code_rows, few).contains("rows"));
        let whole_rows = SubgraphSpec {
            decomposition: Decomposition::WholeGraph,
            ..spec(Some(vec![Sample]), None)
        };
        assert!(err(whole_rows, few).contains("rows"));
        let whole_code = SubgraphSpec {
            decomposition: Decomposition::WholeGraph,
            layout: Layout::AuthorsCode,
            ..SubgraphSpec::default()
        };
        assert!(err(whole_code, few).contains("decomposition"));
        assert!(err(SubgraphSpec::default(), Task::Retrieval { k: 0 }).contains('k'));
    }
}
