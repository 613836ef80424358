#!/usr/bin/env bash
# CUB-200-2011 (Wah et al., 2011): 11,788 images of 200 bird species.
# Lays out <dest>/CUB_200_2011/{images.txt,image_class_labels.txt,images/}.
# Usage: data_scripts/cub.sh <dest>
source "$(dirname "$0")/common.sh"
usage_root "$@"
need tar
fetch https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz CUB_200_2011.tgz
# md5 published on the CaltechDATA record page.
verify_md5 CUB_200_2011.tgz 97eceeb196236b17998738112f37df78
[[ -d CUB_200_2011 ]] || tar -xzf CUB_200_2011.tgz
require_file CUB_200_2011/images.txt
require_file CUB_200_2011/image_class_labels.txt
echo ">> ready: rankwise::data::loaders::cub_cars::load_cub(\"$PWD/CUB_200_2011\")"
