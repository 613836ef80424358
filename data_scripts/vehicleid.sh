#!/usr/bin/env bash
# PKU VehicleID (Liu et al., CVPR 2016): 221,763 images of 26,267 vehicles. The dataset is
# released on request to its authors (https://www.pkuml.org/resources/pku-vehicleid.html), so it
# cannot be fetched by a script. Once you have the archive, run
#   data_scripts/vehicleid.sh <dest> <path to the archive (.zip, .tar or .tar.gz)>
# to lay out <dest>/VehicleID_V1.0/{train_test_split/,image/}.
source "$(dirname "$0")/common.sh"
[[ $# -eq 2 ]] || die "usage: $0 <dest> <archive>"
archive=$(realpath "$2")
usage_root "$1"
no_checksum "$archive"
case "$archive" in
    *.zip) need unzip; unzip -q -n "$archive" ;;
    *.tar.gz|*.tgz) tar -xzf "$archive" ;;
    *.tar) tar -xf "$archive" ;;
    *) die "unknown archive type: $archive" ;;
esac
require_file VehicleID_V1.0/train_test_split/train_list.txt
require_file VehicleID_V1.0/train_test_split/test_list_2400.txt
echo ">> ready: rankwise::data::loaders::vehicleid::load(\"$PWD/VehicleID_V1.0\")"
