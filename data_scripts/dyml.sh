#!/usr/bin/env bash
# DyML-Vehicle, DyML-Animal, DyML-Product (Sun et al., CVPR 2021). The authors distribute them
# from a OneDrive folder (linked from github.com/SupetZYK/DynamicMetricLearning and HAPPIER's
# README) that cannot be fetched by a script. Download the archives, then run
#   data_scripts/dyml.sh <dest> <archive> [<archive> ...]
# to unpack them into <dest>/ and check the layout the loader expects:
#   dyml_vehicle/{train/label.csv,train/imgs/,bmk_{fine,middle,coarse}/{query,gallery}.csv,...}
#   dyml_animal/  (same)      dyml_product/{train/label.csv,mini-bmk_all_in_one/label.csv,...}
source "$(dirname "$0")/common.sh"
[[ $# -ge 2 ]] || die "usage: $0 <dest> <archive> [<archive> ...]"
dest=$1
shift
archives=()
for a in "$@"; do archives+=("$(realpath "$a")"); done
usage_root "$dest"
for a in "${archives[@]}"; do
    no_checksum "$a"
    case "$a" in
        *.zip) need unzip; unzip -q -n "$a" ;;
        *.tar.gz|*.tgz) tar -xzf "$a" ;;
        *.tar) tar -xf "$a" ;;
        *) die "unknown archive type: $a" ;;
    esac
done
found=0
for d in dyml_vehicle dyml_animal dyml_product; do
    if [[ -d $d ]]; then
        found=1
        require_file "$d/train/label.csv"
        if [[ $d == dyml_product ]]; then
            require_file "$d/mini-bmk_all_in_one/label.csv"
        else
            for s in fine middle coarse; do
                require_file "$d/bmk_$s/query.csv"
                require_file "$d/bmk_$s/gallery.csv"
            done
        fi
        echo ">> ready: rankwise::data::loaders::dyml::load_train(\"$PWD/$d\", GluedRow::Keep)"
    fi
done
[[ $found == 1 ]] || die "no dyml_vehicle/, dyml_animal/ or dyml_product/ folder in the archives"
