#!/usr/bin/env bash
# Revisited Oxford5k and Paris6k (Radenovic et al., CVPR 2018): images of the Oxford and Paris
# Buildings datasets with the revisitop ground truth. Lays out, as revisitop's download.py,
#   <dest>/roxford5k/{gnd_roxford5k.pkl,jpg/*.jpg}   <dest>/rparis6k/{gnd_rparis6k.pkl,jpg/*.jpg}
# Usage: data_scripts/revisited.sh <dest>
source "$(dirname "$0")/common.sh"
usage_root "$@"
need tar find
gnd=http://cmp.felk.cvut.cz/revisitop/data/datasets
get_images() { # dataset, source folder, archives...
    local ds=$1 src=$2
    shift 2
    mkdir -p "$ds/jpg"
    for f in "$@"; do
        fetch "$src/$f" "$ds/$f"
        no_checksum "$ds/$f"
        if [[ ! -f "$ds/.$f.extracted" ]]; then
            mkdir -p "$ds/tmp"
            tar -xzf "$ds/$f" -C "$ds/tmp"
            # Flatten: revisitop keeps only the files, wherever the archive put them.
            find "$ds/tmp" -type f -name '*.jpg' -exec mv -f {} "$ds/jpg/" \;
            rm -rf "$ds/tmp"
            touch "$ds/.$f.extracted"
        fi
    done
}
# The archives revisitop's python/download.py fetches. The VGG pages have since renamed some
# archives (e.g. oxbuild_images-v1.tgz); set OXFORD_ARCHIVES / PARIS_ARCHIVES to override.
read -r -a oxford <<<"${OXFORD_ARCHIVES:-oxbuild_images.tgz}"
read -r -a paris <<<"${PARIS_ARCHIVES:-paris_1.tgz paris_2.tgz}"
get_images roxford5k https://www.robots.ox.ac.uk/~vgg/data/oxbuildings "${oxford[@]}"
get_images rparis6k https://www.robots.ox.ac.uk/~vgg/data/parisbuildings "${paris[@]}"
for ds in roxford5k rparis6k; do
    fetch "$gnd/$ds/gnd_$ds.pkl" "$ds/gnd_$ds.pkl"
    no_checksum "$ds/gnd_$ds.pkl"
    require_file "$ds/gnd_$ds.pkl"
done
echo ">> ready: rankwise::data::loaders::revisited::load(\"$PWD\", Landmarks::Oxford5k)"
