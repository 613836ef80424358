//! The subgraphs `M_i` of SSR (Sec. 2.2, Fig. 2b–c): for every node `i` of the similarity
//! graph, the entries of `S` that SSR's MLP reads, with the columns sorted by decreasing
//! similarity to `i` ("local sort"). The sort is computed on the current similarities and is
//! not differentiated (the authors compute it under `no_grad`); the *values* are gathered from
//! the differentiable `S` by [`SubgraphIndex::flat`], and GraphSum (Eq. 5) scatters the MLP's
//! output back to the same positions.

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

/// The subgraph entries of every node: `flat[i·dim + e] = r·n + c` is the position in the
/// row-major `n × n` similarity matrix of entry `e` of `M_i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubgraphIndex {
    /// Number of nodes `n`.
    pub nodes: usize,
    /// Entries per subgraph `D` (the MLP's input and output width).
    pub dim: usize,
    /// `n × D` positions into the flattened `S`.
    pub flat: Vec<u32>,
}

/// `nodes` sorted by decreasing `sim[i·n + j]`, ties by index.
fn sorted_by_similarity(sim: &[f64], n: usize, i: usize, nodes: &mut [usize]) {
    nodes.sort_by(|&a, &b| sim[i * n + b].total_cmp(&sim[i * n + a]).then(a.cmp(&b)));
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

/// SSR Fig. 2b: the retrieval subgraphs of `n = k + 1` nodes, node 0 the query and nodes
/// `1..n` its top-k references, from the current similarities `sim` (`n × n`, row-major).
pub fn retrieval_subgraphs(sim: &[f64], n: usize, layout: Layout) -> SubgraphIndex {
    debug_assert_eq!(sim.len(), n * n);
    let k = n - 1;
    let dim = retrieval_dim(layout, k);
    let mut flat = Vec::with_capacity(n * dim);
    let q = 0usize;
    for i in 0..n {
        match layout {
            Layout::Paper => {
                let mut cols: Vec<usize> = (0..n).collect();
                sorted_by_similarity(sim, n, i, &mut cols);
                for row in [i, q] {
                    flat.extend(cols.iter().map(|&c| (row * n + c) as u32));
                }
            }
            Layout::AuthorsCode => {
                let mut db: Vec<usize> = (1..n).collect();
                sorted_by_similarity(sim, n, i, &mut db);
                flat.push((i * n + q) as u32);
                flat.extend(db.iter().map(|&c| (i * n + c) as u32));
                flat.extend(db.iter().map(|&c| (q * n + c) as u32));
            }
        }
    }
    SubgraphIndex {
        nodes: n,
        dim,
        flat,
    }
}

/// SSR Fig. 2c: the few-shot subgraphs of `s` support nodes (nodes `0..s`) and `q` queries
/// (nodes `s..s+q`), from the current similarities `sim` (`n × n`, row-major, `n = s + q`).
pub fn few_shot_subgraphs(sim: &[f64], s: usize, q: usize, layout: Layout) -> SubgraphIndex {
    let n = s + q;
    debug_assert_eq!(sim.len(), n * n);
    let dim = few_shot_dim(layout, s, q);
    let mut flat = Vec::with_capacity(n * dim);
    for i in 0..n {
        let mut sup: Vec<usize> = (0..s).collect();
        let mut qry: Vec<usize> = (s..n).collect();
        sorted_by_similarity(sim, n, i, &mut sup);
        sorted_by_similarity(sim, n, i, &mut qry);
        match layout {
            Layout::Paper => {
                let cols: Vec<usize> = sup.iter().chain(&qry).copied().collect();
                for &row in std::iter::once(&i).chain(&sup) {
                    flat.extend(cols.iter().map(|&c| (row * n + c) as u32));
                }
            }
            Layout::AuthorsCode => {
                let order: Vec<usize> = std::iter::once(i).chain(sup).chain(qry).collect();
                for a in 0..=s {
                    for b in a + 1..order.len() {
                        flat.push((order[a] * n + order[b]) as u32);
                    }
                }
            }
        }
    }
    debug_assert_eq!(flat.len(), n * dim);
    SubgraphIndex {
        nodes: n,
        dim,
        flat,
    }
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
}
