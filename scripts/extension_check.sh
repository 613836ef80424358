#!/usr/bin/env bash
# The extension check of issue #23: what a contributor touches to add a loss, a paper or a
# dataset.
#
#   scripts/extension_check.sh
#
# In a scratch copy of this working tree (tracked and untracked, not ignored, files), it adds
# the example loss, paper and dataset of scripts/extension/ the way a contributor would, counts
# the files each addition touched (a loss: at most 2, its file and losses/mod.rs; a paper: at
# most 4, its experiment module, recipe, published values and notebook; a dataset: at most 3,
# its loader file, data script and recipe), then builds the copy and runs the examples' own
# tests: the loss's hand-worked values, its recipe and its gradient; the paper found by the
# registry, reproduced at `tiny` and its notebook present; the dataset named by its recipe and
# read by training's data route.
# It builds into this tree's target folder ($CARGO_TARGET_DIR, else target/), so that the
# dependencies are not built again, as rankwise of another version (0.0.0-extension-check): the
# copy's build-script outputs (the paper registry's paths, the run code) and artefacts then live
# beside this tree's instead of replacing them. Only the library's test binary is built.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ext=$root/scripts/extension
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# -m: the copies get the current time, so cargo never takes an earlier check's build for this one.
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xmf - -C "$scratch"
cd "$scratch"
git init -q
git add -A
git -c user.name=check -c user.email=check@localhost commit -qm base

# Files touched since the last addition (new, changed or deleted), then commit them.
touched() {
  git add -A
  local n
  n=$(git diff --cached --name-only | wc -l)
  git diff --cached --name-only | sed 's/^/    /' >&2
  git -c user.name=check -c user.email=check@localhost commit -qm "$1"
  echo "$n"
}

fail=0
limit() { # what, files touched, most allowed
  echo "[extension_check] adding $1 touched $2 files (at most $3)" >&2
  if (($2 > $3)); then fail=1; fi
}

# A loss: its file, its module line and its registry line (both in losses/mod.rs).
cp "$ext/positive_margin.rs" src/losses/positive_margin.rs
python3 - <<'PY'
import re
p = "src/losses/mod.rs"
s = open(p).read()
s, n = re.subn(r"(\npub mod pairwise_rows;\n)", r"\1pub mod positive_margin;\n", s, count=1)
assert n == 1, "losses/mod.rs: no `pub mod pairwise_rows;` to add the module after"
s, n = re.subn(r"(config::registry! \{\n)",
               r"\1    /// The example loss of scripts/extension_check.sh.\n"
               r"    PositiveMargin(positive_margin::PositiveMargin),\n", s, count=1)
assert n == 1, "losses/mod.rs: no `config::registry! {` to add the loss to"
open(p, "w").write(s)
PY
limit "a loss" "$(touched loss)" 2

# A paper: four files, no line elsewhere (build.rs lists the module).
cp "$ext/toy_paper.rs" src/experiments/toy_paper.rs
cp "$ext/toy_paper.toml" configs/experiments/toy_paper.toml
cp "$ext/toy_paper.csv" paper_tables/published/toy_paper.csv
cp "$ext/07_toy_paper.ipynb" notebooks/07_toy_paper.ipynb
limit "a paper" "$(touched paper)" 4

# A dataset: three files, no line elsewhere (build.rs adds it to DatasetConfig).
cp "$ext/image_folder.rs" src/data/loaders/image_folder.rs
cp "$ext/image_folder.sh" data_scripts/image_folder.sh
cp "$ext/image_folder.toml" configs/image_folder.toml
limit "a dataset" "$(touched dataset)" 3

if ((fail)); then
  echo "[extension_check] an addition touched more files than the issue allows" >&2
  exit 1
fi
# Another version: its own artefacts in the shared target folder (not counted as a touched file).
sed -i '0,/^version = ".*"$/s//version = "0.0.0-extension-check"/' Cargo.toml
cargo update --offline --workspace --quiet
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
cargo test --offline --lib -- losses::positive_margin:: experiments::toy_paper:: \
  data::loaders::image_folder::
echo "[extension_check] the example loss, paper and dataset build and pass their tests" >&2
