#!/usr/bin/env bash
# Cars196 / Stanford Cars (Krause et al., 2013): 16,185 images of 196 car models, in the
# retrieval layout <dest>/cars196/{cars_annos.mat,car_ims/}.
# Usage: data_scripts/cars196.sh <dest> [base URL]
# The base URL defaults to the authors' page (http://ai.stanford.edu/~jkrause/car196), which has
# been intermittently offline; pass a mirror that serves car_ims.tgz and cars_annos.mat.
source "$(dirname "$0")/common.sh"
usage_root "$@"
need tar
base=${2:-http://ai.stanford.edu/~jkrause/car196}
mkdir -p cars196
cd cars196
fetch "$base/car_ims.tgz" car_ims.tgz
no_checksum car_ims.tgz
fetch "$base/cars_annos.mat" cars_annos.mat
no_checksum cars_annos.mat
[[ -d car_ims ]] || tar -xzf car_ims.tgz
require_file cars_annos.mat
require_file car_ims/000001.jpg
echo ">> ready: rankwise::data::loaders::cub_cars::load_cars(\"$PWD\")"
